package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// A target's statements keep to its home's connection (one backend per
// home, targets of one home sharing it), a home gives its connection back
// to the pool once unused for homeIdle or when closed, and a home whose
// backend died takes a fresh connection after one failed statement.
func TestHomesKeepTargetsOnTheirConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolOf(t, 4)
	require.Nil(t, newHomes(poolOf(t, 3)), "a pool of fewer than four connections has no homes")

	h := newHomes(pool)
	require.Len(t, h.slots, 2, "MaxConns - 2 homes")
	t.Cleanup(func() { h.tidy(time.Now(), true) }) // before pool.Close, which waits for them
	acquired := func(n int32, msg string) {
		t.Helper()
		// A connection released closed is destroyed in the background:
		// counted as acquired until then.
		require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == n }, 5*time.Second, 10*time.Millisecond,
			"%s: %d acquired", msg, pool.Stat().AcquiredConns())
	}
	var dbs []*db
	for range 3 {
		d := newDB(pool, testdb.New(t).Schema)
		d.homes, d.home = h, h.assign()
		dbs = append(dbs, d)
	}
	require.Equal(t, []int{0, 1, 0}, []int{dbs[0].home, dbs[1].home, dbs[2].home}, "targets spread over the homes in turn")
	pid := func(d *db) (int32, error) {
		var p int32
		err := d.queryRow(ctx, `SELECT pg_backend_pid()`, nil, &p)
		return p, err
	}
	pids := map[int]int32{}
	for round := range 5 {
		for i, d := range dbs {
			p, err := pid(d)
			require.NoError(t, err)
			if round == 0 && i < 2 {
				pids[d.home] = p
			}
			require.Equal(t, pids[d.home], p, "round %d: target %d ran on its home's backend", round, i)
		}
	}
	require.NotEqual(t, pids[0], pids[1], "each home its own backend")
	// A begin (a transaction) runs there too.
	var inTx int32
	require.NoError(t, dbs[1].begin(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&inTx) }))
	require.Equal(t, pids[1], inTx, "a transaction runs on the home's backend")
	acquired(2, "the homes hold their connections between statements")

	// Unused for homeIdle: back to the pool.
	h.tidy(time.Now().Add(homeIdle), false)
	acquired(0, "unused homes gave their connections back")

	// A home's backend dies: one statement fails, the next runs on a
	// fresh connection that becomes the home's.
	p0, err := pid(dbs[0])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, p0)
	require.NoError(t, err)
	failed := 0
	var p1 int32
	for range 3 {
		if p1, err = pid(dbs[0]); err != nil {
			failed++
			continue
		}
		break
	}
	require.NoError(t, err, "a statement after the backend died runs")
	require.LessOrEqual(t, failed, 1, "at most the statement that met the dead backend fails")
	require.NotEqual(t, p0, p1, "on a fresh backend")
	p2, err := pid(dbs[2])
	require.NoError(t, err)
	require.Equal(t, p1, p2, "which is the home's now")

	// Closed: every connection goes back, those out when they come back.
	c, _, _ := h.take(0, time.Now())
	require.NotNil(t, c, "home 0's connection is free")
	h.tidy(time.Now(), true)
	acquired(1, "the one out is still out")
	require.False(t, h.keep(0, c), "a closed home keeps nothing")
	c.Release()
	acquired(0, "all back")
	_, err = pid(dbs[1])
	require.NoError(t, err)
	acquired(0, "closed homes take no new connection")
}

func poolOf(t *testing.T, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
	require.NoError(t, err)
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// restHome puts one of pool's connections in home i of h, resting, and
// returns it.
func restHome(t *testing.T, pool *pgxpool.Pool, h *homes, i int) *pgx.Conn {
	t.Helper()
	c, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	conn := c.Conn()
	require.True(t, h.keep(i, c))
	return conn
}

// hangHome puts one of pool's connections in home i of h, out with a
// statement that has run homeTurn (a target waiting for it goes to the
// pool), until the test ends.
func hangHome(t *testing.T, pool *pgxpool.Pool, h *homes, i int) {
	t.Helper()
	conn := restHome(t, pool, h, i)
	out, _, _ := h.take(i, time.Now().Add(-homeTurn))
	require.Same(t, conn, out.Conn())
	t.Cleanup(func() { h.keep(i, out) })
}

// holdConns takes n of pool's connections until the test ends.
func holdConns(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	for range n {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		t.Cleanup(c.Release)
	}
}

// A target whose home-mate is running a statement waits for the home's
// connection rather than taking one of the pool's (the pool keeps only
// two besides the homes, often both taken, and another backend means the
// target's plans built afresh), unless the statement has run homeTurn:
// then the pool's at once.
func TestHomesWaitForTheirTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolOf(t, 4)
	h := newHomes(pool)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	c0, err := pool.Acquire(ctx)
	require.NoError(t, err)
	require.True(t, h.keep(0, c0), "home 0 takes the connection")

	out, _, _ := h.take(0, time.Now())
	require.Same(t, c0, out, "a home-mate's statement")
	got := make(chan *pgxpool.Conn, 1)
	go func() {
		c, err := h.acquire(ctx, pool, 0)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	select {
	case c := <-got:
		t.Fatalf("took a connection (the pool's: %v) while its home's was out for a moment", c != c0)
	case <-time.After(homeTurn / 5):
	}
	require.True(t, h.keep(0, out))
	select {
	case c := <-got:
		require.Same(t, c0, c, "the home's connection, once back")
		require.True(t, h.keep(0, c))
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after the home's connection came back")
	}
	require.EqualValues(t, 1, pool.Stat().TotalConns(), "no connection of the pool's taken")

	// A statement that has run homeTurn: the pool's connection, at once.
	out, _, _ = h.take(0, time.Now().Add(-homeTurn))
	require.Same(t, c0, out)
	start := time.Now()
	c, err := h.acquire(ctx, pool, 0)
	require.NoError(t, err)
	require.NotSame(t, c0, c, "the pool's")
	require.Less(t, time.Since(start), homeTurn, "without waiting for the home")
	c.Release()
	require.True(t, h.keep(0, out))

	// The wait ends with ctx.
	out, _, _ = h.take(0, time.Now())
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = h.acquire(cctx, pool, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, h.keep(0, out))
}

// A pool of six connections or more keeps one for the busy targets'
// watch, which then never waits for the pool: it asks for every busy
// target of the pool.
func TestHomesKeepOneForTheWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.Nil(t, newHomes(poolOf(t, 5)).watch, "a pool of five has no watch home")
	require.Len(t, newHomes(poolOf(t, 5)).slots, 3)
	pool := poolOf(t, 6)
	h := newHomes(pool)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	require.NotNil(t, h.watch)
	require.Len(t, h.slots, 3, "MaxConns - 3 targets' homes")

	w, err := h.acquire(ctx, pool, watchHome)
	require.NoError(t, err)
	require.True(t, h.keep(watchHome, w), "the watch's connection becomes its home's")
	var others []*pgxpool.Conn
	for range 5 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		others = append(others, c)
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	again, err := h.acquire(actx, pool, watchHome)
	require.NoError(t, err, "the pool is exhausted; the watch has its own")
	require.Same(t, w, again)
	require.True(t, h.keep(watchHome, again))
	for _, c := range others {
		c.Release()
	}
	h.tidy(time.Now().Add(homeIdle), false)
	require.Nil(t, h.watch.c, "given back once unused for homeIdle, as the others")
}

// A lease statement bounded more tightly than homeWait (a heartbeat's
// bound is LeaseTTL/2) still makes the homes give way: on a pool whose one
// free connection a busy home keeps (waitAttackPool), before waitBefore
// the bounded acquire timed out before it counted in waiting, so the home
// never gave its connection back, again and again: a hung target's
// home-mate lost its lease for good.
func TestHomesGiveWayToABoundedAcquire(t *testing.T) {
	t.Parallel()
	pool, h, _, _ := waitAttackPool(t)
	for i := range 3 {
		bctx, cancel := context.WithTimeout(leaseStatement(context.Background()), 400*time.Millisecond)
		c, err := h.acquire(bctx, pool, 0)
		cancel()
		require.NoError(t, err, "lease statement %d, bounded to 400 ms, on a pool whose one free connection a busy home keeps", i)
		c.Release()
	}
}

func TestWaitBefore(t *testing.T) {
	now := time.Now()
	bg := context.Background()
	require.Equal(t, homeWait, waitBefore(bg, now), "unbounded: homeWait")
	require.Equal(t, homeWait, waitBefore(leaseStatement(bg), now), "an unbounded lease statement: homeWait")
	for _, c := range []struct {
		name  string
		ctx   context.Context
		bound time.Duration
		want  time.Duration
	}{
		{"a statement bounded beyond homeWait", bg, 10 * homeWait, homeWait},
		{"a statement bounded to less (the backlog count's)", bg, homeWait / 10, homeWait},
		{"a lease statement bounded beyond homeWait", leaseStatement(bg), 10 * homeWait, homeWait},
		{"a lease statement bounded to less: half of it", leaseStatement(bg), homeWait / 2, homeWait / 4},
	} {
		ctx, cancel := context.WithDeadline(c.ctx, now.Add(c.bound))
		require.Equal(t, c.want, waitBefore(ctx, now), c.name)
		cancel()
	}
}

// TestHomesGiveAQuietHomesConnectionToAWaiter: an acquire that waits for a
// pool whose only connection not out rests in a quiet home gets it once
// it counts in waiting (homeWait), not when tidy (homesLoop's, every
// homeIdle; none runs here) finds it idle.
func TestHomesGiveAQuietHomesConnectionToAWaiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolOf(t, 4)
	h := newHomes(pool)
	require.NotNil(t, h)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	hangHome(t, pool, h, 0)
	quietConn := restHome(t, pool, h, 1) // and nobody uses it
	holdConns(t, pool, 2)
	actx, cancel := context.WithTimeout(ctx, 5*homeWait)
	defer cancel()
	c, err := h.acquire(actx, pool, 0)
	require.NoError(t, err, "home 0's target, on a pool whose one connection not out rests in home 1")
	defer c.Release()
	require.Same(t, quietConn, c.Conn(), "it got home 1's connection")
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Nil(t, h.slots[1].c, "home 1 no longer has it")
}
