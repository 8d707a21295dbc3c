package relay_test

// Hostile review of a Fleet's home connections (homes.go, 0f3d55a) and of
// the per-schema prepared statements (db.go, 3a65bc7): end-to-end attacks
// through a Fleet. White-box part: homesattack_internal_test.go.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// haPool is a pool on the test server whose search_path is decoy's schema
// (pgbox tables of its own: a statement run without its target's schema
// would find them), in mode, with MaxConns n and an application_name of
// its own (so a test can find its backends).
func haPool(t *testing.T, decoy *testdb.DB, mode pgx.QueryExecMode, n int32, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{decoy.Schema}.Sanitize()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// haWrite commits n rows to db's outbox on topic, values from..from+n-1
// (zero-padded), keys key-000..key-004 in turn.
func haWrite(t testing.TB, db *testdb.DB, topic string, from, n int, notify bool) {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Notify: notify})
	require.NoError(t, err)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		v := from + i
		msgs[i] = outbox.Message{Topic: topic, Key: []byte(keyed(v % 5)), Value: []byte(fmt.Sprintf("%07d", v))}
	}
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))
}

// haExpect reads topic until it holds every value 0..n-1 (duplicates
// allowed: at-least-once; values >= n ignored) or timeout passes, and checks per-key order
// (each key's values first seen in increasing order). It returns how many
// distinct values it found and a description of what is wrong ("" if
// nothing).
func haExpect(t *testing.T, addrs []string, topic string, n int, timeout time.Duration) (int, string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var got []*sarama.ConsumerMessage
	seen := map[string]bool{}
	for {
		got = kafkatest.ReadAll(t, addrs, topic, n, time.Until(deadline)+time.Millisecond)
		clear(seen)
		for _, m := range got {
			if v, err := strconv.Atoi(string(m.Value)); err == nil && v < n {
				seen[string(m.Value)] = true
			}
		}
		if len(seen) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	last := map[string]int{}
	first := map[string]bool{}
	for _, m := range got {
		v, _ := strconv.Atoi(string(m.Value))
		if first[string(m.Value)] {
			continue
		}
		first[string(m.Value)] = true
		if l, ok := last[string(m.Key)]; ok && v < l {
			return len(seen), fmt.Sprintf("%s: key %s: value %d first seen after %d (per-key order broken)", topic, m.Key, v, l)
		}
		last[string(m.Key)] = v
	}
	if len(seen) < n {
		return len(seen), fmt.Sprintf("%s: %d of %d rows on Kafka after %s", topic, len(seen), n, timeout)
	}
	return len(seen), ""
}

// haLock takes ACCESS EXCLUSIVE locks on every pgbox table of db's schema
// in a transaction of its own, held until the returned func is called.
func haLock(t *testing.T, db *testdb.DB) func() {
	t.Helper()
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	s := pgx.Identifier{db.Schema}.Sanitize()
	var tx pgx.Tx
	for attempt := 1; ; attempt++ {
		tx, err = locker.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, fmt.Sprintf("LOCK TABLE %[1]s.pgbox_outbox, %[1]s.pgbox_relay_lanes, %[1]s.pgbox_relay_instances IN ACCESS EXCLUSIVE MODE", s))
		if (pgerr.Code(err) != pgerr.CodeDeadlockDetected && pgerr.Code(err) != "55P03") || attempt == 10 {
			break
		}
		_ = tx.Rollback(ctx)
	}
	require.NoError(t, err)
	return func() {
		_ = tx.Rollback(ctx)
		_ = locker.Close(ctx)
	}
}

// Attack: a target whose statements hang (its tables locked) on a small
// pool. FleetConfig.MaxConnsPerTarget documents: "Give a pool MaxConns of
// at least MaxConnsPerTarget times the targets that may hang at once,
// plus room for the rest", and the Fleet caps a target at MaxConns-1. So
// the hung targets hold their homes' connections and more of the pool's;
// what is left is a home's connection. The first version of homes kept it
// for that home's targets (back to the pool only after homeIdle unused or
// homeFor in all), and the hung targets' home-mates starved (1 run in 3).
// Now an acquire that has waited homeWait (a second) makes every home give
// its connection to the pool.
//
// Must hold: every other target publishes its rows within 20 s (before
// homes the connection left was the pool's, shared by every target).
func TestHomesAttackLockedTargetStarvesHomeMates(t *testing.T) {
	for _, tc := range []struct {
		name           string
		maxConns, cap  int
		locked, others int
	}{
		{"maxconns4-cap3-one-locked", 4, 3, 1, 3},
		{"maxconns5-cap2-two-locked", 5, 2, 2, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.New(t)
			addrs := c.ListenAddrs()
			decoy := testdb.New(t)
			pool := haPool(t, decoy, pgx.QueryExecModeCacheStatement, int32(tc.maxConns), "ha-locked")
			var locked, others []*testdb.DB
			var targets []relay.Target
			for i := range tc.locked {
				db := testdb.New(t)
				locked = append(locked, db)
				kafkatest.CreateTopic(t, addrs, fmt.Sprintf("slow-%d", i), 3, nil)
				targets = append(targets, relay.Target{Name: fmt.Sprintf("slow-%d", i), Pool: pool, Schema: db.Schema})
			}
			for i := range tc.others {
				db := testdb.New(t)
				others = append(others, db)
				kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
				targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
			}
			f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "ha-locked"), Targets: targets,
				DormantAfter: -1, MaxConnsPerTarget: tc.cap})
			require.NoError(t, err)
			runFleet(t, f)
			waitAllLanes(t, f)
			for i, db := range locked {
				haWrite(t, db, fmt.Sprintf("slow-%d", i), 0, 5, false)
			}
			var unlocks []func()
			for _, db := range locked {
				unlocks = append(unlocks, haLock(t, db))
			}
			defer func() {
				for _, u := range unlocks {
					u()
				}
			}()
			time.Sleep(3 * time.Second) // the locked targets' statements pile up

			for i, db := range others {
				haWrite(t, db, topicOf(i), 0, 10, true)
			}
			// The other targets stay busy (their homes never unused for
			// homeIdle) while their first 10 rows are awaited.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			defer func() { close(stop); wg.Wait() }()
			for i, db := range others {
				wg.Go(func() {
					for n := 10; ; n += 5 {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
						haWrite(t, db, topicOf(i), n, 5, true)
					}
				})
			}
			var problems []string
			for i := range others {
				if _, p := haExpect(t, addrs, topicOf(i), 10, 20*time.Second); p != "" {
					problems = append(problems, p)
				}
			}
			if len(problems) > 0 { // what each target was doing
				for _, st := range f.Targets() {
					t.Logf("target %s: %s err=%v dormant=%v caughtUp=%v stats=%+v", st.Name, st.State, st.Err, st.Dormant, st.CaughtUp, st.Stats)
				}
			}
			require.Empty(t, problems, "targets sharing a pool with %d hung target(s) (MaxConns %d, MaxConnsPerTarget %d) must keep publishing; pool: %d of %d acquired",
				tc.locked, tc.maxConns, tc.cap, pool.Stat().AcquiredConns(), pool.Stat().MaxConns())
		})
	}
}

// Attack: Fleet.Run returns within StopTimeout while its targets publish,
// and the user can close the pool right away (pgxpool.Close waits for
// every acquired connection: homes hold some between statements).
func TestHomesAttackStopThenClosePool(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	decoy := testdb.New(t)
	pool := haPool(t, decoy, pgx.QueryExecModeCacheStatement, 8, "ha-stop")
	var dbs []*testdb.DB
	var targets []relay.Target
	for i := range 6 {
		db := testdb.New(t)
		dbs = append(dbs, db)
		kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
		targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
	}
	cfg := faConfig(addrs, "ha-stop")
	cfg.StopTimeout = 2 * time.Second
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	for i, db := range dbs {
		haWrite(t, db, topicOf(i), 0, 300, true)
	}
	waitFor(t, "publishing", func() bool {
		var n uint64
		for _, s := range f.Targets() {
			n += s.Stats.Published
		}
		return n > 50
	})
	require.Greater(t, pool.Stat().AcquiredConns(), int32(0), "homes hold connections while the targets run")
	stopped := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(cfg.StopTimeout + 10*time.Second):
		t.Fatalf("Fleet.Run did not return %s after its context ended (StopTimeout %s)", cfg.StopTimeout+10*time.Second, cfg.StopTimeout)
	}
	t.Logf("Run returned %s after cancel", time.Since(stopped))
	// (Connections closed by a canceled statement are destroyed in the
	// background and counted as acquired until then: Close must return.)
	acquired := pool.Stat().AcquiredConns()
	closed := make(chan struct{})
	go func() { pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("pool.Close did not return 10 s after Fleet.Run returned: %d connections were still acquired when Run returned", acquired)
	}
	t.Logf("%d acquired when Run returned; pool.Close returned", acquired)
}

// Attack: SetTargets removes every target of one pool; the user closes
// that pool while the Fleet keeps serving another pool's targets.
//
// Must hold: the removed pool's Close returns (its homes gave their
// connections back), and the other pool's targets keep publishing.
func TestHomesAttackRemovePoolThenClose(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	decoy := testdb.New(t)
	p1 := haPool(t, decoy, pgx.QueryExecModeCacheStatement, 6, "ha-remove-1")
	p2 := haPool(t, decoy, pgx.QueryExecModeCacheStatement, 6, "ha-remove-2")
	var dbs []*testdb.DB
	var t1, t2 []relay.Target
	for i := range 6 {
		db := testdb.New(t)
		dbs = append(dbs, db)
		kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
		tg := relay.Target{Name: topicOf(i), Pool: p1, Schema: db.Schema}
		if i%2 == 1 {
			tg.Pool = p2
			t2 = append(t2, tg)
		} else {
			t1 = append(t1, tg)
		}
	}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "ha-remove"), Targets: append(append([]relay.Target{}, t1...), t2...)})
	require.NoError(t, err)
	runFleet(t, f)
	for i, db := range dbs {
		haWrite(t, db, topicOf(i), 0, 100, true)
	}
	time.Sleep(300 * time.Millisecond) // mid-publishing
	require.NoError(t, f.SetTargets(t2))
	closed := make(chan struct{})
	go func() { p1.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatalf("the removed pool's Close did not return 15 s after SetTargets removed its targets: %d acquired", p1.Stat().AcquiredConns())
	}
	for i, db := range dbs {
		if i%2 == 1 {
			haWrite(t, db, topicOf(i), 100, 50, true)
		}
	}
	for i := range dbs {
		if i%2 == 1 {
			_, p := haExpect(t, addrs, topicOf(i), 150, 30*time.Second)
			require.Empty(t, p, "the remaining pool's targets keep publishing")
		}
	}
}

// Attack: small pools (MaxConns 3, 4, 5: none, two, three homes) with
// busy targets keeping their homes taken and dormant targets that only the
// idle poll can find (NoListen, rows written without notify).
//
// Must hold: every row of the busy and the dormant targets arrives, in
// per-key order.
func TestHomesAttackSmallPoolDormantFound(t *testing.T) {
	for _, n := range []int32{3, 4, 5} {
		t.Run(fmt.Sprintf("maxconns%d", n), func(t *testing.T) {
			t.Parallel()
			c := kafkatest.New(t)
			addrs := c.ListenAddrs()
			decoy := testdb.New(t)
			pool := haPool(t, decoy, pgx.QueryExecModeCacheStatement, n, "ha-small")
			const busy, dormant = 3, 4
			var dbs []*testdb.DB
			var targets []relay.Target
			for i := range busy + dormant {
				db := testdb.New(t)
				dbs = append(dbs, db)
				kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
				targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
			}
			cfg := faConfig(addrs, "ha-small")
			cfg.NoListen = true
			f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets, DormantAfter: 500 * time.Millisecond})
			require.NoError(t, err)
			runFleet(t, f)
			time.Sleep(2 * time.Second) // all dormant
			var wg sync.WaitGroup
			stop := make(chan struct{})
			written := make([]atomic.Int64, busy)
			for i := range busy {
				wg.Go(func() {
					for n := 0; ; n += 10 {
						select {
						case <-stop:
							return
						default:
						}
						haWrite(t, dbs[i], topicOf(i), n, 10, false)
						written[i].Store(int64(n + 10))
						time.Sleep(20 * time.Millisecond)
					}
				})
			}
			time.Sleep(2 * time.Second) // busy targets hold their homes
			for i := busy; i < busy+dormant; i++ {
				haWrite(t, dbs[i], topicOf(i), 0, 20, false)
			}
			var problems []string
			for i := busy; i < busy+dormant; i++ {
				if _, p := haExpect(t, addrs, topicOf(i), 20, 20*time.Second); p != "" {
					problems = append(problems, "dormant "+p)
				}
			}
			close(stop)
			wg.Wait()
			for i := range busy {
				if _, p := haExpect(t, addrs, topicOf(i), int(written[i].Load()), 30*time.Second); p != "" {
					problems = append(problems, "busy "+p)
				}
			}
			require.Empty(t, problems, "MaxConns %d: rows lost or late; targets: %+v", n, f.Targets())
		})
	}
}

// Attack: backends die (pg_terminate_backend on every connection of the
// pool, homes included, every 250 ms for 4 s) while the targets publish.
//
// Must hold: every committed row arrives (duplicates allowed: the relay
// is at-least-once), in per-key order, and the targets run again.
func TestHomesAttackBackendDeath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	decoy := testdb.New(t)
	app := fmt.Sprintf("ha-kill-%d", time.Now().UnixNano())
	pool := haPool(t, decoy, pgx.QueryExecModeCacheStatement, 8, app)
	var dbs []*testdb.DB
	var targets []relay.Target
	for i := range 5 {
		db := testdb.New(t)
		dbs = append(dbs, db)
		kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
		targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
	}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "ha-kill"), Targets: targets, NeedsOperatorRetry: time.Second})
	require.NoError(t, err)
	runFleet(t, f)
	killer, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	defer killer.Close(ctx)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var kills atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			var n int64
			_ = killer.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
			kills.Add(n)
		}
	})
	const per = 400
	for i, db := range dbs {
		wg.Go(func() {
			for n := 0; n < per; n += 10 {
				haWrite(t, db, topicOf(i), n, 10, true)
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("terminated %d backends", kills.Load())
	require.Positive(t, kills.Load())
	var problems []string
	for i := range dbs {
		if _, p := haExpect(t, addrs, topicOf(i), per, 45*time.Second); p != "" {
			problems = append(problems, p)
		}
	}
	require.Empty(t, problems, "targets: %+v", f.Targets())
	waitFor(t, "every target runs again", func() bool {
		for _, s := range f.Targets() {
			if s.State != "running" {
				return false
			}
		}
		return true
	})
}

// Attack: homes on pools for a pooler in transaction mode (exec and
// simple protocol: nothing prepared), whose own search_path is a decoy.
//
// Must hold: every row arrives in per-key order, the decoy is untouched.
func TestHomesAttackExecModes(t *testing.T) {
	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"Exec", pgx.QueryExecModeExec}, {"SimpleProtocol", pgx.QueryExecModeSimpleProtocol}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.New(t)
			addrs := c.ListenAddrs()
			decoy := testdb.New(t)
			haWrite(t, decoy, "decoy", 0, 10, false)
			pool := haPool(t, decoy, m.mode, 5, "ha-exec")
			var dbs []*testdb.DB
			var targets []relay.Target
			for i := range 6 {
				db := testdb.New(t)
				dbs = append(dbs, db)
				kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
				targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
			}
			f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "ha-exec"), Targets: targets, DormantAfter: time.Second})
			require.NoError(t, err)
			runFleet(t, f)
			for round := range 3 {
				for i, db := range dbs {
					haWrite(t, db, topicOf(i), round*50, 50, round != 1)
				}
				time.Sleep(1500 * time.Millisecond)
			}
			var problems []string
			for i := range dbs {
				if _, p := haExpect(t, addrs, topicOf(i), 150, 30*time.Second); p != "" {
					problems = append(problems, p)
				}
			}
			require.Empty(t, problems, "targets: %+v", f.Targets())
			require.Equal(t, 10, count(t, decoy), "the decoy schema was not touched")
		})
	}
}
