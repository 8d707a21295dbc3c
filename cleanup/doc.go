// Package cleanup deletes the inbox keys that Kafka can no longer redeliver,
// and the rows the relay and the consumer adapter leave behind.
//
// An inbox key (a row of pgbox_inbox) is what makes a redelivered message a
// duplicate. Deleted too early, a redelivery is processed twice; never deleted,
// the table grows forever.
//
// # The exact rule
//
// Every key holds the position of its last-seen copy: the topic, partition
// and offset of the record it was first seen in, moved forward by every later
// copy on the same partition (a relay's resend after its crash window), never
// back (a rewind redelivering an older copy). Kafka can deliver nothing below
// a partition's log start offset, whatever removed the records (retention.ms,
// the log cleaner of a compact,delete topic, retention.bytes, DeleteRecords),
// so a key is deleted once
//
//	log start offset of its partition > its offset
//	and GREATEST(received_at, record_at) < now − Buffer   (Buffer defaults to 24h)
//
// The buffer covers copies still to come: a resend not consumed yet, a
// consumer that lags. A compact-only or infinite topic keeps its log start, so
// its keys stay. "now" is the database's clock (the one that stamped
// received_at) unless Config.Now is set; it is read before Kafka, so every key
// the rule may delete was written before the log start offsets were read, and
// a topic deleted and recreated meanwhile (offsets restarting at 0) can only
// keep keys longer.
//
// # The time rule, where a key's position is unknown
//
// A key's position is unknown when it was written before migration 00070 or
// by an older pgbox (whose duplicate deliveries did not move it), or when its
// copies came on two partitions or topics. For those keys only, and only on
// topics whose cleanup.policy is delete with a finite retention.ms, the
// cleaner falls back to Kafka's time retention: Kafka deletes a segment once
// its newest record is older than retention.ms, so a record can outlive
// retention.ms by up to segment.ms, and a key is deleted when
//
//	GREATEST(received_at, record_at) < now − (retention.ms + segment.ms + Buffer)
//
// strictly: a key exactly at the cutoff is kept. The later of the receive time
// and the record's own timestamp counts, because Kafka ages a segment by its
// records' timestamps and a producer's clock can run ahead. The time rule is
// unsafe under compaction (the log cleaner merges segments whatever their time
// span, and retention deletes a merged group by its newest record), so keys
// of unknown position on a compact,delete topic are kept.
//
// Neither rule runs, and the Report says why (Reason), when Kafka cannot be
// reached; the time rule does not run when the topic's retention.ms is -1,
// its cleanup.policy lacks delete, has compact or holds a token pgbox does not
// recognise, a value cannot be interpreted, Kafka does not know the topic, or
// its config cannot be read. Config.Window or a per-topic Topic.Window forces
// a time window for such topics; it never shortens a window Kafka gives.
// TopicReport says which rule deleted what (ExactDeleted, TimeDeleted) and
// why a rule did not run (Reason, OffsetsErr, Note).
//
// A consumer in the inbox's watermark mode (inbox.DedupWatermark) keeps no
// keys in pgbox_inbox, only one pgbox_inbox_watermark row per partition,
// updated in place: there is nothing to prune for it, and its topics do not
// appear in a pass.
//
// Kafka is read through Config.Admin, a Kafka-client-neutral interface
// ([Admin]; cleanupsarama implements it over sarama, cleanupkgo
// over franz-go's kadm, and cleanup links neither): per pass,
// one DescribeConfigs request for all topics (retention.ms, segment.ms and
// cleanup.policy only), one Metadata request and one ListOffsets request per
// partition leader. The topics come from pgbox_inbox by a loose index scan:
// one index probe per topic, whatever the number of keys.
//
// Deletes run in short transactions of at most BatchSize rows (1,000 by
// default), along the (topic, partition, offset) index for the exact rule
// (only the keys behind the log start are read) and oldest first along the
// (consumer, topic, age) index for the time rule (each consumer's keys, in
// one statement, merged by age), with a Pause (20ms by
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
// (Measured with the time rule. The exact rule deletes along the position
// index instead: at the defaults, 500,000 keys gave ~42,000 keys/s, writers'
// commits ~0.91x and p99 ~1.4x; 10 million expired keys beside 5 million
// live ones took 4m06s, ~40,700 keys/s, writers' commits ~0.92x and p99
// ~1.95x, the longest batch 1.6s.)
//
// At the defaults 10 million expired keys take about 4 to 5 minutes; a service
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
