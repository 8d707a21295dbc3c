// Package inbox makes consuming Kafka exactly-once in effect: a redelivered
// message (a crash before the offset commit, a rebalance, a replay) has no
// second effect, because its key is recorded in the service's own PostgreSQL
// in the same transaction as the business writes.
//
// # The story
//
// Kafka delivers at least once. A consumer that writes to its database and
// then commits its offset has a window, between the two, in which a crash or
// a rebalance makes Kafka deliver the message again. The inbox closes it:
//
//	BEGIN
//	  inbox.Process: INSERT key INTO pgbox_inbox ON CONFLICT DO NOTHING
//	  new key   → your handler does its writes
//	  known key → the handler is skipped (Result.Duplicate)
//	COMMIT
//	mark the offset in Kafka
//
// The key and the handler's writes commit together or not at all. If the
// transaction rolls back, nothing remains and the redelivery is processed; if
// it commits, every later delivery is a duplicate. Two deliveries of one key
// racing on two connections serialize on the table's primary key: the second
// waits for the first, then reports a duplicate (or processes, if the first
// rolled back). No Redis, no SERIALIZABLE, no Kafka transactions: the unique
// index under READ COMMITTED is the mechanism.
//
// The transaction is a pgx.Tx (Process, ProcessBatch) or, for a service on
// database/sql (GORM, bun, sqlc), a *sql.Tx opened on pgx's stdlib driver
// (ProcessSQL, ProcessBatchSQL, whose handler gets that *sql.Tx): the same
// dedup step runs on the pgx connection under it, with the same guarantees
// and errors.
//
// Mark the Kafka offset only after the commit. Do not run the consumer's
// transactions with synchronous_commit = off: a crash could then lose a commit
// whose offset Kafka already has, and the message's effect with it.
//
// # Keys
//
// A KeyStrategy derives each message's key: ByOffset (topic/partition/offset,
// plus the topic id when known), ByHeader (an event id the producer set, which
// also dedupes a producer's own retries), or ByFunc. Keys are namespaced by
// Config.Consumer, so two consumer groups never dedupe each other. Messages
// that cannot be keyed or stored are rejected with ErrInvalidMessage before
// anything is written.
//
// # Replayed dead letters
//
// A dead-lettered record's key is in the inbox (so a redelivery of it is a
// duplicate). When an operator replays it (inspect.ReplayDead, or
// `relay dead replay`), the replay carries the header ReplayHeader
// ("pgbox-replay-of: <dead letter id>"), and every strategy appends
// ReplayKeySuffix and that id to the key it derives: "orders/3/1042/replay/17".
// The replay is therefore processed (once: its own redeliveries are
// duplicates), and a rewind that delivers the original record again still
// finds the original key and skips it. This holds for Process, ProcessBatch
// and both consumer adapters alike.
//
// # Offset watermarks: dedup without per-message state
//
// Config.Dedup = DedupWatermark keeps, instead of a row per message, one row
// per (consumer, topic, partition) in pgbox_inbox_watermark holding the
// highest offset whose effects committed; Process moves it forward in the
// same round trip as the savepoint, inside the caller's transaction, and a
// record at or below it is a duplicate. State is O(partitions), updated in
// place, and cleanup has nothing to do for such a consumer.
//
// Choose it when the consumer processes each partition in offset order (both
// consumer adapters do, at any batch size) and duplicates come from
// redelivery (crash before the offset commit, rebalance, rewind). Keep
// DedupKeys when messages of a partition are processed out of order or in
// parallel (a watermark would take a skipped-over message for a duplicate),
// when the same event can arrive at different offsets or on different
// topics and only an event id identifies it, or when duplicates must get a
// stored result back (SetResult). DedupWatermarkAndKeys combines both: the
// watermark for redeliveries, Config.Key (an event id, e.g. the relay's
// header) for a producer's resends, which still need keys and cleanup but no
// longer a key per offset.
//
// Behaviour, each one a test:
//   - Rebalance: the partition's new owner re-reads from the group's
//     committed offset; records its predecessor committed are at or below
//     the watermark. Two transactions delivering the same partition at once
//     serialize on the watermark row: the second re-checks against the
//     committed offset once the first commits (or proceeds if it rolled
//     back).
//   - Offset reset backwards (a rewind, a replay): nothing is reprocessed.
//   - Offset reset forwards, or any offset the consumer never saw: the next
//     record is processed and Result.Gap says how many offsets lie between
//     it and the watermark (Stats.Gaps counts them; the adapter logs each at
//     warn). Kafka also leaves holes legitimately (transaction markers,
//     compaction, retention deleting records before they were read), so a
//     gap is reported, not refused.
//   - Topic deleted and recreated: with Message.TopicID set (the adapter's
//     Config.Client), a record carrying a different id starts the row over
//     at its offset; without ids the offsets of the new topic compare with
//     the old one's, and records up to the old watermark would be taken for
//     duplicates: set topic ids when topics can be recreated.
//   - ProcessBatch: one statement moves every partition of the batch; each
//     partition's messages must come in offset order (a message going back
//     is rejected with ErrInvalidMessage, nothing written).
//
// # Fingerprints, stored results, in-flight keys
//
// With fingerprints on (the default) the sha256 of the message value is kept
// with the key, and a known key arriving with a different payload fails with
// ErrFingerprintMismatch instead of being dropped as a duplicate. A handler
// may call SetResult to keep bytes with the key (say, the id of the payment
// it created); duplicates get them back in Result.Stored. With
// Config.LockTimeout, a key held by another uncommitted transaction returns
// ErrInFlight instead of waiting, so the consumer can back off.
//
// # Failures
//
// Process wraps the insert and the handler in a savepoint: a handler error
// rolls back the key and the handler's writes and leaves the caller's
// transaction usable, so even a caller that commits anyway commits no trace of
// the message. ProcessBatch does the same for a whole batch, all or nothing.
//
// # Schema
//
// The tables pgbox_inbox and pgbox_inbox_watermark come from package migrations (migrations.Up, or the
// goose CLI). The package's queries use unqualified names, resolved through
// the connection's search_path. Rows are pruned by package cleanup once Kafka
// can no longer redeliver their message.
//
// # Errors that need an operator
//
// A database error retrying cannot fix (pgbox_inbox missing because the
// migrations were not run, a revoked grant) wraps ErrNeedsOperator and names
// the fix; the same sentinel is exported by relay and cleanup.
//
// # Kafka clients
//
// The package links no Kafka client: Message is a plain struct, so a service
// on sarama, franz-go or confluent-kafka-go, or one calling Process from an
// HTTP handler, uses it the same way. For a ready-made consumer that runs
// this loop (offsets, batches, retries, dead letters, topic ids), see package
// inbox/inboxsarama (a sarama consumer-group handler) or inbox/inboxfranz (a
// franz-go group consumer); they share one loop, and everything a user names
// of it lives here, once, for both: ConsumerConfig with its defaults and
// NoXxx sentinels, Permanent, ConsumerStats and the HeaderDLQ* headers, so a
// handler, its settings and a metrics exporter work with either client.
package inbox
