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
// `pgbox-relay dead replay`), the replay carries the header ReplayHeader
// ("pgbox-replay-of: <dead letter id>"), and every strategy appends
// ReplayKeySuffix and that id to the key it derives: "orders/3/1042/replay/17".
// The replay is therefore processed (once: its own redeliveries are
// duplicates), and a rewind that delivers the original record again still
// finds the original key and skips it. This holds for Process, ProcessBatch
// and the sarama adapter alike.
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
// The table pgbox_inbox comes from package migrations (migrations.Up, or the
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
// HTTP handler, uses it the same way. For a ready-made sarama consumer-group
// handler that runs this loop (offsets, batches, retries, dead letters, topic
// ids), see package inbox/inboxsarama.
package inbox
