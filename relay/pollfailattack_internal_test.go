package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// Attacks on the idle poll's failure handling (pollFailWake, ask's
// per-chunk timeout). The rig is TestFleetPollFailureWakesAfterThree's: a
// channel nobody notifies, so only the Fleet's poll (or a target polling
// for itself) finds a dormant target's rows.

type pollFailRig struct {
	t     *testing.T
	f     *Fleet
	dbs   []*testdb.DB
	pool  *pgxpool.Pool
	calls atomic.Int64 // pollErr calls (rounds)
	fails atomic.Int64 // injected failures
	// fail decides a round's injected failure from its number (1-based);
	// nil: no failure.
	fail atomic.Pointer[func(n int64) bool]
}

func newPollFailRig(t *testing.T, pool *pgxpool.Pool, n int, mod func(*FleetConfig)) *pollFailRig {
	t.Helper()
	c := kafkatest.New(t)
	kafkatest.CreateTopic(t, c.ListenAddrs(), "w", 1, nil)
	if pool == nil {
		var err error
		pool, err = pgxpool.New(context.Background(), testdb.ServerURL(t))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
	}
	g := &pollFailRig{t: t, pool: pool}
	var targets []Target
	for i := 0; i < n; i++ {
		db := testdb.New(t)
		g.dbs = append(g.dbs, db)
		targets = append(targets, Target{Name: fmt.Sprintf("t%d", i), Pool: pool, Schema: db.Schema})
	}
	kc := kafkatest.Config()
	kc.Producer.RequiredAcks = -1
	fc := FleetConfig{Relay: Config{Brokers: c.ListenAddrs(), Kafka: kc, HeartbeatInterval: 100 * time.Millisecond,
		LeaseTTL: time.Second, PollInterval: 100 * time.Millisecond,
		Channel: "pgbox_test_nobody_notifies"},
		Targets: targets, DormantAfter: 200 * time.Millisecond}
	if mod != nil {
		mod(&fc)
	}
	f, err := NewFleet(fc)
	require.NoError(t, err)
	f.pollErr = func() error {
		n := g.calls.Add(1)
		if p := g.fail.Load(); p != nil && (*p)(n) {
			g.fails.Add(1)
			return errors.New("injected: the round failed")
		}
		return nil
	}
	g.f = f
	runFleet(t, f)
	return g
}

func (g *pollFailRig) setFail(fn func(n int64) bool) {
	if fn == nil {
		g.fail.Store(nil)
		return
	}
	g.fail.Store(&fn)
}

// allDormant waits until every target named is dormant.
func (g *pollFailRig) allDormant(within time.Duration, names ...string) {
	g.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok := true
		st := map[string]TargetState{}
		for _, s := range g.f.Targets() {
			st[s.Name] = s
		}
		for _, n := range names {
			if s, found := st[n]; !found || !s.Dormant {
				ok = false
			}
		}
		if ok {
			return
		}
		require.True(g.t, time.Now().Before(deadline), "never dormant: %+v", g.f.Targets())
		time.Sleep(10 * time.Millisecond)
	}
}

func (g *pollFailRig) write(db *testdb.DB, v string) {
	g.t.Helper()
	ctx := context.Background()
	require.NoError(g.t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "w", Value: []byte(v)})
	}))
}

// published waits until the Fleet has published n rows in all, and
// returns how long that took from since.
func (g *pollFailRig) published(n uint64, since time.Time, within time.Duration) time.Duration {
	g.t.Helper()
	for g.f.Stats().Published < n {
		require.True(g.t, time.Since(since) < within, "published %d of %d after %v (rounds %d, injected failures %d)",
			g.f.Stats().Published, n, time.Since(since), g.calls.Load(), g.fails.Load())
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(since)
}

func names(n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, fmt.Sprintf("t%d", i))
	}
	return out
}

// A poll that fails every round forever: a dormant target's row is still
// published within a few backoffs (the third failure wakes it), and a row
// written later, after many failed rounds, within MaxBackoff and a
// PollInterval (every failure from the third on wakes the idle targets).
func TestPollFailAttackForever(t *testing.T) {
	t.Parallel()
	g := newPollFailRig(t, nil, 2, func(fc *FleetConfig) { fc.Relay.MaxBackoff = 2 * time.Second })
	g.allDormant(30*time.Second, names(2)...)
	g.setFail(func(int64) bool { return true })
	t0 := time.Now()
	g.write(g.dbs[0], "first")
	d1 := g.published(1, t0, 10*time.Second)
	require.GreaterOrEqual(t, g.fails.Load(), int64(pollFailWake))
	t.Logf("first row, poll failing: published after %v (injected failures %d)", d1, g.fails.Load())
	// Keep failing until the backoff is at its limit and the targets
	// have gone dormant again.
	g.allDormant(30*time.Second, names(2)...)
	time.Sleep(3 * time.Second)
	g.allDormant(30*time.Second, names(2)...)
	t1 := time.Now()
	g.write(g.dbs[1], "second")
	d2 := g.published(2, t1, 10*time.Second)
	t.Logf("second row, after %d failed rounds: published after %v", g.fails.Load(), d2)
	require.Less(t, d2, 2*time.Second+time.Second, "later than MaxBackoff plus a second")
}

// Rounds failing in a pattern that never reaches pollFailWake in a row
// (fail, ok, fail, ok ... and fail, fail, ok ...): the ok rounds find the
// row; nobody is woken by the failures.
func TestPollFailAttackAlternate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		every int64 // every every-th round succeeds
	}{{"fail-ok", 2}, {"fail-fail-ok", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			g := newPollFailRig(t, nil, 1, nil)
			g.allDormant(30*time.Second, "t0")
			start := g.calls.Load()
			g.setFail(func(n int64) bool { return (n-start)%tc.every != 0 })
			// Let the pattern run while dormant: no failure wakes it.
			stayed := true
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				if !g.f.Targets()[0].Dormant {
					stayed = false
				}
			}
			require.True(t, stayed, "woken by a failure pattern that never reached %d in a row", pollFailWake)
			require.Greater(t, g.fails.Load(), int64(3))
			t0 := time.Now()
			g.write(g.dbs[0], "x")
			d := g.published(1, t0, 10*time.Second)
			t.Logf("%s: published after %v (rounds %d, injected failures %d)", tc.name, d, g.calls.Load()-start, g.fails.Load())
			require.Less(t, d, 3*time.Second)
		})
	}
}

// (Two more attacks, an outage of the database at start and once the
// targets are dormant, found that a dormant target reported an outage
// late, or kept reporting it after the database was back, up to
// dormantBeat (30 s). Fixed the round after (pollFailed, pollAnswered);
// TestFleetDormantTargetReportsPollFailure checks it.)

// ask's chunks: a chunk timing out in the middle of a 600-target round
// fails the round after its own timeout; the earlier chunk's targets were
// answered, the later chunk's not asked; the next round asks them all.
// And a round whose every chunk is slow but answers does not fail,
// however long it takes in all (chunks x the timeout): measured.
func TestPollFailAttackChunkTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f := &Fleet{cfg: FleetConfig{Relay: Config{LeaseTTL: time.Second}}}
	wait := 5 * time.Second // max(LeaseTTL, 5s)
	rs := make([]*Relay, 600)
	for i := range rs {
		rs[i] = &Relay{}
	}
	index := map[*Relay]int{}
	for i, r := range rs {
		index[r] = i
	}
	var mu sync.Mutex
	asked := map[int]bool{}
	chunk := 0
	stuck := func(ctx context.Context, _ *pgconn.PgConn, _ map[string]string, part []*Relay) error {
		mu.Lock()
		chunk++
		c := chunk
		mu.Unlock()
		if c == 2 {
			<-ctx.Done()
			return ctx.Err()
		}
		mu.Lock()
		for _, r := range part {
			asked[index[r]] = true
		}
		mu.Unlock()
		return nil
	}
	t0 := time.Now()
	err = f.ask(ctx, pool, rs, stuck)
	took := time.Since(t0)
	require.Error(t, err)
	t.Logf("a stuck second chunk failed the round after %v (%d asked)", took, len(asked))
	require.InDelta(t, wait.Seconds(), took.Seconds(), 1.5)
	require.Len(t, asked, pollChunk)
	for i := 0; i < pollChunk; i++ {
		require.True(t, asked[i])
	}
	asked, chunk = map[int]bool{}, 0
	require.NoError(t, f.ask(ctx, pool, rs, func(ctx context.Context, pc *pgconn.PgConn, p map[string]string, part []*Relay) error {
		for _, r := range part {
			asked[index[r]] = true
		}
		return nil
	}))
	require.Len(t, asked, len(rs), "the next round asks every target again")

	// Slow but answering: each chunk takes 70% of the timeout.
	slow := func(ctx context.Context, _ *pgconn.PgConn, _ map[string]string, part []*Relay) error {
		select {
		case <-time.After(wait * 7 / 10):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t0 = time.Now()
	require.NoError(t, f.ask(ctx, pool, rs, slow))
	took = time.Since(t0)
	t.Logf("a slow round of 3 chunks answered without failing after %v (one timeout is %v): the last chunk's targets waited that long", took, wait)
	require.Greater(t, took, wait)
}

// Targets added and removed (SetTargets) while the poll fails every
// round: the new targets' rows and the remaining ones' are published
// within a few backoffs; a target removed mid-failure stops cleanly.
func TestPollFailAttackSetTargets(t *testing.T) {
	t.Parallel()
	g := newPollFailRig(t, nil, 3, func(fc *FleetConfig) { fc.Relay.MaxBackoff = 2 * time.Second })
	g.allDormant(30*time.Second, names(3)...)
	g.setFail(func(n int64) bool { return true })
	// Two failures in: change the targets (t1 goes, t3 comes).
	for g.fails.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	extra := testdb.New(t)
	ts := []Target{
		{Name: "t0", Pool: g.pool, Schema: g.dbs[0].Schema},
		{Name: "t2", Pool: g.pool, Schema: g.dbs[2].Schema},
		{Name: "t3", Pool: g.pool, Schema: extra.Schema},
	}
	require.NoError(t, g.f.SetTargets(ts))
	t0 := time.Now()
	g.write(g.dbs[0], "a")
	g.write(g.dbs[2], "b")
	d := g.published(2, t0, 10*time.Second)
	t.Logf("rows of kept targets published after %v (injected failures %d)", d, g.fails.Load())
	g.allDormant(30*time.Second, "t0", "t2", "t3")
	t1 := time.Now()
	g.write(extra, "c")
	d = g.published(3, t1, 10*time.Second)
	t.Logf("row of the added target, dormant, poll failing: published after %v", d)
	require.Less(t, d, 3*time.Second)
}

// A real chunk timeout in the middle of a real 600-target round, on real
// connections: the second chunk holds a target whose question takes 7s (its
// pgbox_outbox a view over pg_sleep: lock_timeout does not bound it), more
// than ask's per-chunk timeout (5s). The first chunk's target with a row is
// woken, the third chunk's is not asked; the round fails after about one
// timeout; the next round (the slow target gone) asks and wakes the third
// chunk's target on a fresh connection. The busy targets' watch, sharing
// ask, fails the same way after one chunk timeout with the first chunk's
// findings delivered.
func TestPollFailAttackRealChunkTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	empty, rows, slow := testdb.New(t), testdb.New(t), testdb.Empty(t)
	require.NoError(t, pgx.BeginFunc(ctx, rows.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "w", Value: []byte("x")})
	}))
	_, err = slow.Pool.Exec(ctx, `CREATE VIEW pgbox_outbox AS SELECT NULL::timestamptz AS parked_at, NULL::bytea AS key,
		'w'::text AS topic, 1::bigint AS id, 0::int AS slot FROM pg_sleep(7)`)
	require.NoError(t, err)
	f := &Fleet{cfg: FleetConfig{Relay: Config{LeaseTTL: time.Second}}}
	build := func(slowAt int) []*Relay {
		rs := make([]*Relay, 600)
		for i := range rs {
			schema := empty.Schema
			switch i {
			case 5, 550:
				schema = rows.Schema
			case slowAt:
				schema = slow.Schema
			}
			rs[i] = &Relay{cfg: Config{Schema: schema}, wake: make(chan struct{}, 1),
				shared: &sharedWatch{kick: make(chan struct{}, 1)}}
			rs[i].shared.on.Store(true)
		}
		return rs
	}
	woken := func(r *Relay) bool {
		select {
		case <-r.wake:
			return true
		default:
			return false
		}
	}
	for _, tc := range []struct {
		name     string
		pipeline func(context.Context, *pgconn.PgConn, map[string]string, []*Relay) error
	}{{"idle", pollPipeline}, {"watch", watchPipeline}} {
		rs := build(300)
		t0 := time.Now()
		err := f.ask(ctx, pool, rs, tc.pipeline)
		took := time.Since(t0)
		t.Logf("%s: a 7s question in chunk 2: the round failed after %v: %v", tc.name, took, err)
		require.Error(t, err)
		require.Less(t, took, 6500*time.Millisecond, "not bounded by the chunk's timeout")
		require.True(t, woken(rs[5]), "%s: the first chunk's target with rows not woken", tc.name)
		require.False(t, woken(rs[550]), "%s: the third chunk was asked", tc.name)
		rs = build(-1)
		t0 = time.Now()
		require.NoError(t, f.ask(ctx, pool, rs, tc.pipeline), tc.name)
		t.Logf("%s: the next round (slow target gone) took %v", tc.name, time.Since(t0))
		require.True(t, woken(rs[5]) && woken(rs[550]), "%s: the next round did not find the rows", tc.name)
		require.False(t, woken(rs[100]), "%s: an empty target woken", tc.name)
	}
}

// Rounds that each fail after ask's timeout (5s), as the slow rounds
// pollFailWake was made for: a dormant target's row waits for three of
// them (about 3 x 5s plus the backoffs) where it waited for one before
// d3292c3. Measured; bounded by 20s.
func TestPollFailAttackSlowRounds(t *testing.T) {
	t.Parallel()
	g := newPollFailRig(t, nil, 1, nil)
	g.allDormant(30*time.Second, "t0")
	wait := 5 * time.Second // max(LeaseTTL, 5s)
	g.setFail(func(int64) bool { time.Sleep(wait); return true })
	t0 := time.Now()
	g.write(g.dbs[0], "x")
	d := g.published(1, t0, 25*time.Second)
	t.Logf("rounds failing after %v each: published after %v (%d failed rounds)", wait, d, g.fails.Load())
	require.Less(t, d, 20*time.Second)
}
