package inboxsarama

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/outbox"
)

// Defaults of Config.
const (
	// BatchSizeDefault is Config.BatchSize's default: one message per
	// transaction.
	BatchSizeDefault = 1
	// BatchWaitDefault is Config.BatchWait's default.
	BatchWaitDefault = 10 * time.Millisecond
	// MaxAttemptsDefault is Config.MaxAttempts's default. With the default
	// backoff (RetryBackoffDefault doubling to MaxRetryBackoffDefault) the 24
	// waits between the first and the last attempt add up to about three
	// minutes: long enough to ride out a downstream
	// service's restart or a failover before a healthy message is
	// dead-lettered. The price: a poison message holds its partition that
	// long (the partitions of other claims go on). A handler that knows an
	// error cannot pass returns Permanent(err) and skips the wait.
	MaxAttemptsDefault = 25
	// RetryBackoffDefault is Config.RetryBackoff's default.
	RetryBackoffDefault = 100 * time.Millisecond
	// MaxRetryBackoffDefault is Config.MaxRetryBackoff's default.
	MaxRetryBackoffDefault = 10 * time.Second
	// DeadLetterSuffixDefault is appended to the source topic's name to make
	// the dead-letter topic when Config.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = ".dlq"
	// DrainTimeoutDefault is Config.DrainTimeout's default.
	DrainTimeoutDefault = 5 * time.Second
)

// Sentinels for the Config durations whose zero is a meaningful value (a
// zero field means the default).
const (
	// NoBatchWait asks Config.BatchWait for no wait: a batch is what is
	// already buffered.
	NoBatchWait time.Duration = -1
	// NoRetryBackoff asks Config.RetryBackoff for no wait between retries.
	NoRetryBackoff time.Duration = -1
	// NoDrainTimeout asks Config.DrainTimeout for none: a transaction in
	// flight when its session ends is rolled back at once.
	NoDrainTimeout time.Duration = -1
)

// Config configures NewHandler. The zero value is
// usable: one message per transaction, 25 attempts over about three minutes,
// dead letters to
// "<topic>.dlq", no topic ids.
type Config struct {
	// BatchSize is the most messages of one partition processed in one
	// transaction. Above 1, messages go through ProcessBatch (one round trip
	// for all their keys); a batch whose handler fails is retried message by
	// message, so one poison message cannot hold back the others. Defaults to
	// BatchSizeDefault (1: Process, one transaction per message).
	BatchSize int

	// BatchWait is how long a batch waits to fill up after its first message
	// arrived; messages already buffered never wait. NoBatchWait means no
	// wait. Defaults to BatchWaitDefault (10ms).
	BatchWait time.Duration

	// MaxAttempts is how many times the handler runs for one message before
	// the message is dead-lettered. Attempts are counted in PostgreSQL
	// (pgbox_consumer_attempts), so they survive restarts and rebalances;
	// a run inside a batch counts like any other. 1 means no retries.
	// Database errors (retryable ones, and those that need an operator) are
	// never the message's fault and do not count. Defaults to
	// MaxAttemptsDefault (25: about three minutes of retries, enough to ride
	// out a downstream restart; a poison message holds its partition that
	// long, unless the handler returns Permanent).
	MaxAttempts int

	// RetryBackoff is the wait before the second attempt; it doubles per
	// attempt (with ±20% jitter) up to MaxRetryBackoff. The same schedule
	// paces retries after transient database errors. NoRetryBackoff retries
	// at once. Defaults to RetryBackoffDefault (100ms).
	RetryBackoff time.Duration

	// MaxRetryBackoff caps the wait between attempts. Defaults to
	// MaxRetryBackoffDefault (10s).
	MaxRetryBackoff time.Duration

	// DeadLetterTopic is the topic dead-letter records are written to
	// (through the outbox, for the relay to publish). Defaults to the source
	// topic's name with DeadLetterSuffixDefault (".dlq") appended.
	DeadLetterTopic string

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

	// DrainTimeout is how long a transaction already running when its
	// session ends (a rebalance, or Consume's ctx cancelled) may run on to
	// commit; past it, its context is cancelled and it rolls back. No new
	// transaction starts after the session ends. NoDrainTimeout rolls it
	// back at once. Defaults to DrainTimeoutDefault (5s); keep it below sarama's
	// Consumer.Group.Rebalance.Timeout.
	DrainTimeout time.Duration

	// Logger receives retries (warn), dead letters, database errors and
	// errors that need an operator (error). Defaults to slog.Default() when
	// nil.
	Logger *slog.Logger
}

func (o Config) withDefaults() Config {
	if o.BatchSize == 0 {
		o.BatchSize = BatchSizeDefault
	}
	o.BatchWait = durationOr(o.BatchWait, BatchWaitDefault)
	if o.MaxAttempts == 0 {
		o.MaxAttempts = MaxAttemptsDefault
	}
	o.RetryBackoff = durationOr(o.RetryBackoff, RetryBackoffDefault)
	if o.MaxRetryBackoff == 0 {
		o.MaxRetryBackoff = MaxRetryBackoffDefault
	}
	o.DrainTimeout = durationOr(o.DrainTimeout, DrainTimeoutDefault)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// durationOr maps 0 to def and the No* sentinel (-1) to zero.
func durationOr(d, def time.Duration) time.Duration {
	switch d {
	case 0:
		return def
	case -1:
		return 0
	}
	return d
}

func (o Config) validate() error {
	switch {
	case o.BatchSize < 0:
		return fmt.Errorf("inboxsarama: Config.BatchSize is negative (%d): use 1 for a transaction per message, or more to batch", o.BatchSize)
	case o.BatchWait < -1:
		return fmt.Errorf("inboxsarama: Config.BatchWait is negative (%v): use NoBatchWait for no wait, 0 for the default", o.BatchWait)
	case o.MaxAttempts < 0:
		return fmt.Errorf("inboxsarama: Config.MaxAttempts is negative (%d): use 1 to dead-letter on the first failure (no retries), 0 for the default", o.MaxAttempts)
	case o.RetryBackoff < -1:
		return fmt.Errorf("inboxsarama: Config.RetryBackoff is negative (%v): use NoRetryBackoff for no wait, 0 for the default", o.RetryBackoff)
	case o.MaxRetryBackoff < 0:
		return fmt.Errorf("inboxsarama: Config.MaxRetryBackoff is negative (%v): use NoRetryBackoff for no wait at all, 0 for the default", o.MaxRetryBackoff)
	case o.DrainTimeout < -1:
		return fmt.Errorf("inboxsarama: Config.DrainTimeout is negative (%v): use NoDrainTimeout to roll back at once, 0 for the default", o.DrainTimeout)
	}
	if o.DeadLetterTopic != "" {
		if err := outbox.ValidateTopic(o.DeadLetterTopic); err != nil {
			return fmt.Errorf("inboxsarama: Config.DeadLetterTopic %q: %w", o.DeadLetterTopic, err)
		}
	}
	return nil
}

// Stats counts what a Handler did since it was made.
// Processed and Duplicates count committed transactions only.
type Stats struct {
	Processed       uint64 // messages whose handler ran and whose transaction committed
	Duplicates      uint64 // messages skipped as already processed, committed
	Failures        uint64 // handler attempts that failed (each counts toward MaxAttempts)
	TransientErrors uint64 // attempts that failed on a retryable database error (not counted as attempts)
	OperatorErrors  uint64 // database errors that need an operator and ended a claim (not counted as attempts)
	Retries         uint64 // attempts repeated after a failure of either kind
	DeadLettered    uint64 // messages dead-lettered
	BatchFallbacks  uint64 // batches retried message by message after a failure
	Gaps            uint64 // watermark modes: committed messages that came after offsets never processed (logged)
}

// Handler is the sarama.ConsumerGroupHandler that
// NewHandler returns. It is safe for the concurrent use sarama
// makes of it (one ConsumeClaim goroutine per partition) and may be passed
// to Consume again after a rebalance.
type Handler struct {
	pool *pgxpool.Pool
	ib   *inbox.Inbox
	fn   inbox.HandlerFunc
	opts Config
	log  *slog.Logger

	// afterCommit, when set (by tests), runs after a transaction committed
	// and before its offsets are marked.
	afterCommit func([]inbox.Message)

	stats struct {
		processed, duplicates, failures, transient, operator, retries, dead, fallbacks, gaps atomic.Uint64
	}

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
//     value and headers plus the HeaderDLQ* headers) for the relay to
//     publish; then the offset advances. Wrap an error in Permanent to
//     dead-letter at once; inbox.ErrInvalidMessage and
//     inbox.ErrFingerprintMismatch are permanent too. fn's own context
//     deadline (or statement_timeout) is its fault, and counts.
//
// A panic in fn is recovered and counts as a failed attempt.
func NewHandler(pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, opts Config) (*Handler, error) {
	if pool == nil {
		return nil, errors.New("inboxsarama: NewHandler: nil pool (pass the *pgxpool.Pool of the service's database)")
	}
	if ib == nil {
		return nil, errors.New("inboxsarama: NewHandler: nil *inbox.Inbox (make one with inbox.New)")
	}
	if fn == nil {
		return nil, errors.New("inboxsarama: NewHandler: nil HandlerFunc (pass the func that does each message's business work)")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	return &Handler{pool: pool, ib: ib, fn: fn, opts: opts, log: opts.Logger}, nil
}

// Stats returns the counters so far.
func (h *Handler) Stats() Stats {
	return Stats{
		Processed:       h.stats.processed.Load(),
		Duplicates:      h.stats.duplicates.Load(),
		Failures:        h.stats.failures.Load(),
		TransientErrors: h.stats.transient.Load(),
		OperatorErrors:  h.stats.operator.Load(),
		Retries:         h.stats.retries.Load(),
		DeadLettered:    h.stats.dead.Load(),
		BatchFallbacks:  h.stats.fallbacks.Load(),
		Gaps:            h.stats.gaps.Load(),
	}
}

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
	c := newClaimRun(h, sess, claim)
	defer c.close()
	c.run()
	if c.fatal != nil {
		h.endedMu.Lock()
		if h.ended == nil {
			h.ended = map[sarama.ConsumerGroupSession]error{}
		}
		if h.ended[sess] == nil {
			h.ended[sess] = c.fatal
		}
		h.endedMu.Unlock()
	}
	return c.fatal
}

// backoff returns the wait before retry n (n ≥ 1).
func (h *Handler) backoff(n int) time.Duration {
	return backoff.Delay(h.opts.RetryBackoff, h.opts.MaxRetryBackoff, n)
}

func (h *Handler) deadLetterTopic(source string) string {
	if h.opts.DeadLetterTopic != "" {
		return h.opts.DeadLetterTopic
	}
	return source + DeadLetterSuffixDefault
}
