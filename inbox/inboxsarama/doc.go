// Package inboxsarama runs an inbox.Inbox as a sarama consumer-group
// handler: the loop a service would otherwise write around inbox.Process,
// with offsets, batches, retries, dead letters and topic ids. Package inbox
// itself links no Kafka client; this package is where sarama comes in, the
// way a River driver sits beside River's core. The loop itself (batches,
// attempts, retries, dead letters, the error classifier, marking after the
// commit) is inbox/internal/consume, shared with the franz-go adapter.
//
// # The loop
//
// For each claimed partition, in order:
//
//	BEGIN
//	  ib.Process(msg, fn)       (or ib.ProcessBatch(msgs, fn) with Config.BatchSize > 1)
//	  fn: business writes, outbox.Write of the events it produces
//	COMMIT
//	session.MarkMessage          (only after the commit)
//
// A redelivery (crash before the offset commit, rebalance, replay) finds its
// key in pgbox_inbox and is skipped, so consume → process → produce is
// exactly-once in effect.
//
// BEGIN is not a round trip of its own: it goes out with the inbox's dedup
// step, in one pgx batch, so a transaction is three round trips (BEGIN and
// dedup, fn's statements, COMMIT). Since the adapter rolls the whole
// transaction back on any error, the inbox opens no savepoint in it: no
// subtransaction per message. A savepoint fn opens itself (tx.Begin) works
// as in pgx.
//
// # Failures
//
// Every database error, the adapter's own or one from fn's SQL, goes through
// pgbox's one classifier first:
//
//   - retryable (connection lost, failover, deadlock, serialization failure,
//     lock timeout, too many connections, a key in flight): the same message
//     is retried with backoff; nothing is counted against it;
//   - needs an operator (a missing table, column or function, a revoked
//     grant, failed authentication): the claim ends and Consume returns the
//     error, which wraps inbox.ErrNeedsOperator and names the fix (for
//     pgbox's own tables, "run `relay migrate up`"). It is logged at
//     ERROR and counted in inbox.ConsumerStats.OperatorErrors; the message is
//     neither counted as an attempt nor dead-lettered, and its offset does not move,
//     so the next Consume after the fix carries on where this one stopped.
//
// Any other error of fn is the message's: it counts as an attempt (in
// pgbox_consumer_attempts, surviving restarts), is retried with backoff up to
// Config.MaxAttempts runs in all (a run inside a batch included), and is then
// dead-lettered through the outbox (inbox.HeaderDLQ* headers say why).
// inbox.Permanent dead-letters at once.
//
// # Example
//
//	ib, _ := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("pgbox-event-id")})
//	h, err := inboxsarama.NewHandler(pool, ib, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
//		// business writes in tx; outbox.Write(ctx, tx, ...) for the events
//		return nil
//	}, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 100}})
//	for ctx.Err() == nil {
//		if err := group.Consume(ctx, topics, h); errors.Is(err, inbox.ErrNeedsOperator) {
//			return err // page someone: retrying will not help
//		}
//	}
//
// ExampleNewHandler runs the whole thing against an embedded broker.
package inboxsarama
