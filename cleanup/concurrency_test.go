package cleanup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// Two cleaners on separate pools (as two processes would be): while one holds
// the lock the other skips, deleting nothing, and says so.
func TestOneCleanerAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.bulkKeys(t, "t", 50, time.Now().Add(-100*time.Hour))

	otherPool, err := pgxpool.New(ctx, b.db.URL)
	require.NoError(t, err)
	t.Cleanup(otherPool.Close)

	first := b.cleaner(t, Config{})
	second := b.cleaner(t, Config{Pool: otherPool})
	holding, release := make(chan struct{}), make(chan struct{})
	first.hookLocked = func() { close(holding); <-release }

	var firstRep Report
	var firstErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		firstRep, firstErr = first.RunOnce(ctx)
	}()
	<-holding

	rep, err := second.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, rep.Locked)
	require.Zero(t, rep.Deleted)
	require.Empty(t, rep.Topics)
	require.Equal(t, 50, b.count(t), "the skipped cleaner deleted nothing")
	require.Equal(t, int64(1), second.Stats().PassesLocked)
	require.Zero(t, second.Stats().Passes)

	// A cleaner of another schema in the same database is not excluded.
	other := setup(t)
	other.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	other.bulkKeys(t, "t", 5, time.Now().Add(-100*time.Hour))
	rep, err = other.cleaner(t, Config{}).RunOnce(ctx)
	require.NoError(t, err)
	require.False(t, rep.Locked)
	require.Equal(t, int64(5), rep.Deleted)

	close(release)
	<-done
	require.NoError(t, firstErr)
	require.False(t, firstRep.Locked)
	require.Equal(t, int64(50), firstRep.Deleted)
	require.Zero(t, b.count(t))

	// Once released, the other one runs.
	rep, err = second.RunOnce(ctx)
	require.NoError(t, err)
	require.False(t, rep.Locked)
}

// Many cleaners started at once, again and again: every key is deleted exactly
// once, no pass fails, and passes that ran never overlapped.
func TestConcurrentCleanersRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	var running atomic.Int32
	var overlap atomic.Bool
	// The cleaners' clock moves an hour a round, and each round's keys are
	// received between the last round's time-rule cutoff and this one's
	// (window 26h), as an inbox stamps them: a cleaner's time-rule walk
	// starts at its last cutoff (walk.go).
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	cleaners := make([]*Cleaner, 3)
	for i := range cleaners {
		cleaners[i] = b.cleaner(t, Config{BatchSize: 7, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
		cleaners[i].hookBatch = func() {
			if running.Load() != 1 {
				overlap.Store(true)
			}
		}
		cleaners[i].hookLocked = func() { running.Add(1) }
		cleaners[i].hookUnlock = func() { running.Add(-1) }
	}
	for round := range 10 {
		now := time.Unix(0, clock.Add(int64(time.Hour)))
		b.bulkKeys(t, "t", 20, now.Add(-26*time.Hour-30*time.Minute))
		var wg sync.WaitGroup
		var deleted, ran atomic.Int64
		errs := make([]error, len(cleaners))
		for i, c := range cleaners {
			wg.Go(func() {
				rep, err := c.RunOnce(ctx)
				if !rep.Locked {
					ran.Add(1)
				}
				errs[i] = err
				deleted.Add(rep.Deleted)
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.GreaterOrEqual(t, ran.Load(), int64(1))
		require.Equal(t, int64(20), deleted.Load(), "round %d", round)
		require.Zero(t, b.count(t))
	}
	require.False(t, overlap.Load(), "two passes ran at the same time")
}

// Cancelling ctx stops a pass within one batch, even in a long pause; what
// was deleted stays deleted and the error is ctx's.
func TestCancelStopsPromptly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.bulkKeys(t, "t", 100, time.Now().Add(-100*time.Hour))

	for _, where := range []string{"in pause", "before next batch"} {
		ctx, cancel := context.WithCancel(context.Background())
		c := b.cleaner(t, Config{BatchSize: 10, Pause: time.Hour})
		batches := make(chan struct{}, 100)
		c.hookBatch = func() {
			if where == "before next batch" {
				cancel()
			}
			batches <- struct{}{}
		}
		errc := make(chan error, 1)
		var rep Report
		go func() {
			var err error
			rep, err = c.RunOnce(ctx)
			errc <- err
		}()
		<-batches
		cancel() // a pause of an hour: only cancellation can end it
		err := <-errc
		require.ErrorIs(t, err, context.Canceled, where)
		require.Equal(t, int64(10), rep.Deleted, where)
		require.Equal(t, 1, rep.Batches, where)
		require.Len(t, batches, 0, where)
		require.Zero(t, c.Stats().PassErrors, "cancellation is not a pass error")
	}
	require.Equal(t, 80, b.count(t))

	// The lock was released despite the cancellation.
	rep, err := b.cleaner(t, Config{}).RunOnce(context.Background())
	require.NoError(t, err)
	require.False(t, rep.Locked)
	require.Equal(t, int64(80), rep.Deleted)
}

func TestRunOnSchedule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.bulkKeys(t, "t", 10, time.Now().Add(-100*time.Hour))
	c := b.cleaner(t, Config{Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	testutil.Eventually(t, 30*time.Second, "three passes", func() bool { return c.Stats().Passes >= 3 })
	cancel()
	require.NoError(t, <-errc, "Run returns nil when ctx is cancelled")
	st := c.Stats()
	require.Equal(t, int64(10), st.Deleted)
	require.Zero(t, st.PassErrors)
	require.Zero(t, b.count(t))
}

// Inbox-style writers (INSERT ... ON CONFLICT DO NOTHING in short
// transactions, on new keys and on the very keys being deleted) run while a
// pass deletes: none fails, and none waits longer than a delete batch takes.
// Latencies are compared with the same writers' latencies without cleanup,
// measured just before in the same attempt, and with the pass's longest
// batch. On a loaded machine a writer can be descheduled for longer than that
// by chance, so the relation gets three attempts; a cleaner that blocked
// writers for more than a batch would fail all three.
func TestWritersNotBlocked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	const expired = 20_000
	const writers = 4

	for attempt := 1; ; attempt++ {
		old := time.Now().Add(-100*time.Hour - time.Duration(attempt)*time.Minute)
		b.bulkKeys(t, "t", expired, old)
		oldText := pgText(t, b.db, old)
		oldKey := func(i int) string { return fmt.Sprintf("t-%s-%d", oldText, i) }
		_, err := b.db.Pool.Exec(ctx, `ANALYZE pgbox_inbox`)
		require.NoError(t, err)

		runWriters := func(stop <-chan struct{}, minOps int) ([]time.Duration, error) {
			var mu sync.Mutex
			var lat []time.Duration
			var firstErr error
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
					for i := 0; ; i++ {
						if i >= minOps {
							select {
							case <-stop:
								return
							default:
							}
						}
						key := fmt.Sprintf("new-%d-%d-%d", w, time.Now().UnixNano(), i)
						if i%2 == 1 {
							key = oldKey(1 + r.IntN(expired)) // a redelivery of an expiring key
						}
						t0 := time.Now()
						err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
							_, err := tx.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset")
								VALUES ('svc', $1, 't', 0, $2) ON CONFLICT DO NOTHING`, key, i)
							return err
						})
						d := time.Since(t0)
						mu.Lock()
						lat = append(lat, d)
						if err != nil && firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			return lat, firstErr
		}

		closed := make(chan struct{})
		close(closed)
		base, err := runWriters(closed, 200)
		require.NoError(t, err)

		c := b.cleaner(t, Config{BatchSize: 1000})
		stop := make(chan struct{})
		var rep Report
		var runErr error
		go func() {
			defer close(stop)
			rep, runErr = c.RunOnce(ctx)
		}()
		during, err := runWriters(stop, 1)
		require.NoError(t, err, "writers must see no errors during cleanup")
		require.NoError(t, runErr)
		require.GreaterOrEqual(t, rep.Batches, expired/1000)
		require.Greater(t, rep.Deleted, int64(expired/2))

		maxBase, maxDuring := slices.Max(base), slices.Max(during)
		t.Logf("attempt %d: writers: %d ops without cleanup, max %v; %d ops during cleanup, max %v; %d batches, longest %v",
			attempt, len(base), maxBase, len(during), maxDuring, rep.Batches, rep.MaxBatch)
		// A writer can wait for one batch to commit, on top of its own work; the
		// factor 2 absorbs scheduling noise.
		if maxDuring <= 2*(rep.MaxBatch+maxBase) {
			return
		}
		require.Less(t, attempt, 3, "a writer waited longer than a delete batch takes, in every attempt")
	}
}

func pgText(t *testing.T, db *testdb.DB, ts time.Time) string {
	t.Helper()
	var s string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT $1::timestamptz::text`, ts).Scan(&s))
	return s
}

// A transaction holding an expired key locked (an application's own UPDATE)
// does not stall the pass: the batch is retried without that key, which the
// next pass deletes.
func TestLockedKeyIsSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	old := time.Now().Add(-100 * time.Hour)
	b.bulkKeys(t, "t", 25, old)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var locked string
	require.NoError(t, tx.QueryRow(ctx,
		`UPDATE pgbox_inbox SET result = 'x' WHERE ctid = (SELECT ctid FROM pgbox_inbox ORDER BY key LIMIT 1 OFFSET 12) RETURNING key`).Scan(&locked))

	c := b.cleaner(t, Config{BatchSize: 10})
	rep, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(24), rep.Deleted)
	tr, _ := rep.Topic("t")
	require.Less(t, tr.Margin, time.Duration(0), "the locked expired key remains, and the report shows it")
	var left []string
	rows, err := b.db.Pool.Query(ctx, `SELECT key FROM pgbox_inbox`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{locked}, left)

	require.NoError(t, tx.Commit(ctx))
	rep, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.Deleted)
	require.Zero(t, b.count(t))
}

// A statement stuck behind a table lock (a migration, VACUUM FULL) is
// cancelled with ctx, and the cleanup lock does not outlive the pass.
func TestCancelBlockedStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.bulkKeys(t, "t", 10, time.Now().Add(-100*time.Hour))

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE pgbox_inbox IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	c := b.cleaner(t, Config{})
	runCtx, cancel := context.WithCancel(ctx)
	c.hookLocked = func() {
		// Cancel once the pass waits on the table lock.
		go func() {
			for {
				var waiting bool
				err := b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'pgbox_inbox'::regclass AND NOT granted)`).Scan(&waiting)
				if err != nil || waiting {
					cancel()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	_, err = c.RunOnce(runCtx)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, tx.Rollback(ctx))

	// When the cancellation closed the session, the server drops its locks
	// a moment later: the next pass may find it held just once or twice.
	next := b.cleaner(t, Config{})
	var rep Report
	testutil.Eventually(t, 30*time.Second, "the cancelled pass's cleanup lock to go", func() bool {
		rep, err = next.RunOnce(ctx)
		require.NoError(t, err)
		return !rep.Locked
	})
	require.Equal(t, int64(10), rep.Deleted)
}
