package inboxsarama

import (
	"context"
	"sync"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/consume"
)

// Config configures NewHandler. The zero value is usable: one message per
// transaction, 25 attempts over about three minutes, dead letters to
// "<topic>.dlq", no topic ids, offsets left to sarama's auto-commit.
//
// The settings both adapters share (BatchSize, BatchHandler, BatchWait, MaxAttempts,
// RetryBackoff, MaxRetryBackoff, DeadLetterTopic, DrainTimeout, Logger) are
// [inbox.ConsumerConfig]'s, documented there with their defaults
// (inbox.BatchSizeDefault…) and sentinels (inbox.NoBatchWait…).
type Config struct {
	inbox.ConsumerConfig

	// Client, when set, is asked for each claimed topic's id (a metadata
	// request, Kafka ≥ 2.8 and Client.Config().Version ≥ V2_8_0_0), and
	// inbox.Message.TopicID is set from it, so that ByOffset keys of a topic deleted
	// and recreated under the same name never collide with the old topic's.
	// When the broker reports no id (an all-zero id, or an older protocol
	// version), messages carry no topic id and keys are built without it.
	// Decide before the first deployment: turning it on changes ByOffset keys
	// of messages not yet committed. Defaults to nil (no topic ids).
	Client sarama.Client

	// CommitOffsets commits marked offsets synchronously after every
	// transaction (sarama's session.Commit) instead of leaving them to
	// sarama's auto-commit. It narrows the window of redeliveries after a
	// crash, which the inbox deduplicates anyway, at the cost of a broker round
	// trip per transaction. Defaults to false.
	CommitOffsets bool
}

// core is the loop's share of the settings.
func (o Config) core() consume.Config {
	return consume.Config{Name: "inboxsarama", ConsumerConfig: o.ConsumerConfig}
}

// Handler is the sarama.ConsumerGroupHandler that
// NewHandler returns. It is safe for the concurrent use sarama
// makes of it (one ConsumeClaim goroutine per partition) and may be passed
// to Consume again after a rebalance.
type Handler struct {
	loop *consume.Loop
	cfg  Config

	// ended holds, per session, the error that needs an operator which
	// ended one of its claims; Cleanup returns it, so Consume does.
	endedMu sync.Mutex
	ended   map[sarama.ConsumerGroupSession]error
}

var _ sarama.ConsumerGroupHandler = (*Handler)(nil)

// NewHandler returns a sarama consumer-group handler that runs
// every message through ib inside a transaction on pool and commits before it
// marks the message's offset:
//
//	BEGIN; ib.Process(msg, fn) or ib.ProcessBatch(msgs, fn); COMMIT; MarkOffset
//
// fn gets the transaction: its business writes, and outbox.Write calls for the
// events it produces, commit together with the inbox key, so a redelivered
// message is skipped as a duplicate and consume→process→produce is
// exactly-once in effect.
//
// With opts.BatchHandler set, fn must be nil: the batch handler gets each
// batch's new messages at once (ib.ProcessBatchAtOnce), and a batch it fails
// in part (an inbox.BatchError) is cut at the first failed message: the
// messages before it commit, it is retried alone, then the rest follow.
//
// Failures:
//   - Database errors that retrying can fix (connection lost, failover,
//     deadlock, serialization failure, lock or connection shortage,
//     inbox.ErrInFlight...) retry the same message with backoff,
//     indefinitely; the offset does not move and no attempt is counted.
//   - Database errors that need an operator (a missing table, column or
//     function, a revoked grant, failed authentication), from the adapter's
//     own SQL or from fn's, end the claim: ConsumeClaim returns the error
//     (wrapping inbox.ErrNeedsOperator and naming the fix), which ends the
//     session, and Consume returns it (from Cleanup). Nothing is counted as
//     an attempt or dead-lettered; the offset does not move, so once the
//     operator fixed the database the next Consume carries on.
//   - Any other handler error counts as an attempt (kept in
//     pgbox_consumer_attempts) and the message is retried with backoff, up to
//     opts.MaxAttempts runs of fn in all (batch runs included). Then it is
//     dead-lettered: one transaction records its key in the inbox (a
//     redelivery is a duplicate), records it in pgbox_consumer_dead with the
//     error, and writes a dead-letter record to the outbox (original key,
//     value and headers plus the inbox.HeaderDLQ* headers) for the relay to
//     publish; then the offset advances. Wrap an error in inbox.Permanent to
//     dead-letter at once; inbox.ErrInvalidMessage and
//     inbox.ErrFingerprintMismatch are permanent too. fn's own context
//     deadline (or statement_timeout) is its fault, and counts.
//
// A panic in fn is recovered and counts as a failed attempt.
func NewHandler(pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, opts Config) (*Handler, error) {
	loop, err := consume.New(pool, ib, fn, opts.core(), "NewHandler")
	if err != nil {
		return nil, err
	}
	return &Handler{loop: loop, cfg: opts}, nil
}

// Stats returns the counters so far.
func (h *Handler) Stats() inbox.ConsumerStats { return h.loop.Stats() }

// Setup implements sarama.ConsumerGroupHandler. It does nothing: per-claim
// state (topic ids, pending attempts) is read when each claim starts.
func (h *Handler) Setup(sarama.ConsumerGroupSession) error { return nil }

// Cleanup implements sarama.ConsumerGroupHandler. It returns the error that
// needs an operator which ended one of the session's claims, if any, so that
// Consume returns it.
func (h *Handler) Cleanup(sess sarama.ConsumerGroupSession) error {
	h.endedMu.Lock()
	defer h.endedMu.Unlock()
	err := h.ended[sess]
	delete(h.ended, sess)
	return err
}

// ConsumeClaim implements sarama.ConsumerGroupHandler. It returns when the
// session ends or the claim is revoked, after the transaction in flight (if
// any) committed or rolled back; offsets are marked only after a commit. It
// returns an error only when the database needs an operator (see NewHandler).
func (h *Handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	fatal := consume.Run(h.loop, &saramaClaim{sess: sess, claim: claim, cfg: &h.cfg})
	if fatal != nil {
		h.endedMu.Lock()
		if h.ended == nil {
			h.ended = map[sarama.ConsumerGroupSession]error{}
		}
		if h.ended[sess] == nil {
			h.ended[sess] = fatal
		}
		h.endedMu.Unlock()
	}
	return fatal
}

// saramaClaim is a sarama claim as the loop reads it.
type saramaClaim struct {
	sess  sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	cfg   *Config
}

func (c *saramaClaim) Topic() string                                   { return c.claim.Topic() }
func (c *saramaClaim) Partition() int32                                { return c.claim.Partition() }
func (c *saramaClaim) InitialOffset() int64                            { return c.claim.InitialOffset() }
func (c *saramaClaim) Context() context.Context                        { return c.sess.Context() }
func (c *saramaClaim) Records() <-chan *sarama.ConsumerMessage         { return c.claim.Messages() }
func (c *saramaClaim) Message(m *sarama.ConsumerMessage) inbox.Message { return Message(m) }

func (c *saramaClaim) TopicID(context.Context) (string, error) {
	if c.cfg.Client == nil {
		return "", nil
	}
	return fetchTopicID(c.cfg.Client, c.claim.Topic())
}

// Mark marks m's offset in the session, and commits it when
// Config.CommitOffsets asks to.
func (c *saramaClaim) Mark(m *sarama.ConsumerMessage) {
	c.sess.MarkMessage(m, "")
	if c.cfg.CommitOffsets {
		c.sess.Commit()
	}
}
