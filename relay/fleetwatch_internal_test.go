package relay

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A Fleet's busy targets share WatchRate: each watches every
// BusyPollInterval while few are busy, less often when many are.
func TestFleetWatchEveryShared(t *testing.T) {
	t.Parallel()
	var watchers atomic.Int64
	r := &Relay{cfg: Config{BusyPollInterval: 2 * time.Millisecond}}
	require.Equal(t, 2*time.Millisecond, r.watchEvery(), "a relay alone")
	r.watchers, r.watchRate = &watchers, 5000
	for _, c := range []struct {
		busy int64
		want time.Duration
	}{{0, 2 * time.Millisecond}, {1, 2 * time.Millisecond}, {10, 2 * time.Millisecond}, {100, 20 * time.Millisecond}, {1000, 200 * time.Millisecond}} {
		watchers.Store(c.busy)
		require.Equal(t, c.want, r.watchEvery(), "%d busy targets", c.busy)
	}
}

// The Fleet counts its targets watching: all of them while starting, none
// once they sleep, the one with rows while its rows come, none again
// after.
func TestFleetCountsWatchers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.New(t)
	kafkatest.CreateTopic(t, c.ListenAddrs(), "w", 1, nil)
	pool, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var ts []Target
	var dbs []*testdb.DB
	for i := range 3 {
		d := testdb.New(t)
		dbs = append(dbs, d)
		ts = append(ts, Target{Name: fmt.Sprint(i), Pool: pool, Schema: d.Schema})
	}
	kc := kafkatest.Config()
	kc.Producer.RequiredAcks = -1
	f, err := NewFleet(FleetConfig{Relay: Config{Brokers: c.ListenAddrs(), Kafka: kc, HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second},
		Targets: ts, DormantAfter: -1}) // every target takes its lanes at start (it would start dormant)
	require.NoError(t, err)
	runFleet(t, f)
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s (watchers %d)", what, f.watchers.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUntil("every target running", func() bool {
		for _, s := range f.Targets() {
			if s.Stats.Lanes == 0 {
				return false
			}
		}
		return true
	})
	// Each target watches through its busy window and, after setting its
	// sleeping flag, a grace: asleep means no watcher for a whole second.
	var zeroSince time.Time
	waitUntil("every target asleep", func() bool {
		if f.watchers.Load() != 0 {
			zeroSince = time.Time{}
			return false
		}
		if zeroSince.IsZero() {
			zeroSince = time.Now()
		}
		return time.Since(zeroSince) > time.Second
	})
	w, err := outbox.NewWriter(outbox.Config{Notify: true})
	require.NoError(t, err)
	stop := time.Now().Add(time.Second)
	sawBusy := false
	for time.Now().Before(stop) {
		require.NoError(t, pgx.BeginFunc(ctx, dbs[1].Pool, func(tx pgx.Tx) error {
			return w.Write(ctx, tx, outbox.Message{Topic: "w", Key: []byte("k"), Value: []byte("v")})
		}))
		n := f.watchers.Load()
		require.LessOrEqual(t, n, int64(1), "only the target with rows watches")
		sawBusy = sawBusy || n == 1
		time.Sleep(20 * time.Millisecond)
	}
	require.True(t, sawBusy, "the target with rows watched")
	waitUntil("asleep again", func() bool { return f.watchers.Load() == 0 })
	require.EqualValues(t, 0, f.watchers.Load())
}

// A target starts dormant, so rows waiting at its start must not wait for
// the idle poll's next tick (PollInterval, a minute here): a target that
// just started kicks the poll, which asks it (and only the targets that
// started since) at once.
func TestFleetPollAsksStartedTargetsAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	withRows, without := testdb.New(t), testdb.New(t)
	_, err = withRows.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) VALUES (gen_random_uuid(), 1, 't', 'v')`)
	require.NoError(t, err)
	f, err := NewFleet(FleetConfig{Relay: Config{Brokers: []string{"127.0.0.1:1"}, PollInterval: time.Minute},
		Targets: []Target{{Name: "rows", Pool: pool, Schema: withRows.Schema}, {Name: "none", Pool: pool, Schema: without.Schema}}})
	require.NoError(t, err)
	kick := make(chan struct{}, 1)
	var rs []*Relay
	for _, ft := range f.targets {
		r, err := New(Config{Pool: pool, Schema: ft.t.Schema, Brokers: []string{"127.0.0.1:1"}})
		require.NoError(t, err)
		r.idleState.kick = kick
		r.idleState.fresh.Store(true)
		r.idleState.idle.Store(true)
		ft.r = r
		rs = append(rs, r)
	}
	f.wg.Go(func() { f.pollLoop(ctx, pool, kick) })
	defer func() { cancel(); f.wg.Wait() }()
	kick <- struct{}{}
	woken := func(r *Relay) bool {
		select {
		case <-r.wake:
			return true
		case <-time.After(3 * time.Second):
			return false
		}
	}
	for _, r := range rs {
		has := r.cfg.Schema == withRows.Schema
		require.Equal(t, has, woken(r), "schema %s (rows: %v): woken by the kicked poll", r.cfg.Schema, has)
		require.False(t, r.idleState.fresh.Load(), "asked, so no longer fresh")
	}
}

// The idle questions are prepared once per schema and connection: a poll
// answers from the prepared statement, a statement gone from the
// connection (a pooler's DISCARD ALL) fails its question once (its target
// is woken, the answer unknown) and is prepared again at the next poll, and
// a schema dropped and recreated is asked through the same statement.
func TestFleetIdleQuestionsPrepared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rows, empty := testdb.New(t), testdb.New(t)
	_, err = rows.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) VALUES (gen_random_uuid(), 1, 't', 'v')`)
	require.NoError(t, err)
	var rs []*Relay
	for _, d := range []*testdb.DB{rows, empty} {
		r, err := New(Config{Pool: pool, Schema: d.Schema, Brokers: []string{"127.0.0.1:1"}})
		require.NoError(t, err)
		rs = append(rs, r)
	}
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	pc := c.Conn().PgConn()
	prepared := map[string]string{}
	woken := func() []bool {
		out := make([]bool, len(rs))
		for i, r := range rs {
			select {
			case <-r.wake:
				out[i] = true
			default:
			}
		}
		return out
	}
	statements := func() int {
		var n int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgbox_idle_%'`).Scan(&n))
		return n
	}
	require.NoError(t, pollPipeline(ctx, pc, prepared, rs))
	require.Equal(t, []bool{true, false}, woken(), "the target with rows is woken, the empty one not")
	require.Len(t, prepared, 2)
	require.Equal(t, 2, statements())
	first := prepared[rows.Schema]

	require.NoError(t, pollPipeline(ctx, pc, prepared, rs))
	require.Equal(t, []bool{true, false}, woken())
	require.Equal(t, first, prepared[rows.Schema], "asked through the statement prepared at the first poll")
	require.Equal(t, 2, statements(), "nothing prepared twice")

	// A pooler's DISCARD ALL: the statements are gone.
	_, err = c.Exec(ctx, `DEALLOCATE ALL`)
	require.NoError(t, err)
	require.NoError(t, pollPipeline(ctx, pc, prepared, rs))
	require.Equal(t, []bool{true, true}, woken(), "a failed question wakes its target")
	require.Empty(t, prepared, "the lost statements are forgotten")
	require.NoError(t, pollPipeline(ctx, pc, prepared, rs))
	require.Equal(t, []bool{true, false}, woken(), "prepared again, answered again")
	require.Len(t, prepared, 2)

	// The empty target's tables dropped and recreated (a migration down
	// and up): the same statement reads the new table.
	_, err = empty.Pool.Exec(ctx, `ALTER TABLE pgbox_outbox RENAME TO pgbox_outbox_old`)
	require.NoError(t, err)
	_, err = empty.Pool.Exec(ctx, `CREATE TABLE pgbox_outbox (LIKE pgbox_outbox_old INCLUDING ALL)`)
	require.NoError(t, err)
	_, err = empty.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) VALUES (gen_random_uuid(), 1, 't', 'v')`)
	require.NoError(t, err)
	require.NoError(t, pollPipeline(ctx, pc, prepared, rs))
	require.Equal(t, []bool{true, true}, woken(), "the recreated table's row is found")
}
