package cleanup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// Cleaner prunes pgbox tables. It is safe for concurrent use; passes of
// cleaners sharing a database (in any number of processes) run one at a time.
type Cleaner struct {
	cfg Config

	mu    sync.Mutex
	stats Stats

	// Test hooks (internal tests only): called once the lock is taken, just
	// before it is released, and after every delete batch.
	hookLocked, hookUnlock func()
	hookBatch              func()
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
	err := pgerr.WithFix(c.runOnce(ctx, &rep))
	rep.Duration = time.Since(rep.Start)
	c.record(ctx, rep, err)
	if err != nil {
		return rep, fmt.Errorf("cleanup: %w", err)
	}
	return rep, nil
}

func (c *Cleaner) runOnce(ctx context.Context, rep *Report) error {
	conn, err := c.cfg.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()

	// A lease row, not a session advisory lock, so that it works through a
	// transaction-mode pooler too (see sqlTakeLease).
	owner := newLeaseOwner()
	var took int
	if err := conn.QueryRow(ctx, sqlTakeLease, owner, leaseTTL).Scan(&took); err != nil {
		return fmt.Errorf("take the cleanup lease: %w", err)
	}
	if took == 0 {
		rep.Locked = true
		c.cfg.Logger.InfoContext(ctx, "cleanup skipped: another cleaner holds the lease")
		return nil
	}
	rep.lease = &lease{conn: conn, owner: owner}
	defer c.unlock(ctx, rep.lease)
	if c.hookLocked != nil {
		c.hookLocked()
	}

	if c.cfg.Now != nil {
		rep.Now = c.cfg.Now()
	} else if err := conn.QueryRow(ctx, sqlNow).Scan(&rep.Now); err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}

	topics, err := listTopics(ctx, conn, sqlTopics)
	if err != nil {
		return err
	}
	if c.cfg.Tables.DeadLetters != Forever {
		// Dead letters follow their topic's window, also once the topic's
		// inbox keys are gone.
		dead, err := listTopics(ctx, conn, sqlDeadTopics)
		if err != nil {
			return err
		}
		topics = slices.Compact(slices.Sorted(slices.Values(append(topics, dead...))))
	}
	// rep.Now was read before Kafka is: every key the exact rule may delete
	// is older than rep.Now − buffer, so it was written before the log start
	// offsets were read, and a topic deleted and recreated meanwhile can only
	// make them smaller (keys kept longer), never judge a newer key.
	kafka := describeTopics(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	positions := readLogStarts(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	if err := rep.lease.renew(ctx); err != nil { // Kafka may have taken a while
		return err
	}
	for _, name := range topics {
		tr := c.plan(name, kafka[name], positions[name], rep.Now)
		c.logPlan(ctx, tr)
		err := c.pruneTopic(ctx, conn, rep, &tr)
		rep.Topics = append(rep.Topics, tr)
		if err != nil {
			return err
		}
		if !tr.Skipped {
			c.cfg.Logger.DebugContext(ctx, "cleanup pruned topic", "topic", name, "deleted", tr.Deleted,
				"exact_deleted", tr.ExactDeleted, "time_deleted", tr.TimeDeleted, "would_delete", tr.WouldDelete,
				"window", tr.Window.String(), "forced", tr.Forced,
				"oldest_age", tr.OldestAge.String(), "margin", tr.Margin.String())
		}
	}

	if err := c.pruneTables(ctx, conn, rep); err != nil {
		return err
	}
	return nil
}

// leaseTTL is how long a pass's lease lasts without renewal; every delete
// batch renews it. A cleaner that dies mid-pass holds the others off for at
// most this long.
const leaseTTL = 5 * time.Minute

// errLeaseLost ends a pass whose lease expired and was taken over (the pass
// stalled for longer than leaseTTL).
var errLeaseLost = errors.New("lost the cleanup lease: the pass stalled for longer than " + leaseTTL.String() + " and another cleaner took over")

// lease is a pass's hold on the pgbox_cleanup_lease row.
type lease struct {
	conn  *pgxpool.Conn
	owner string
}

func newLeaseOwner() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// renew extends the lease, or reports that it was lost.
func (l *lease) renew(ctx context.Context) error {
	tag, err := l.conn.Exec(ctx, sqlRenewLease, l.owner, leaseTTL)
	if err != nil {
		return fmt.Errorf("renew the cleanup lease: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return nil
}

// unlock releases the lease, also when ctx was cancelled; on the pass's
// connection unless a cancellation closed it.
func (c *Cleaner) unlock(ctx context.Context, l *lease) {
	if c.hookUnlock != nil {
		c.hookUnlock()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var err error
	for range 2 { // the cancel request of an interrupted statement can land on the first try
		if l.conn.Conn().IsClosed() {
			_, err = c.cfg.Pool.Exec(ctx, sqlReleaseLease, l.owner)
		} else {
			_, err = l.conn.Exec(ctx, sqlReleaseLease, l.owner)
		}
		if err == nil {
			return
		}
	}
	c.cfg.Logger.WarnContext(ctx, "cleanup: release lease failed; it expires by itself", "error", err, "lease_ttl", leaseTTL.String())
}

func listTopics(ctx context.Context, conn *pgxpool.Conn, query string) ([]string, error) {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("list inbox topics: %w", err)
	}
	topics, err := pgxCollectStrings(rows)
	if err != nil {
		return nil, fmt.Errorf("list inbox topics: %w", err)
	}
	return topics, nil
}

// logPlan logs a topic neither rule can prune, or one whose exact rule
// could not run: at INFO when its config keeps the records forever, at WARN
// when an operator should look (Kafka unreachable, a topic not found).
func (c *Cleaner) logPlan(ctx context.Context, tr TopicReport) {
	switch {
	case tr.Skipped:
		level := slog.LevelWarn
		if !tr.Reason.Transient() {
			level = slog.LevelInfo
		}
		c.cfg.Logger.Log(ctx, level, "cleanup skipped topic", "topic", tr.Topic, "reason", string(tr.Reason), "error", tr.Err)
	case tr.OffsetsErr != nil:
		c.cfg.Logger.WarnContext(ctx, "cleanup: no log start offsets, keys of known position kept", "topic", tr.Topic, "error", tr.OffsetsErr)
	case !tr.Timed:
		c.cfg.Logger.InfoContext(ctx, "cleanup: no time window, exact rule only", "topic", tr.Topic, "reason", string(tr.Reason))
	}
}

// plan turns what Kafka said about a topic into the rules that apply: the
// exact rule where Kafka gave log start offsets, the time rule with its
// window and cutoff where the config (or a forced window) gives one.
func (c *Cleaner) plan(name string, k kafkaTopic, pos topicPositions, now time.Time) TopicReport {
	buffer, forced := c.cfg.topic(name)
	tr := TopicReport{
		Topic:         name,
		RetentionMs:   k.retentionMs,
		SegmentMs:     k.segmentMs,
		CleanupPolicy: k.policy,
		TopicID:       pos.id,
		LogStarts:     pos.starts,
		OffsetsErr:    pos.err,
		Exact:         len(pos.starts) > 0,
		ExactCutoff:   now.Add(-buffer),
		Reason:        k.reason,
		Err:           k.err,
	}
	if k.reason == "" {
		w, ok := addNoOverflow(k.retention, k.segment, buffer)
		if !ok {
			// A window past what a Duration holds: pgbox cannot compute a
			// cutoff, so the time rule keeps the keys (Kafka keeps the
			// records for centuries anyway).
			tr.Reason = ReasonConfigUnreadable
			tr.Err = fmt.Errorf("topic %q: retention.ms %d + segment.ms %d + buffer %v overflows the cutoff arithmetic", name, k.retentionMs, k.segmentMs, buffer)
		} else {
			tr.Window = w
		}
	}
	switch {
	case tr.Reason == "":
		if forced > tr.Window {
			tr.Window, tr.Forced = forced, true
		}
	case forced > 0:
		tr.Window, tr.Forced = forced, true
	default:
		tr.Skipped = !tr.Exact
		return tr
	}
	tr.Timed = true
	tr.Cutoff = now.Add(-tr.Window)
	return tr
}

// addNoOverflow sums non-negative durations, reporting false on overflow.
func addNoOverflow(ds ...time.Duration) (time.Duration, bool) {
	var sum time.Duration
	for _, d := range ds {
		if d > time.Duration(1<<63-1)-sum {
			return 0, false
		}
		sum += d
	}
	return sum, true
}

func (c *Cleaner) pruneTopic(ctx context.Context, conn *pgxpool.Conn, rep *Report, tr *TopicReport) error {
	if tr.Exact {
		if err := c.pruneExact(ctx, conn, rep, tr); err != nil {
			return fmt.Errorf("delete keys of topic %q past its log start offsets: %w", tr.Topic, err)
		}
	}
	if tr.Timed {
		if err := c.pruneTimed(ctx, conn, rep, tr); err != nil {
			return fmt.Errorf("delete keys of topic %q past the time cutoff: %w", tr.Topic, err)
		}
	}
	tr.Deleted = tr.ExactDeleted + tr.TimeDeleted
	tr.WouldDelete = tr.ExactWouldDelete + tr.TimeWouldDelete

	var oldest pgtype.Timestamptz
	err := conn.QueryRow(ctx, sqlOldestInbox, tr.Topic).Scan(&oldest)
	switch {
	case err == nil:
		tr.Oldest = oldest.Time
		tr.OldestAge = rep.Now.Sub(oldest.Time)
		if tr.Timed {
			tr.Margin = tr.Window - tr.OldestAge
		}
	case errors.Is(err, errNoRows):
	default:
		return fmt.Errorf("read oldest key of topic %q: %w", tr.Topic, err)
	}
	return nil
}

// pruneExact applies the exact rule, partition by partition, along
// pgbox_inbox_position_idx: only the keys behind the log start are read.
func (c *Cleaner) pruneExact(ctx context.Context, conn *pgxpool.Conn, rep *Report, tr *TopicReport) error {
	for _, p := range slices.Sorted(maps.Keys(tr.LogStarts)) {
		start := tr.LogStarts[p]
		if start <= 0 {
			continue // nothing is behind it (a compact-only or young topic)
		}
		if c.cfg.DryRun {
			var n int64
			if err := conn.QueryRow(ctx, sqlCountInboxExact, tr.Topic, p, start, tr.ExactCutoff).Scan(&n); err != nil {
				return fmt.Errorf("partition %d: %w", p, err)
			}
			tr.ExactWouldDelete += n
			continue
		}
		args := []any{tr.Topic, p, int64(math.MinInt64), start, tr.ExactCutoff, c.cfg.BatchSize}
		gone, err := deleteLoop[pgtype.Int8](ctx, c, conn, rep, tr.Topic, sqlDeleteInboxExact, sqlDeleteInboxExactSkipLocked, args, 2)
		tr.ExactDeleted += gone
		if err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
	}
	return nil
}

// pruneTimed applies the time rule, oldest first along
// pgbox_inbox_topic_age_idx: to the keys of unknown position, or to every
// key under a forced window.
func (c *Cleaner) pruneTimed(ctx context.Context, conn *pgxpool.Conn, rep *Report, tr *TopicReport) error {
	all := tr.Forced
	if c.cfg.DryRun {
		// Keys the exact rule would take are not counted twice.
		parts := slices.Sorted(maps.Keys(tr.LogStarts))
		starts := make([]int64, len(parts))
		for i, p := range parts {
			starts[i] = tr.LogStarts[p]
		}
		return conn.QueryRow(ctx, sqlCountInboxTimed, tr.Topic, tr.Cutoff, all, parts, starts, tr.ExactCutoff).Scan(&tr.TimeWouldDelete)
	}
	lower := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	args := []any{tr.Topic, lower, tr.Cutoff, c.cfg.BatchSize, all}
	gone, err := deleteLoop[pgtype.Timestamptz](ctx, c, conn, rep, tr.Topic, sqlDeleteInboxBatch, sqlDeleteInboxBatchSkipLocked, args, 1)
	tr.TimeDeleted += gone
	return err
}

// deleteLoop runs delete batches of q until one finds fewer than BatchSize
// rows. q returns how many rows its batch selected, the batch's last value
// of the keyset it walks (of type T), and how many rows it deleted; that
// value becomes args[next], the next batch's lower bound, so the dead index
// entries of earlier batches are not scanned again. A batch that meets a
// row locked by a writer is retried with qSkipLocked.
func deleteLoop[T any](ctx context.Context, c *Cleaner, conn *pgxpool.Conn, rep *Report, topic, q, qSkipLocked string, args []any, next int) (int64, error) {
	var total int64
	for {
		var found, gone int64
		var last T
		err := c.batch(ctx, rep, func() error {
			del := func(q string) error {
				return deleteTx(ctx, conn, func(tx pgx.Tx) error {
					return tx.QueryRow(ctx, q, args...).Scan(&found, &last, &gone)
				})
			}
			err := del(q)
			if pgerr.IsLockTimeout(err) {
				c.cfg.Logger.InfoContext(ctx, "cleanup: a key is locked by a writer, retrying the batch without it", "topic", topic)
				err = del(qSkipLocked)
			}
			return err
		})
		if err != nil {
			return total, err
		}
		total += gone
		rep.Deleted += gone
		if found < int64(c.cfg.BatchSize) {
			return total, nil
		}
		args[next] = last
		if err := c.pause(ctx); err != nil {
			return total, err
		}
	}
}

// deleteTx runs f in a transaction that commits without waiting for its WAL
// to reach disk: a delete lost in a crash is harmless (the rows are deleted
// again by the next pass), and the cleaner's commits then cost concurrent
// writers nothing in flush waits.
func deleteTx(ctx context.Context, conn *pgxpool.Conn, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlBatchSettings); err != nil {
			return err
		}
		return f(tx)
	})
}

// batch runs one delete transaction and times it.
func (c *Cleaner) batch(ctx context.Context, rep *Report, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if rep.lease != nil {
		if err := rep.lease.renew(ctx); err != nil {
			return err
		}
	}
	t0 := time.Now()
	err := f()
	d := time.Since(t0)
	rep.Batches++
	rep.MaxBatch = max(rep.MaxBatch, d)
	if c.hookBatch != nil {
		c.hookBatch()
	}
	return err
}

func (c *Cleaner) pause(ctx context.Context) error {
	if c.cfg.Pause <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(c.cfg.Pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// record updates Stats and logs the pass.
func (c *Cleaner) record(ctx context.Context, rep Report, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.stats
	if rep.Locked {
		s.PassesLocked++
		return
	}
	s.Passes++
	if err != nil && !errors.Is(err, context.Canceled) {
		s.PassErrors++
	}
	s.Deleted += rep.Deleted
	s.LastPass, s.LastDuration = rep.Start, rep.Duration
	s.MaxBatch = max(s.MaxBatch, rep.MaxBatch)
	for _, t := range rep.Topics {
		ts := s.Topics[t.Topic]
		ts.Deleted += t.Deleted
		ts.ExactDeleted += t.ExactDeleted
		ts.TimeDeleted += t.TimeDeleted
		ts.Reason, ts.Skipped, ts.Last = "", t.Skipped, t
		if t.Skipped {
			s.TopicsSkipped++
			ts.Reason = t.Reason
		}
		ts.Window, ts.OldestAge, ts.Margin = t.Window, t.OldestAge, t.Margin
		s.Topics[t.Topic] = ts
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

var errNoRows = pgx.ErrNoRows

func pgxCollectStrings(rows pgx.Rows) ([]string, error) {
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
