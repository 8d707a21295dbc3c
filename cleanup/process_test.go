package cleanup

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
)

// The real inbox.Process, from several goroutines, on new messages and on
// redeliveries of the very keys a pass is deleting: no call fails, each
// redelivery is either a duplicate (the key was still there) or processed
// (it was gone), and no call waits longer than a delete batch takes.
func TestProcessDuringCleanup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, "orders", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByOffset()})
	require.NoError(t, err)

	const expired = 20_000
	key, err := ib.Key(inbox.Message{Topic: "orders", Partition: 0, Offset: 7})
	require.NoError(t, err)
	require.Equal(t, "orders/0/7", key, "the bulk load below writes ByOffset keys")
	// Positions unknown (as written before migration 00070): the time rule
	// decides them, and a duplicate's update must still save them.
	b.exec(t, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
		SELECT 'payments-svc', 'orders/0/' || g, 'orders', 0, g, now() - interval '100 hours', NULL
		FROM generate_series(1, $1) g`, expired)
	b.exec(t, `ANALYZE pgbox_inbox`)

	process := func(w int, stop <-chan struct{}, minOps int) (lat []time.Duration, redelivered, dups int, err error) {
		r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
		for i := 0; ; i++ {
			if i >= minOps {
				select {
				case <-stop:
					return lat, redelivered, dups, nil
				default:
				}
			}
			m := inbox.Message{Topic: "orders", Partition: int32(1 + w), Offset: int64(i), Value: []byte("v")}
			if i%2 == 1 {
				m = inbox.Message{Topic: "orders", Partition: 0, Offset: int64(1 + r.IntN(expired))}
				redelivered++
			}
			t0 := time.Now()
			var res inbox.Result
			err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				var err error
				res, err = ib.Process(ctx, tx, m, func(context.Context, pgx.Tx, inbox.Message) error { return nil })
				return err
			})
			lat = append(lat, time.Since(t0))
			if err != nil {
				return lat, redelivered, dups, fmt.Errorf("process %s/%d/%d: %w", m.Topic, m.Partition, m.Offset, err)
			}
			if res.Duplicate && i%2 == 1 {
				dups++
			}
		}
	}
	run := func(stop <-chan struct{}, minOps int) (lat []time.Duration, redelivered, dups int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		var errs []error
		for w := range 4 {
			wg.Go(func() {
				l, r, d, err := process(w, stop, minOps)
				mu.Lock()
				lat, redelivered, dups = append(lat, l...), redelivered+r, dups+d
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err, "Process must not fail during cleanup")
		}
		return lat, redelivered, dups
	}

	// Three attempts at the latency relation: see TestWritersNotBlocked.
	var redelivered, dups, baseRedelivered int
	var rep Report
	c := b.cleaner(t, Config{BatchSize: 1000})
	for attempt := 1; ; attempt++ {
		if attempt > 1 { // expire the same keys again
			b.exec(t, `DELETE FROM pgbox_inbox WHERE partition = 0`)
			b.exec(t, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
				SELECT 'payments-svc', 'orders/0/' || g, 'orders', 0, g, now() - interval '100 hours', NULL
				FROM generate_series(1, $1) g`, expired)
		}
		closed := make(chan struct{})
		close(closed)
		// Redeliveries refresh their keys (a duplicate moves its key's age
		// forward, a processed one inserts it anew): none of those is expired
		// any more, before the pass or during it.
		var base []time.Duration
		base, baseRedelivered, _ = run(closed, 100)

		stop := make(chan struct{})
		var runErr error
		go func() {
			defer close(stop)
			rep, runErr = c.RunOnce(ctx)
		}()
		var during []time.Duration
		during, redelivered, dups = run(stop, 1)
		require.NoError(t, runErr)
		require.GreaterOrEqual(t, rep.Deleted, int64(expired-redelivered-baseRedelivered))
		require.LessOrEqual(t, rep.Deleted, int64(expired))
		t.Logf("attempt %d: Process: max %v without cleanup; during: %d calls, %d redeliveries (%d duplicates), max %v; %d batches, longest %v",
			attempt, slices.Max(base), len(during), redelivered, dups, slices.Max(during), rep.Batches, rep.MaxBatch)
		if slices.Max(during) <= 2*(rep.MaxBatch+slices.Max(base)) {
			break
		}
		require.Less(t, attempt, 3, "a Process call waited longer than a delete batch takes, in every attempt")
	}

	// Every redelivered key is fresh now (processed after its deletion, or
	// refreshed by its duplicate delivery) and survives the next pass.
	rep, err = c.RunOnce(ctx)
	require.NoError(t, err)
	var left int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox WHERE partition = 0`).Scan(&left))
	require.Zero(t, rep.Deleted, "only keys processed during the pass are left, all fresh")
	require.LessOrEqual(t, left, redelivered+baseRedelivered)
}
