// Package inboxfranz runs an inbox.Inbox as a franz-go (kgo) group consumer:
// the loop a service on franz-go would otherwise write around
// inbox.Process, with offsets, batches, retries, dead letters and topic
// ids. It drives the same loop as inbox/inboxsarama (inbox/internal/consume),
// so both adapters behave alike, pass one guarantee suite, write the same
// dead-letter headers and build the same inbox keys; a group may hold
// members of both during a migration from one client to the other. It links
// franz-go only, never sarama.
//
// # The loop
//
// For each assigned partition, in order:
//
//	BEGIN
//	  ib.Process(msg, fn)       (or ib.ProcessBatch(msgs, fn) with Config.BatchSize > 1)
//	  fn: business writes, outbox.Write of the events it produces
//	COMMIT
//	mark the offset              (only after the commit)
//
// Marked offsets are committed to Kafka every Config.CommitInterval (or
// after each transaction with Config.CommitOffsets), when a partition is
// revoked, and when Run returns. The client's own autocommit is turned off
// by NewConsumer (kgo.DisableAutoCommit); options that ask for it
// (kgo.GreedyAutoCommit, kgo.AutoCommitMarks, kgo.AutoCommitInterval) are
// refused. A
// partition revoked mid-transaction lets the transaction commit within
// Config.DrainTimeout, commits its offset, and only then lets the rebalance
// go on; a partition lost (the member fenced) commits nothing. Either way no
// offset past what committed in PostgreSQL is ever committed, and a
// redelivery finds its key in pgbox_inbox and is skipped.
//
// # Failures
//
// As in inboxsarama: retryable database errors (the adapter's or fn's)
// retry the same message uncounted; errors that need an operator (a missing
// table, a revoked grant) end Run with an error wrapping
// inbox.ErrNeedsOperator that names the fix; any other error of fn counts
// as an attempt (pgbox_consumer_attempts, shared with sarama members), is
// retried with backoff up to Config.MaxAttempts, then dead-lettered through
// the outbox (inbox.HeaderDLQ* headers). inbox.Permanent dead-letters at
// once.
//
// # Example
//
//	ib, _ := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("pgbox-event-id")})
//	c, err := inboxfranz.NewConsumer(pool, ib, fn, inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 100}},
//		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("payments-svc"),
//		kgo.ConsumeTopics("payments.v1"))
//	defer c.Close()
//	if err := c.Run(ctx); errors.Is(err, inbox.ErrNeedsOperator) {
//		return err // page someone: retrying will not help
//	}
//
// ExampleNewConsumer runs the whole thing against an embedded broker.
package inboxfranz
