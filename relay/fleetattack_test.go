package relay_test

// Hostile review of Config.Schema (relay/db.go) and relay.Fleet
// (relay/fleet.go). Each test names what it attacks and what must hold.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// faPool is a pool on server's database whose connections' search_path is
// path (a raw search_path value: quote it yourself) and whose statements
// run in mode.
func faPool(t *testing.T, server, path string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(server)
	require.NoError(t, err)
	if path != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = path
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// faSchema creates schema (any name: it is quoted) on server's database,
// migrated when migrate is set, and returns a pool bound to it (quoted
// search_path). The schema is dropped at cleanup.
func faSchema(t *testing.T, server, schema string, migrate bool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	q := pgx.Identifier{schema}.Sanitize()
	admin, err := pgx.Connect(ctx, server)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+q)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), server)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP SCHEMA "+q+" CASCADE")
	})
	cfg, err := pgxpool.ParseConfig(server)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = q
	cfg.MaxConns = 4
	if migrate {
		s := stdlib.OpenDB(*cfg.ConnConfig.Copy())
		defer s.Close()
		require.NoError(t, migrations.Up(ctx, s))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// faWrite commits n rows on topic through pool (its search_path picks the
// schema), value = value, keys key-000...
func faWrite(t *testing.T, pool *pgxpool.Pool, topic, value string, n int, notify bool) {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Notify: notify})
	require.NoError(t, err)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Key: []byte(keyed(i)), Value: []byte(value)}
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))
}

func faCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
	return n
}

func faConfig(addrs []string, name string) relay.Config {
	b := &testBundle{addrs: addrs}
	cfg := b.configWithPool(nil, name)
	cfg.Channel = ""
	return cfg
}

var faModes = []struct {
	name string
	mode pgx.QueryExecMode
}{
	{"CacheStatement", pgx.QueryExecModeCacheStatement},
	{"CacheDescribe", pgx.QueryExecModeCacheDescribe},
	{"DescribeExec", pgx.QueryExecModeDescribeExec},
	{"Exec", pgx.QueryExecModeExec},
	{"SimpleProtocol", pgx.QueryExecModeSimpleProtocol},
}

// Attack 1a/1b: Config.Schema under every pgx QueryExecMode a shared pool
// may be configured with, on a pool whose own search_path is
//   - "empty": a schema without pgbox tables (the common case: a pool on
//     "$user", public, the tenants' tables in their own schemas), and
//   - "decoy": a schema holding pgbox tables of its own.
//
// Must hold: the relay publishes its schema's rows (and only those); the
// pool's schema is never touched. pgx's CacheStatement, CacheDescribe and
// DescribeExec modes send Parse/Describe of every statement not yet cached
// in a pipeline of their own, synced BEFORE the batch that carries
// set_config: the statement is parse-analysed under the connection's own
// search_path. Where that path has no pgbox tables the Parse fails
// (42P01), whatever set_config comes after.
func TestFleetAttackExecModes(t *testing.T) {
	t.Parallel()
	server := testdb.ServerURL(t)
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	empty := testdb.Empty(t)
	decoy := testdb.New(t)
	faWrite(t, decoy.Pool, "decoy", "decoy", 10, false)
	kafkatest.CreateTopic(t, addrs, "decoy", 1, nil)
	for _, path := range []struct{ name, schema string }{{"empty", empty.Schema}, {"decoy", decoy.Schema}} {
		for _, m := range faModes {
			topic := path.name + "-" + m.name
			kafkatest.CreateTopic(t, addrs, topic, 3, nil)
			t.Run(topic, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t)
				faWrite(t, db.Pool, topic, db.Schema, 20, false)
				pool := faPool(t, server, path.schema, m.mode, 2)
				cfg := faConfig(addrs, topic)
				cfg.Pool, cfg.Schema = pool, db.Schema
				rr := start(t, cfg)
				got := kafkatest.ReadAll(t, addrs, topic, 20, 10*time.Second)
				require.Len(t, got, 20, "pool search_path %s, %s mode: the relay of schema %s published %d of 20 rows (last error: %v)",
					path.name, m.name, db.Schema, len(got), rr.r.Stats())
				for _, g := range got {
					require.Equal(t, db.Schema, string(g.Value))
				}
				waitFor(t, "drained", func() bool { return faCount(t, db.Pool) == 0 })
			})
		}
	}
	t.Cleanup(func() {
		require.Equal(t, 10, faCount(t, decoy.Pool), "the decoy (a pool's search_path) was not touched")
		var owned int
		require.NoError(t, decoy.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL`).Scan(&owned))
		require.Zero(t, owned)
	})
}

// Attack 1c: a schema name PostgreSQL reads specially inside search_path
// even when quoted. The relay builds the path as pgx.Identifier{schema}
// .Sanitize(), i.e. `"$user"`; PostgreSQL's search_path parsing strips the
// quotes and then substitutes CURRENT_USER for the name $user. A target
// whose schema is literally named "$user" therefore runs on the schema
// named after the login role.
//
// Must hold: a relay with Schema "$user" either serves the schema named
// "$user" or is refused; it never publishes or deletes another schema's
// rows.
func TestFleetAttackDollarUserSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testdb.CreateDatabase(t, "t_db_")
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	kafkatest.CreateTopic(t, addrs, "dollar", 1, nil)

	var user string
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_user`).Scan(&user))
	admin.Close(ctx)

	// The schema "$user" cannot be reached through a search_path (that is
	// the point): migrate and fill it under another name, then rename it.
	dollar := faSchema(t, dbURL, "dollar_tmp", true)
	faWrite(t, dollar, "dollar", "from $user", 5, false)
	dollar.Close()
	admin, err = pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `ALTER SCHEMA dollar_tmp RENAME TO "$user"`)
	require.NoError(t, err)
	admin.Close(ctx)
	victim := faSchema(t, dbURL, user, true) // the login role's own schema
	faWrite(t, victim, "dollar", "from "+user, 5, false)

	// Exec mode: the one extended-protocol mode where Config.Schema works on
	// a pool whose path has no pgbox tables (TestFleetAttackExecModes).
	pool := faPool(t, dbURL, "pg_catalog", pgx.QueryExecModeExec, 2)
	cfg := faConfig(addrs, "dollar")
	cfg.Pool, cfg.Schema = pool, "$user"
	r, err := relay.New(cfg)
	if err != nil {
		return // refused: fine
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	got := kafkatest.ReadAll(t, addrs, "dollar", 10, 5*time.Second)
	for _, g := range got {
		require.Equal(t, "from $user", string(g.Value), "the relay of schema \"$user\" published a row of schema %q", user)
	}
	require.Equal(t, 5, faCount(t, victim), "schema %q's rows stay", user)
	require.Len(t, got, 5, "the relay of schema \"$user\" publishes that schema's rows")
}

// Attack 1d: odd schema names through one shared pool (its path a schema
// without tables): mixed case, blanks, quotes, a dot, ':' (the payload's
// separator), ',' (search_path's separator), a backslash. Writers notify;
// relays poll rarely (PollInterval 30 s), so rows published in time were
// found through the Fleet's notification dispatch (or the watch).
//
// Must hold: each target publishes its own rows promptly, only its own.
func TestFleetAttackOddSchemaNames(t *testing.T) {
	t.Parallel()
	server := testdb.ServerURL(t)
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	empty := testdb.Empty(t)
	suffix := empty.Schema[len(empty.Schema)-6:]
	names := []string{"Mixed Case " + suffix, `quo"te'` + suffix, "dot.ted" + suffix, "co:lon:" + suffix,
		"com,ma" + suffix, `back\slash` + suffix, "$x" + suffix}
	pool := faPool(t, server, pgx.Identifier{empty.Schema}.Sanitize(), pgx.QueryExecModeExec, 3)
	writers := make([]*pgxpool.Pool, len(names))
	var targets []relay.Target
	for i, n := range names {
		writers[i] = faSchema(t, server, n, true)
		kafkatest.CreateTopic(t, addrs, fmt.Sprintf("odd-%d", i), 3, nil)
		targets = append(targets, relay.Target{Name: fmt.Sprintf("odd-%d", i), Pool: pool, Schema: n})
	}
	cfg := faConfig(addrs, "odd")
	cfg.PollInterval = 30 * time.Second
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets, DormantAfter: -1}) // lanes without rows
	require.NoError(t, err)
	runFleet(t, f)
	waitFor(t, "every target holds lanes", func() bool {
		for _, s := range f.Targets() {
			if s.State != "running" || s.Stats.Lanes == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(3 * time.Second) // past busyWindow: the relays sleep, writers notify
	for i, n := range names {
		faWrite(t, writers[i], fmt.Sprintf("odd-%d", i), n, 10, true)
	}
	for i, n := range names {
		got := kafkatest.ReadAll(t, addrs, fmt.Sprintf("odd-%d", i), 10, 8*time.Second)
		require.Len(t, got, 10, "schema %q: its rows waited for a poll (targets: %+v)", n, f.Targets())
		for _, g := range got {
			require.Equal(t, n, string(g.Value))
		}
	}
}

// runFleet runs f until the test ends; Run must return nil.
func runFleet(t *testing.T, f *relay.Fleet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Errorf("Fleet.Run did not return 30 s after its context ended")
		}
	})
}

// faDecoyPool is a pool (default exec mode, MaxConns n) whose search_path
// is decoy's schema, which holds pgbox tables and 10 rows of its own: a
// statement of a Schema relay that ran without its schema would find them.
func faDecoyPool(t *testing.T, n int32) (*pgxpool.Pool, *testdb.DB) {
	t.Helper()
	decoy := testdb.New(t)
	faWrite(t, decoy.Pool, "decoy", "decoy", 10, false)
	t.Cleanup(func() {
		require.Equal(t, 10, faCount(t, decoy.Pool), "the decoy schema (the pool's search_path) was not touched")
	})
	return faPool(t, testdb.ServerURL(t), decoy.Schema, pgx.QueryExecModeCacheStatement, n), decoy
}

func faState(t *testing.T, f *relay.Fleet, name string) relay.TargetState {
	t.Helper()
	for _, s := range f.Targets() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no target %q in %+v", name, f.Targets())
	return relay.TargetState{}
}

// Attack 6: failure isolation on a small shared pool. Target "slow" has
// its tables locked by another session (ACCESS EXCLUSIVE, as a long
// migration or a VACUUM FULL would): every statement it sends waits. The
// other targets share the pool (MaxConns 2).
//
// Must hold: the other targets keep publishing (within a few seconds)
// while "slow" waits. A relay's claim has no timeout and its sweep look a
// minute's, so a blocked target can hold every connection of the pool.
func TestFleetAttackLockedTargetStarvesPool(t *testing.T) {
	// (Locking pgbox_outbox alone starves the pool intermittently: the
	// claim waits without a timeout, the sweep's look for a minute.)
	for _, locked := range []string{"pgbox_outbox, %[1]s.pgbox_relay_lanes, %[1]s.pgbox_relay_instances"} {
		t.Run("all-tables-locked", func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := kafkatest.New(t)
			addrs := c.ListenAddrs()
			pool, _ := faDecoyPool(t, 2)
			slow := testdb.New(t)
			others := []*testdb.DB{testdb.New(t), testdb.New(t)}
			targets := []relay.Target{{Name: "slow", Pool: pool, Schema: slow.Schema}}
			for i, db := range others {
				kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
				targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
			}
			kafkatest.CreateTopic(t, addrs, "slow", 3, nil)
			f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "iso"), Targets: targets, DormantAfter: -1}) // lanes without rows
			require.NoError(t, err)
			runFleet(t, f)
			waitAllLanes(t, f)
			faWrite(t, slow.Pool, "slow", "slow", 5, false) // work for the slow target's claim

			// Lock the slow target's tables for 20 s in another session.
			locker, err := pgx.Connect(ctx, testdb.ServerURL(t))
			require.NoError(t, err)
			defer locker.Close(ctx)
			// The LOCK takes the tables one after the other, so it can
			// deadlock with a claim in flight (which holds the lanes
			// table and waits for the outbox the LOCK took first): the
			// server aborts one of the two, and the test tries again.
			var tx pgx.Tx
			for attempt := 1; ; attempt++ {
				tx, err = locker.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'")
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "LOCK TABLE "+fmt.Sprintf("%[1]s."+locked, pgx.Identifier{slow.Schema}.Sanitize())+" IN ACCESS EXCLUSIVE MODE")
				if pgerr.Code(err) != pgerr.CodeDeadlockDetected || attempt == 5 {
					break
				}
				_ = tx.Rollback(ctx)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			require.NoError(t, err)
			time.Sleep(3 * time.Second) // the slow target's statements pile up on the pool

			for i, db := range others {
				faWrite(t, db.Pool, topicOf(i), db.Schema, 10, true)
			}
			for i := range others {
				got := kafkatest.ReadAll(t, addrs, topicOf(i), 10, 8*time.Second)
				var waiting []string
				_ = locker.QueryRow(ctx, `SELECT coalesce(array_agg(left(regexp_replace(query, '\s+', ' ', 'g'), 60)), '{}') FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
				require.Len(t, got, 10, "target %s published %d of 10 rows in 8 s while another target of its pool waited on a lock (backends waiting on locks: %q; pool stats: %d acquired of %d; targets: %+v)",
					topicOf(i), len(got), waiting, pool.Stat().AcquiredConns(), pool.Stat().MaxConns(), f.Targets())
			}
		})
	}
}

// Attack 3a: Stats' counters "never go back". SetTargets deletes a removed
// target from the map under f.mu and only then stops it; its relay's
// counters join f.retired when its Run returns. In between (the whole
// stop: the in-flight batch, releasing the lanes) Stats counts them
// nowhere.
//
// Must hold: Stats().Published read concurrently with SetTargets never
// decreases.
func TestFleetAttackStatsMonotonicAcrossRemoval(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	pool, _ := faDecoyPool(t, 4)
	dbs := []*testdb.DB{testdb.New(t), testdb.New(t)}
	var targets []relay.Target
	for i, db := range dbs {
		kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
		faWrite(t, db.Pool, topicOf(i), db.Schema, 50, false)
		targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
	}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "mono"), Targets: targets})
	require.NoError(t, err)
	runFleet(t, f)
	waitFor(t, "both published", func() bool { return f.Stats().Published == 100 })

	// Hold the removed target's stop open (its lanes' release waits on a
	// lock, up to StopTimeout) so the window is wide, not a race.
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{dbs[1].Schema, "pgbox_relay_lanes"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	unlocked := make(chan struct{})
	go func() { time.Sleep(1500 * time.Millisecond); _ = tx.Rollback(ctx); close(unlocked) }()
	defer func() { <-unlocked; locker.Close(ctx) }()

	stop := make(chan struct{})
	var drops atomic.Int64
	var low atomic.Uint64
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Go(func() {
		last := f.Stats().Published
		close(started)
		for {
			select {
			case <-stop:
				return
			default:
			}
			p := f.Stats().Published
			if p < last {
				drops.Add(1)
				low.Store(p)
			}
			last = max(last, p)
		}
	})
	<-started
	require.NoError(t, f.SetTargets(targets[:1]))
	require.NoError(t, f.SetTargets(nil))
	close(stop)
	wg.Wait()
	require.EqualValues(t, 100, f.Stats().Published)
	require.Zero(t, drops.Load(), "Stats().Published went back (to %d of 100) while SetTargets stopped a removed target", low.Load())
}

// Attack 3b: SetTargets churn while Run starts and stops, under -race:
// targets removed and re-added by name quickly, concurrent SetTargets
// calls, a second Run (ErrRunning), Run started again after it returned.
// Writers write counted rows (per key) the whole time.
//
// Must hold: every row reaches Kafka, each key in order (duplicates only
// as at-least-once repeats of the same event id), no goroutine leaks
// (TestMain's goleak), Run returns nil.
func TestFleetAttackSetTargetsChurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	pool, _ := faDecoyPool(t, 3)
	var bundles []*testBundle
	var targets []relay.Target
	for i := range 3 {
		db := testdb.New(t)
		b := &testBundle{db: db, addrs: addrs, topic: topicOf(i)}
		kafkatest.CreateTopic(t, addrs, b.topic, 3, nil)
		createCounters(t, b, 5)
		bundles = append(bundles, b)
		targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
	}
	cfg := faConfig(addrs, "churn")
	cfg.BatchSize = 7
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets[:1]})
	require.NoError(t, err)

	wctx, wstop := context.WithCancel(ctx)
	defer wstop()
	var wg sync.WaitGroup
	for _, b := range bundles {
		wg.Go(func() {
			for i := 0; wctx.Err() == nil; i++ {
				require.NoError(t, writeCounted(ctx, b, keyed(i%5)))
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	for round := range 3 {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		var churn sync.WaitGroup
		for g := range 3 { // SetTargets racing Run's start and each other
			churn.Go(func() {
				for i := range 15 {
					k := (g + i + round) % 4
					var ts []relay.Target
					switch k {
					case 0:
						ts = targets
					case 1:
						ts = targets[:2]
					case 2:
						ts = []relay.Target{targets[2], targets[0]}
					case 3:
						ts = nil
					}
					require.NoError(t, f.SetTargets(ts))
					_ = f.Stats()
					_ = f.Targets()
					time.Sleep(time.Duration(i%3) * 15 * time.Millisecond)
				}
			})
		}
		go func() { done <- f.Run(runCtx) }()
		time.Sleep(20 * time.Millisecond)
		require.ErrorIs(t, f.Run(runCtx), relay.ErrRunning, "a second Run while one runs")
		churn.Wait()
		require.NoError(t, f.SetTargets(targets))
		time.Sleep(300 * time.Millisecond)
		if round < 2 {
			cancel() // Run returns; the next round runs it again
			require.NoError(t, <-done)
			continue
		}
		wstop()
		wg.Wait()
		for _, b := range bundles {
			waitFor(t, b.topic+" drained", func() bool { return faCount(t, b.db.Pool) == 0 })
		}
		cancel()
		require.NoError(t, <-done)
	}
	for _, b := range bundles {
		var total int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT sum(n) FROM counters`).Scan(&total))
		got := readEvents(t, b, total)
		dups := checkOrder(t, b, got)
		t.Logf("%s: %d events, %d duplicates", b.topic, total, dups)
	}
	for _, s := range f.Targets() {
		require.Equal(t, "stopped", s.State, "%s", s.Name)
	}
}

// Attack 3c: the same schema listed twice under two names (two instances
// of one schema in one process), with concurrent counted writers.
//
// Must hold: the leases split the lanes between the two; every row
// arrives, each key in order.
func TestFleetAttackSameSchemaTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	pool, _ := faDecoyPool(t, 3)
	db := testdb.New(t)
	b := &testBundle{db: db, addrs: addrs, topic: "twice"}
	kafkatest.CreateTopic(t, addrs, b.topic, 3, nil)
	createCounters(t, b, 8)
	cfg := faConfig(addrs, "twice")
	cfg.BatchSize = 5
	// Never dormant: a dormant target holds no lanes, and whichever woke
	// first could drain every row before the other's question saw one (the
	// wait below then timed out, about one run in five).
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, DormantAfter: -1, Targets: []relay.Target{
		{Name: "one", Pool: pool, Schema: db.Schema}, {Name: "two", Pool: pool, Schema: db.Schema}}})
	require.NoError(t, err)
	runFleet(t, f)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 60 {
				require.NoError(t, writeCounted(ctx, b, keyed((w+i)%8)))
			}
		})
	}
	waitFor(t, "both hold lanes", func() bool {
		one, two := faState(t, f, "one"), faState(t, f, "two")
		return one.Stats.Lanes > 0 && two.Stats.Lanes > 0 && one.Stats.Lanes+two.Stats.Lanes == 8
	})
	// Flip one of them out and back in while writers run.
	require.NoError(t, f.SetTargets([]relay.Target{{Name: "one", Pool: pool, Schema: db.Schema}}))
	require.NoError(t, f.SetTargets([]relay.Target{{Name: "one", Pool: pool, Schema: db.Schema}, {Name: "two", Pool: pool, Schema: db.Schema}}))
	wg.Wait()
	waitFor(t, "drained", func() bool { return faCount(t, db.Pool) == 0 })
	got := readEvents(t, b, 240)
	dups := checkOrder(t, b, got)
	t.Logf("%d duplicates", dups)
	require.EqualValues(t, 240, f.Stats().Published)
}

// Attack 1e: the target's schema is dropped (CASCADE) while its relay
// runs, then recreated and migrated; another target names a schema that
// never existed. The pool's search_path is a decoy schema with pgbox
// tables: a statement that fell back to the pool's path would find them.
//
// Must hold: the dropped target is reported (needs operator), never falls
// through to the decoy, and runs again once the schema is back; the
// missing one stays "needs operator"; the decoy is untouched.
func TestFleetAttackSchemaDroppedMidRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := testdb.ServerURL(t)
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	kafkatest.CreateTopic(t, addrs, "gone", 3, nil)
	pool, decoy := faDecoyPool(t, 2)
	name := "gone_" + decoy.Schema
	w := faSchema(t, server, name, true)
	faWrite(t, w, "gone", "first", 5, false)
	f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "gone"), NeedsOperatorRetry: 300 * time.Millisecond,
		Targets: []relay.Target{{Name: "gone", Pool: pool, Schema: name}, {Name: "never", Pool: pool, Schema: "never_" + decoy.Schema}}})
	require.NoError(t, err)
	runFleet(t, f)
	require.Len(t, kafkatest.ReadAll(t, addrs, "gone", 5, 10*time.Second), 5)

	admin, err := pgx.Connect(ctx, server)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	waitFor(t, "the dropped target reported", func() bool { return faState(t, f, "gone").State == "needs operator" })
	require.ErrorIs(t, faState(t, f, "gone").Err, relay.ErrNeedsOperator)
	// Each retry (NeedsOperatorRetry) runs the missing one again until its
	// first statement fails: "running" for that moment, longer on a loaded
	// machine (make test saw it so once).
	waitFor(t, "the missing one reported", func() bool { return faState(t, f, "never").State == "needs operator" })
	var owned int
	require.NoError(t, decoy.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_instances`).Scan(&owned))
	require.Zero(t, owned, "no relay registered in the decoy")

	// Back, migrated, with rows: published by the next try.
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	wcfg := w.Config().Copy()
	s := stdlib.OpenDB(*wcfg.ConnConfig)
	defer s.Close()
	require.NoError(t, migrations.Up(ctx, s))
	w.Reset() // the writer's connections cached plans of the old tables
	faWrite(t, w, "gone", "second", 5, false)
	got := kafkatest.ReadAll(t, addrs, "gone", 10, 15*time.Second)
	require.Len(t, got, 10)
	waitFor(t, "running again", func() bool { return faState(t, f, "gone").State == "running" })
}

// Attack 4: the shared Kafka client. The broker drops every connection
// for a while (sarama's client runs out of brokers; one relay replaces the
// shared client, closing the old one under the others' feet), while three
// targets send.
//
// Must hold: once the broker is back, every row of every target arrives,
// each key in order; nothing is parked (a closed client is transient).
func TestFleetAttackSharedClientOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	pool, _ := faDecoyPool(t, 4)
	var bundles []*testBundle
	var targets []relay.Target
	for i := range 3 {
		db := testdb.New(t)
		b := &testBundle{db: db, addrs: addrs, topic: topicOf(i), cluster: c}
		kafkatest.CreateTopic(t, addrs, b.topic, 3, nil)
		createCounters(t, b, 4)
		bundles = append(bundles, b)
		targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
	}
	cfg := faConfig(addrs, "outage")
	cfg.BatchSize = 5
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets})
	require.NoError(t, err)
	runFleet(t, f)
	write := func(n int) {
		var wg sync.WaitGroup
		for _, b := range bundles {
			wg.Go(func() {
				for i := range n {
					require.NoError(t, writeCounted(ctx, b, keyed(i%4)))
				}
			})
		}
		wg.Wait()
	}
	write(10)
	waitFor(t, "first rows out", func() bool { return f.Stats().Published == 30 })

	var down atomic.Bool
	down.Store(true)
	c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		return nil, errors.New("broker down"), true
	})
	write(20)
	waitFor(t, "every target retrying", func() bool { return f.Stats().Retried >= 30 })
	time.Sleep(time.Second)
	down.Store(false)
	for _, b := range bundles {
		waitFor(t, b.topic+" drained", func() bool { return faCount(t, b.db.Pool) == 0 })
		checkOrder(t, b, readEvents(t, b, 30))
	}
	require.Zero(t, f.Stats().Parked)
}

// Attack 4b: a relay must stop within StopTimeout whatever the broker does
// (producer.go's await). A Fleet's relays share kafkaClient, whose mutex
// is held while one of them connects (or replaces the client): sarama's
// NewClient against a broker that accepts connections and never answers
// holds it for Net.ReadTimeout (30 s) times its retries. A target removed
// meanwhile waits in kafkaClient.connect's k.mu.Lock(), which no context
// ends, so SetTargets does not return.
//
// Must hold: SetTargets removing a target returns within StopTimeout (plus
// slack) while another target is connecting to a hanging broker.
func TestFleetAttackHangingBrokerBlocksRemoval(t *testing.T) {
	t.Parallel()
	addr, accepted := kafkatest.HangingBroker(t)
	pool, _ := faDecoyPool(t, 2)
	a, b := testdb.New(t), testdb.New(t)
	cfg := faConfig([]string{addr}, "hang")
	cfg.StopTimeout = time.Second
	targets := []relay.Target{{Name: "a", Pool: pool, Schema: a.Schema}, {Name: "b", Pool: pool, Schema: b.Schema}}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets[:1]})
	require.NoError(t, err)
	runFleet(t, f)
	// a connects: it holds the shared client's lock for sarama's timeouts.
	waitFor(t, "a connection to the hanging broker", func() bool { return accepted() > 0 })
	require.NoError(t, f.SetTargets(targets)) // b starts, and waits for a's connect
	time.Sleep(500 * time.Millisecond)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		_ = f.SetTargets(targets[:1]) // b leaves
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		// The fleet's stop at cleanup ends a's connect, and so b's wait.
		t.Errorf("SetTargets has not returned %s after removing a target (StopTimeout 1s): the removed relay waits for another relay's connect to a hanging broker (kafkaClient.mu)",
			time.Since(start).Round(time.Second))
	}
}

// faPgbouncerURL is PGBOX_PGBOUNCER_URL, or a private pgbouncer (transaction
// pool mode) in front of DATABASE_URL's server started by
// scripts/pgbouncer.sh (as the integration tests do).
func faPgbouncerURL(t *testing.T) string {
	t.Helper()
	if u := os.Getenv("PGBOX_PGBOUNCER_URL"); u != "" {
		return u
	}
	cmd := exec.Command(filepath.Join("..", "scripts", "pgbouncer.sh"), "url")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testdb.ServerURL(t))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("no pgbouncer (set PGBOX_PGBOUNCER_URL): %v", err)
	}
	return strings.TrimSpace(string(out))
}

// Attack 2: pgbouncer in transaction pool mode. Server connections pass
// from client to client between transactions, with whatever session state
// the last client left: here noise clients keep running a session-level
// SET search_path TO <decoy> (a schema with pgbox tables) and reading the
// decoy, so the server connections the relays get usually carry the
// decoy's path. Pools go through pgbouncer in Exec and SimpleProtocol
// modes (no server-side prepared statements through a transaction pooler).
//
// Must hold: a pipelined set_config LOCAL + statement stays on one server
// connection (one implicit transaction): every target publishes its own
// rows and only those; the decoy is untouched.
func TestFleetAttackPgbouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := faPgbouncerURL(t)
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	decoy := testdb.New(t)
	faWrite(t, decoy.Pool, "decoy", "decoy", 10, false)

	noiseCtx, stopNoise := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopNoise(); wg.Wait() }()
	noise := faPool(t, bouncer, "", pgx.QueryExecModeSimpleProtocol, 4)
	var noiseRuns atomic.Int64
	for range 4 {
		wg.Go(func() {
			for noiseCtx.Err() == nil {
				_, _ = noise.Exec(noiseCtx, "SET search_path TO "+pgx.Identifier{decoy.Schema}.Sanitize())
				var n int
				if noise.QueryRow(noiseCtx, "SELECT count(*) FROM pgbox_outbox").Scan(&n) == nil {
					noiseRuns.Add(1)
				}
			}
		})
	}
	waitFor(t, "the noise clients leave the decoy's path on server connections", func() bool { return noiseRuns.Load() > 20 })

	var targets []relay.Target
	var dbs []*testdb.DB
	for i, m := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		db := testdb.New(t)
		dbs = append(dbs, db)
		kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
		faWrite(t, db.Pool, topicOf(i), db.Schema, 60, false)
		targets = append(targets, relay.Target{Name: topicOf(i), Pool: faPool(t, bouncer, "", m, 3), Schema: db.Schema})
	}
	cfg := faConfig(addrs, "bouncer")
	cfg.NoListen, cfg.BatchSize = true, 7
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets})
	require.NoError(t, err)
	runFleet(t, f)
	for i, db := range dbs {
		got := kafkatest.ReadAll(t, addrs, topicOf(i), 60, 20*time.Second)
		require.Len(t, got, 60, "targets: %+v", f.Targets())
		for _, g := range got {
			require.Equal(t, db.Schema, string(g.Value))
		}
		waitFor(t, "drained", func() bool { return faCount(t, db.Pool) == 0 })
	}
	require.Equal(t, 10, faCount(t, decoy.Pool), "the decoy was not touched")
	var inst int
	require.NoError(t, decoy.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_instances`).Scan(&inst))
	require.Zero(t, inst, "no relay registered in the decoy")
	t.Logf("noise statements: %d", noiseRuns.Load())
}

// Attack 1g: the pool's own search_path finds an OLDER pgbox (a
// single-tenant deploy's schema left at migration 00110, before
// pgbox_outbox_claim2 existed), the target's schema is fully migrated.
// Default exec mode (CacheStatement): statements are parse-analysed under
// the pool's path before set_config runs (see TestFleetAttackExecModes).
//
// Must hold: the target's relay runs on its own, fully migrated schema;
// what another schema on the pool's path holds is irrelevant.
func TestFleetAttackStalePgboxOnPoolPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := testdb.ServerURL(t)
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	kafkatest.CreateTopic(t, addrs, "stale", 3, nil)
	old := testdb.Empty(t)
	s := old.SQL(t)
	p, err := migrations.NewProvider(s, migrations.Config{})
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 110)
	require.NoError(t, err)
	db := testdb.New(t)
	faWrite(t, db.Pool, "stale", db.Schema, 10, false)
	cfg := faConfig(addrs, "stale")
	cfg.Pool, cfg.Schema = faPool(t, server, old.Schema, pgx.QueryExecModeCacheStatement, 2), db.Schema
	r, err := relay.New(cfg)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	got := kafkatest.ReadAll(t, addrs, "stale", 10, 8*time.Second)
	cancel()
	runErr := <-done
	require.Len(t, got, 10, "the relay of fully migrated schema %s published %d of 10 rows; Run: %v", db.Schema, len(got), runErr)
	require.NoError(t, runErr)
}

// Attack 1c': the names search_path reads specially even when quoted:
// "$user" (the schema named after CURRENT_USER; see
// TestFleetAttackDollarUserSchema) and "pg_temp" (the connection's own
// temporary schema: a pooled connection's temp tables named pgbox_*,
// created by any client of the pool, would be the relay's tables).
//
// Must hold: Config.Schema and Target.Schema refuse them.
func TestFleetAttackReservedPathNames(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	for _, s := range []string{"$user", "pg_temp"} {
		_, err := relay.New(relay.Config{Pool: pool, Brokers: []string{"127.0.0.1:9"}, Schema: s})
		require.Error(t, err, "Config.Schema %q is accepted, but set_config('search_path', %q) does not name that schema", s, pgx.Identifier{s}.Sanitize())
		_, err = relay.NewFleet(relay.FleetConfig{Relay: relay.Config{Brokers: []string{"127.0.0.1:9"}},
			Targets: []relay.Target{{Pool: pool, Schema: s}}})
		require.Error(t, err, "Target.Schema %q", s)
	}
}
