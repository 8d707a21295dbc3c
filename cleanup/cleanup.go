package cleanup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// A pass, file by file: this file is the Cleaner's lifecycle (New, Run,
// RunOnce, Stats); pass.go runs one pass, which owns its connection and its
// lease (lease.go); plan.go decides which rules apply to a topic; delete.go
// deletes by them in short batches; tables.go prunes the other tables.

// Cleaner prunes pgbox tables. It is safe for concurrent use; passes of
// cleaners sharing a database (in any number of processes) run one at a time.
type Cleaner struct {
	cfg Config

	mu    sync.Mutex
	stats Stats
	walks map[walkKey]walkMark // where each walk starts next pass (walk.go)

	// Test hooks (internal tests only): called once the lock is taken, just
	// before it is released, and after every delete batch.
	hookLocked, hookUnlock func()
	hookBatch              func()
	hookExactFrom          func(topic string, part int32, from int64)
}

// New validates cfg and returns a Cleaner.
func New(cfg Config) (*Cleaner, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("cleanup: invalid config: %w", err)
	}
	return &Cleaner{cfg: cfg.withDefaults(), stats: Stats{Topics: map[string]TopicStats{}}}, nil
}

// ErrNeedsOperator is in the error RunOnce and Run return when the database
// fails in a way retrying cannot fix: pgbox's tables missing (migrations not
// run), a revoked grant, failed authentication. The error names the fix. It
// is the same value as inbox.ErrNeedsOperator and relay.ErrNeedsOperator.
var ErrNeedsOperator = pgerr.ErrNeedsOperator

// retryBackoffMin is the first wait after a pass failed on a retryable
// database error; it doubles up to Config.Interval.
const retryBackoffMin = time.Second

// Run runs a pass now and then every Config.Interval until ctx is done, and
// then returns nil. Errors of a pass are logged and counted in Stats. A pass
// that failed on a database error retrying can fix (connection lost,
// failover, lock timeout) is retried with backoff, sooner than Interval; one
// that needs an operator (ErrNeedsOperator: missing tables, a revoked grant)
// ends Run with that error. Other errors wait for the next scheduled pass.
func (c *Cleaner) Run(ctx context.Context) error {
	b := backoff.Backoff{Base: retryBackoffMin, Limit: c.cfg.Interval}
	for {
		rep, err := c.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			c.logFailed(ctx, rep, err)
		}
		wait := c.cfg.Interval
		switch {
		case err == nil:
			b.Reset()
		case errors.Is(err, ErrNeedsOperator):
			return err
		case pgerr.IsRetryable(err):
			wait = min(b.Next(), c.cfg.Interval)
		}
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// RunOnce runs one pass: for every topic with keys in pgbox_inbox, it reads
// the partitions' log start offsets and the topic's retention from Kafka and
// deletes the keys Kafka can no longer redeliver (the exact rule; the time
// rule for keys of unknown position), in batches; then it prunes the other
// pgbox tables by their configured retention. When another cleaner is
// running, it returns at once with Report.Locked set and a nil error.
//
// Kafka problems are not errors: the topics concerned are skipped and listed
// with a Reason. A database error ends the pass with an error; what was
// deleted before stays deleted (each batch is its own transaction) and is in
// the Report. A database error retrying cannot fix (missing tables, a revoked
// grant) wraps ErrNeedsOperator and names the fix. A failed pass is returned,
// not logged (Run logs it), so a caller that prints or logs the error does so
// once. When ctx is cancelled the pass stops within one batch and returns
// ctx's error.
func (c *Cleaner) RunOnce(ctx context.Context) (Report, error) {
	rep := Report{Start: time.Now(), DryRun: c.cfg.DryRun}
	err := pgerr.WithFix(c.runPass(ctx, &rep))
	rep.Duration = time.Since(rep.Start)
	c.record(ctx, rep, err)
	if err != nil {
		return rep, fmt.Errorf("cleanup: %w", err)
	}
	return rep, nil
}

// record updates Stats and logs the pass.
func (c *Cleaner) record(ctx context.Context, rep Report, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Add(rep, err)
	if rep.Locked {
		return
	}
	switch {
	case err == nil:
		c.cfg.Logger.InfoContext(ctx, "cleanup pass done", passAttrs(rep)...)
	case errors.Is(err, context.Canceled):
		c.cfg.Logger.InfoContext(ctx, "cleanup pass cancelled", passAttrs(rep)...)
	}
}

// logFailed logs a pass that failed (Run's passes; RunOnce returns the error
// to its caller instead).
func (c *Cleaner) logFailed(ctx context.Context, rep Report, err error) {
	attrs := passAttrs(rep)
	if errors.Is(err, ErrNeedsOperator) {
		c.cfg.Logger.ErrorContext(ctx, "cleanup pass failed: the database needs an operator",
			append(attrs, "fix", pgerr.Fix(err), "error", err)...)
		return
	}
	c.cfg.Logger.ErrorContext(ctx, "cleanup pass failed", append(attrs, "error", err)...)
}

func passAttrs(rep Report) []any {
	return []any{
		"deleted", rep.Deleted, "topics", len(rep.Topics), "skipped", len(rep.Skipped()),
		"batches", rep.Batches, "max_batch", rep.MaxBatch.String(), "duration", rep.Duration.String(), "dry_run", rep.DryRun,
	}
}

// Stats returns the cleaner's counters.
func (c *Cleaner) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Topics = maps.Clone(c.stats.Topics)
	return s
}
