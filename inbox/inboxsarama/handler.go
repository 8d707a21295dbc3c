package inboxsarama

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// Defaults of Options.
const (
	// BatchSizeDefault is Options.BatchSize's default: one message per
	// transaction.
	BatchSizeDefault = 1
	// BatchWaitDefault is Options.BatchWait's default.
	BatchWaitDefault = 10 * time.Millisecond
	// MaxAttemptsDefault is Options.MaxAttempts's default.
	MaxAttemptsDefault = 5
	// RetryBackoffDefault is Options.RetryBackoff's default.
	RetryBackoffDefault = 100 * time.Millisecond
	// MaxRetryBackoffDefault is Options.MaxRetryBackoff's default.
	MaxRetryBackoffDefault = 10 * time.Second
	// DeadLetterSuffixDefault is appended to the source topic's name to make
	// the dead-letter topic when Options.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = ".dlq"
	// DrainTimeoutDefault is Options.DrainTimeout's default.
	DrainTimeoutDefault = 5 * time.Second
)

// Options configures NewHandler. The zero value is
// usable: one message per transaction, five attempts, dead letters to
// "<topic>.dlq", no topic ids.
type Options struct {
	// BatchSize is the most messages of one partition processed in one
	// transaction. Above 1, messages go through ProcessBatch (one round trip
	// for all their keys); a batch whose handler fails is retried message by
	// message, so one poison message cannot hold back the others. Defaults to
	// BatchSizeDefault (1: Process, one transaction per message).
	BatchSize int

	// BatchWait is how long a batch waits to fill up after its first message
	// arrived; messages already buffered never wait. Defaults to
	// BatchWaitDefault (10ms).
	BatchWait time.Duration

	// MaxAttempts is how many times the handler runs for one message before
	// the message is dead-lettered. Attempts are counted in PostgreSQL
	// (pgbox_consumer_attempts), so they survive restarts and rebalances.
	// Transient database errors do not count. Defaults to MaxAttemptsDefault
	// (5).
	MaxAttempts int

	// RetryBackoff is the wait before the second attempt; it doubles per
	// attempt (with ±20% jitter) up to MaxRetryBackoff. The same schedule
	// paces retries after transient database errors. Defaults to
	// RetryBackoffDefault (100ms).
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
	// transaction starts after the session ends. Defaults to
	// DrainTimeoutDefault (5s); keep it below sarama's
	// Consumer.Group.Rebalance.Timeout.
	DrainTimeout time.Duration

	// Logger receives retries (warn), dead letters and stalls (error).
	// Defaults to a logger that discards everything.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.BatchSize == 0 {
		o.BatchSize = BatchSizeDefault
	}
	if o.BatchWait == 0 {
		o.BatchWait = BatchWaitDefault
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = MaxAttemptsDefault
	}
	if o.RetryBackoff == 0 {
		o.RetryBackoff = RetryBackoffDefault
	}
	if o.MaxRetryBackoff == 0 {
		o.MaxRetryBackoff = MaxRetryBackoffDefault
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DrainTimeoutDefault
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (o Options) validate() error {
	switch {
	case o.BatchSize < 0:
		return fmt.Errorf("inboxsarama: Options.BatchSize is negative (%d): use 1 for a transaction per message, or more to batch", o.BatchSize)
	case o.BatchWait < 0:
		return fmt.Errorf("inboxsarama: Options.BatchWait is negative (%v)", o.BatchWait)
	case o.MaxAttempts < 0:
		return fmt.Errorf("inboxsarama: Options.MaxAttempts is negative (%d): use 1 to dead-letter on the first failure", o.MaxAttempts)
	case o.RetryBackoff < 0:
		return fmt.Errorf("inboxsarama: Options.RetryBackoff is negative (%v)", o.RetryBackoff)
	case o.MaxRetryBackoff < 0:
		return fmt.Errorf("inboxsarama: Options.MaxRetryBackoff is negative (%v)", o.MaxRetryBackoff)
	case o.DrainTimeout < 0:
		return fmt.Errorf("inboxsarama: Options.DrainTimeout is negative (%v)", o.DrainTimeout)
	}
	if o.DeadLetterTopic != "" {
		if err := outbox.ValidateTopic(o.DeadLetterTopic); err != nil {
			return fmt.Errorf("inboxsarama: Options.DeadLetterTopic %q: %w", o.DeadLetterTopic, err)
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
	TransientErrors uint64 // attempts that failed on a transient database error (not counted)
	Retries         uint64 // attempts repeated after a failure of either kind
	DeadLettered    uint64 // messages dead-lettered
	BatchFallbacks  uint64 // batches retried message by message after a failure
}

// Handler is the sarama.ConsumerGroupHandler that
// NewHandler returns. It is safe for the concurrent use sarama
// makes of it (one ConsumeClaim goroutine per partition) and may be passed
// to Consume again after a rebalance.
type Handler struct {
	pool *pgxpool.Pool
	ib   *inbox.Inbox
	fn   inbox.HandlerFunc
	opts Options
	log  *slog.Logger

	// afterCommit, when set (by tests), runs after a transaction committed
	// and before its offsets are marked.
	afterCommit func([]inbox.Message)

	stats struct {
		processed, duplicates, failures, transient, retries, dead, fallbacks atomic.Uint64
	}
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
//   - Transient database errors (connection lost, admin shutdown, deadlock,
//     serialization failure, inbox.ErrInFlight...) retry the same message with
//     backoff, indefinitely; the offset does not move.
//   - A handler error counts as an attempt (kept in pgbox_consumer_attempts)
//     and the message is retried with backoff, up to opts.MaxAttempts. Then
//     it is dead-lettered: one transaction records its key in the inbox (a
//     redelivery is a duplicate), records it in pgbox_consumer_dead with the
//     error, and writes a dead-letter record to the outbox (original key,
//     value and headers plus the Header* headers) for the relay to publish;
//     then the offset advances. Wrap an error in Permanent to dead-letter at
//     once; inbox.ErrInvalidMessage and inbox.ErrFingerprintMismatch are permanent too.
//   - Any other error (a missing table, a permission) stalls the partition
//     with error logs and backoff rather than dead-lettering healthy messages.
//
// A panic in fn is recovered and counts as a failed attempt.
func NewHandler(pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, opts Options) (*Handler, error) {
	if pool == nil {
		return nil, errors.New("inboxsarama: NewHandler: nil pool (pass the *pgxpool.Pool of the service's database)")
	}
	if ib == nil {
		return nil, errors.New("inboxsarama: NewHandler: nil *inbox.Inbox (make one with inbox.New)")
	}
	if fn == nil {
		return nil, errors.New("inboxsarama: NewHandler: nil inbox.HandlerFunc")
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
		Retries:         h.stats.retries.Load(),
		DeadLettered:    h.stats.dead.Load(),
		BatchFallbacks:  h.stats.fallbacks.Load(),
	}
}

// Setup implements sarama.ConsumerGroupHandler. It does nothing: per-claim
// state (topic ids, pending attempts) is read when each claim starts.
func (h *Handler) Setup(sarama.ConsumerGroupSession) error { return nil }

// Cleanup implements sarama.ConsumerGroupHandler. It does nothing.
func (h *Handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim implements sarama.ConsumerGroupHandler. It returns when the
// session ends or the claim is revoked, after the transaction in flight (if
// any) committed or rolled back; offsets are marked only after a commit.
func (h *Handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	c := newClaimRun(h, sess, claim)
	defer c.close()
	if !c.start() {
		return nil
	}
	for {
		batch, ok := c.next()
		if !ok {
			return nil
		}
		if !c.handle(batch) {
			return nil
		}
	}
}

// backoff returns the wait before retry n (n ≥ 1).
func (h *Handler) backoff(n int) time.Duration {
	d := h.opts.RetryBackoff
	for i := 1; i < n && d < h.opts.MaxRetryBackoff; i++ {
		d *= 2
	}
	d = min(d, h.opts.MaxRetryBackoff)
	// ±20% jitter, so partitions retrying together spread out.
	j := time.Duration(float64(d) * (rand.Float64()*0.4 - 0.2))
	return max(d+j, 0)
}

func (h *Handler) deadLetterTopic(source string) string {
	if h.opts.DeadLetterTopic != "" {
		return h.opts.DeadLetterTopic
	}
	return source + DeadLetterSuffixDefault
}

func isCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
