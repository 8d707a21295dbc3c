package relay

// Hostile review of 81527e6 (homes.go: a target waits for its home's
// connection while a home-mate's statement has had it less than homeTurn).
// White-box attacks; the end-to-end ones are in homesturn_test.go.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Attack: a home-mate whose statements are each shorter than homeTurn
// (150 ms) and which takes the home's connection again as soon as it gave
// it back (a target claiming batch after batch on a table briefly locked
// again and again). A waiter woken by keep finds the connection out again,
// with a fresh outAt, and waits another homeTurn: the per-statement bound
// was no bound on the waiter's wait.
//
// Must hold: a waiter gets a connection (the home's or the pool's) within
// about homeTurn of asking, whatever its home-mate does.
func TestHomesTurnWaitIsBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pool := poolOf(t, 4)
	h := newHomes(pool)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	c0, err := pool.Acquire(ctx)
	require.NoError(t, err)
	require.True(t, h.keep(0, c0))

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { // the slow home-mate
		for ctx.Err() == nil {
			c, err := h.acquire(ctx, pool, 0)
			if err != nil {
				return
			}
			_, _ = c.Exec(context.Background(), `SELECT pg_sleep(0.15)`)
			if !h.keep(0, c) {
				c.Release()
			}
		}
	})
	time.Sleep(50 * time.Millisecond)
	var worst time.Duration
	for range 8 {
		start := time.Now()
		c, err := h.acquire(ctx, pool, 0)
		require.NoError(t, err)
		worst = max(worst, time.Since(start))
		if !h.keep(0, c) {
			c.Release()
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Less(t, worst, homeTurn+100*time.Millisecond,
		"a waiter waited %s for a connection: past homeTurn (%s) while its home-mate ran one short statement after another", worst, homeTurn)
}

// Attack: the watch's home connection's backend is terminated between
// two of its rounds (pg_terminate_backend). The round that meets it fails;
// the connection must leave the watch's home (not be kept dead for
// homeIdle or homeFor), and the next round runs on a fresh one that
// becomes the watch's.
func TestHomesTurnWatchConnectionDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolOf(t, 6)
	h := newHomes(pool)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	round := func() (int32, error) {
		c, err := h.acquire(ctx, pool, watchHome)
		if err != nil {
			return 0, err
		}
		defer func() {
			if !h.keep(watchHome, c) {
				c.Release()
			}
		}()
		var pid int32
		err = c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
		return pid, err
	}
	p0, err := round()
	require.NoError(t, err)
	p, err := round()
	require.NoError(t, err)
	require.Equal(t, p0, p, "the watch keeps to its home's backend")
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, p0)
	require.NoError(t, err)
	failed := 0
	for range 3 {
		if p, err = round(); err == nil {
			break
		}
		failed++
	}
	require.NoError(t, err)
	require.LessOrEqual(t, failed, 1, "only the round that met the dead backend fails")
	require.NotEqual(t, p0, p, "a fresh backend")
	again, err := round()
	require.NoError(t, err)
	require.Equal(t, p, again, "which is the watch's home now")
}
