package consume

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/backoff"
)

// Claim is one partition as a Kafka client hands it to the loop, R being the
// client's record type. The loop reads Records until Context is done or the
// channel is closed (the partition revoked), and calls Mark with the last
// record of each committed transaction, from the goroutine that runs Run.
type Claim[R any] interface {
	Topic() string
	Partition() int32
	// InitialOffset is the offset the claim starts at (the group's
	// committed offset): attempt rows below it are stale.
	InitialOffset() int64
	// TopicID is the topic's id, "" when ids are off or unknown.
	TopicID(ctx context.Context) (string, error)
	// Context ends when no new transaction may start (session over,
	// partition revoked, consumer stopping).
	Context() context.Context
	Records() <-chan R
	// Message is the inbox's view of a record (TopicID left to the loop).
	Message(R) inbox.Message
	// Mark records that every record up to r committed.
	Mark(r R)
}

// Loop is the state the claims of one adapter share: settings and counters.
type Loop struct {
	pool *pgxpool.Pool
	ib   *inbox.Inbox
	fn   inbox.HandlerFunc
	cfg  Config
	log  *slog.Logger

	stats struct {
		processed, duplicates, failures, transient, operator, retries, dead, fallbacks, gaps atomic.Uint64
	}
}

// New checks the adapter's arguments and returns its loop. cfg is as the
// user set it; New validates it and fills in the defaults.
func New(pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, cfg Config, ctor string) (*Loop, error) {
	if pool == nil {
		return nil, fmt.Errorf("%s: %s: nil pool (pass the *pgxpool.Pool of the service's database)", cfg.Name, ctor)
	}
	if ib == nil {
		return nil, fmt.Errorf("%s: %s: nil *inbox.Inbox (make one with inbox.New)", cfg.Name, ctor)
	}
	if err := handlerOf(fn, cfg, ctor); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	return &Loop{pool: pool, ib: ib, fn: fn, cfg: cfg, log: cfg.Logger}, nil
}

// Config returns the settings with defaults filled in.
func (l *Loop) Config() Config { return l.cfg }

// Stats returns the counters so far.
func (l *Loop) Stats() inbox.ConsumerStats {
	return inbox.ConsumerStats{
		Processed:       l.stats.processed.Load(),
		Duplicates:      l.stats.duplicates.Load(),
		Failures:        l.stats.failures.Load(),
		TransientErrors: l.stats.transient.Load(),
		OperatorErrors:  l.stats.operator.Load(),
		Retries:         l.stats.retries.Load(),
		DeadLettered:    l.stats.dead.Load(),
		BatchFallbacks:  l.stats.fallbacks.Load(),
		Gaps:            l.stats.gaps.Load(),
	}
}

// Run processes claim until its context ends, it is revoked, or an error
// that needs an operator ends it; that error (wrapping
// inbox.ErrNeedsOperator) is what Run returns. Offsets are marked only after
// a commit, and the transaction in flight when the claim's context ends may
// commit within DrainTimeout.
func Run[R any](l *Loop, claim Claim[R]) error {
	c := newClaimRun(l, claim)
	defer c.close()
	c.run()
	return c.fatal
}

// backoff returns the wait before retry n (n ≥ 1).
func (l *Loop) backoff(n int) time.Duration {
	return backoff.Delay(l.cfg.RetryBackoff, l.cfg.MaxRetryBackoff, n)
}

func (l *Loop) deadLetterTopic(source string) string {
	if l.cfg.DeadLetterTopic != "" {
		return l.cfg.DeadLetterTopic
	}
	return source + inbox.DeadLetterSuffixDefault
}
