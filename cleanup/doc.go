// Package cleanup deletes the inbox keys that Kafka can no longer redeliver,
// and the rows the relay and the consumer adapter leave behind.
//
// An inbox key (a row of pgbox_inbox) is what makes a redelivered message a
// duplicate. Deleted too early, a redelivery is processed twice; never deleted,
// the table grows forever. Kafka deletes a topic's records a whole segment at
// a time, once the segment's newest record is older than retention.ms, so a
// record can outlive retention.ms by up to segment.ms (plus the broker's
// retention check interval). The cleaner therefore keeps every key for
//
//	window = retention.ms + segment.ms + Buffer   (Buffer defaults to 24h)
//
// of its source topic, read from Kafka on every pass, and deletes a key when
//
//	GREATEST(received_at, record_at) < now − window
//
// strictly: a key exactly at the cutoff is kept. The later of the receive time
// and the record's own timestamp counts, because Kafka ages a segment by its
// records' timestamps and a producer's clock can run ahead. "now" is the
// database's clock (the one that stamped received_at) unless Config.Now is set.
// The buffer also covers what no key can see: another producer's record with
// a timestamp far ahead of its clock keeps a whole segment, and the keys of
// its neighbours, longer than their own timestamps suggest (Kafka bounds this
// with message.timestamp.after.max.ms).
//
// A topic is never pruned, and the Report says why (Reason), when its
// retention.ms is -1, its cleanup.policy lacks delete (compact only, empty) or
// holds a token pgbox does not recognise, a value cannot be interpreted (a
// non-integer or out-of-range retention.ms or segment.ms), Kafka does not know
// it, Kafka cannot be reached, or its config cannot be read. Config.Window or a
// per-topic Topic.Window forces a fixed window for such topics; it never
// shortens a window Kafka gives.
//
// A consumer in the inbox's watermark mode (inbox.DedupWatermark) keeps no
// keys in pgbox_inbox, only one pgbox_inbox_watermark row per partition,
// updated in place: there is nothing to prune for it, and its topics do not
// appear in a pass.
//
// All topics are described in one DescribeConfigs request per pass (sarama's
// batch ClusterAdmin.DescribeConfigs), asking only for retention.ms,
// segment.ms and cleanup.policy. The topics come from pgbox_inbox by a loose
// index scan: one index probe per topic, whatever the number of keys.
//
// Deletes run in short transactions of at most BatchSize rows (1,000 by
// default), oldest first along the (topic, age) index, with a Pause (20ms by
// default) between them. Each batch commits asynchronously (losing one in a crash only
// means deleting it again) and never waits long on a row lock: concurrent
// inbox writers wait at most for one batch, and only for a key they redeliver
// at the very moment it expires. A cancelled ctx stops a pass within a batch.
//
// # Delete rate against writer latency
//
// Cleanup is background work, and its defaults favour the service: every
// delete batch writes WAL (about 100 bytes per key, plus its index entries)
// and dirties pages that the writers' commits then queue behind, so a pass
// that deletes flat out takes I/O and CPU from them. BatchSize bounds how
// long one batch holds the writers back; Pause is how much of the time the
// cleaner leaves them. Measured beside 4 inbox writers on a 2-core machine
// (BenchmarkPrune, noisy, shared):
//
//	BatchSize  Pause  keys deleted/s  writers' commits/s  writers' p99
//	10,000     none   ~135,000        ~0.45x              ~1.1x
//	1,000      20ms   ~34,000         ~0.9x               ~1.0x   (the defaults)
//
// At the defaults 10 million expired keys take about 5 minutes; a service
// writing 1,000 messages a second creates 3.6 million keys an hour, so the
// defaults keep up with a wide margin. Raise BatchSize or set NoPause for a
// one-off catch-up at a quiet hour; raise Pause when replicas lag or writers
// still notice.
//
// One pass runs at a time per database schema: a pass holds a lease row
// (pgbox_cleanup_lease), renewed by every delete batch, and a cleaner that
// finds it held skips its pass (Report.Locked). A lease row rather than a
// session advisory lock, so the cleaner works through pgbouncer in
// transaction mode like the rest of pgbox. A cleaner killed mid-pass holds
// the others off until its lease expires (5 minutes).
//
// The same pass prunes, each after its own retention (Config.Tables): parked
// outbox rows (kept by default: they are events never published),
// pgbox_consumer_dead rows (30 days, and never before their topic's inbox
// keys, since they dedupe redeliveries of records without a usable key), and
// pgbox_consumer_attempts rows nobody has updated for 7 days. Published outbox
// rows need nothing: the relay deletes them.
//
// Run a pass from cron with RunOnce, or keep a Cleaner running with Run (the
// relay binary does, on a schedule). A DryRun pass counts what it would delete
// and deletes nothing. Stats returns counters for metrics.
package cleanup
