package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// tenants is one broker and several migrated schemas in one database, and
// a small pool shared by their relays whose own search_path is a decoy
// schema holding pgbox tables too: a statement that ran without its
// target's schema would find the decoy's rows.
type tenants struct {
	addrs   []string
	decoy   *testdb.DB
	schemas []*testdb.DB
	shared  *pgxpool.Pool
}

func newTenants(t *testing.T, n int) *tenants {
	t.Helper()
	c := kafkatest.New(t, kfake.SeedTopics(3, "decoy"))
	ts := &tenants{addrs: c.ListenAddrs(), decoy: testdb.New(t)}
	for i := range n {
		ts.schemas = append(ts.schemas, testdb.New(t))
		kafkatest.CreateTopic(t, ts.addrs, topicOf(i), 3, nil)
	}
	cfg, err := pgxpool.ParseConfig(ts.decoy.URL)
	require.NoError(t, err)
	cfg.MaxConns = 2 // every relay's statements take turns on two connections
	ts.shared, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(ts.shared.Close)
	return ts
}

func topicOf(i int) string { return fmt.Sprintf("tenant-%d", i) }

// write commits n rows to db's outbox on topic, through db's own pool.
func writeTo(t *testing.T, db *testdb.DB, topic string, n int, notify bool) {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Notify: notify})
	require.NoError(t, err)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Key: []byte(keyed(i)), Value: []byte(db.Schema)}
	}
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))
}

func count(t *testing.T, db *testdb.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
	return n
}

func (ts *tenants) relayConfig(name string) relay.Config {
	b := &testBundle{addrs: ts.addrs}
	cfg := b.configWithPool(nil, name)
	cfg.Channel = ""
	return cfg
}

// Relays of two schemas share one pool of two connections whose
// search_path is a third schema: each publishes its own schema's rows and
// nothing else, and the pool's connections keep their own search_path.
func TestSchemaSharedPoolNeverCrosses(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 2)
	writeTo(t, ts.decoy, "decoy", 50, false)
	for i, db := range ts.schemas {
		writeTo(t, db, topicOf(i), 200, false)
	}
	for i, db := range ts.schemas {
		cfg := ts.relayConfig(fmt.Sprintf("tenant-%d", i))
		cfg.Pool, cfg.Schema, cfg.BatchSize = ts.shared, db.Schema, 30
		start(t, cfg)
	}
	for i, db := range ts.schemas {
		got := kafkatest.ReadAll(t, ts.addrs, topicOf(i), 200, 30*time.Second)
		require.Len(t, got, 200)
		for _, m := range got {
			require.Equal(t, db.Schema, string(m.Value), "a record of topic %s came from another schema", topicOf(i))
		}
		waitFor(t, "schema "+db.Schema+" drained", func() bool { return count(t, db) == 0 })
	}
	require.Equal(t, 50, count(t, ts.decoy), "the decoy schema (the pool's search_path) was not touched")
	require.Empty(t, kafkatest.ReadAll(t, ts.addrs, "decoy", 1, 2*time.Second))
	var lanes int
	require.NoError(t, ts.decoy.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL`).Scan(&lanes))
	require.Zero(t, lanes, "no relay took the decoy's lanes")
	for range 4 { // each of the pool's connections, whatever it ran
		var path string
		require.NoError(t, ts.shared.QueryRow(context.Background(), `SHOW search_path`).Scan(&path))
		require.Equal(t, ts.decoy.Schema, path)
	}
}

func TestConfigSchemaRefused(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	for _, s := range []string{" tenant", "tenant\n", string(make([]byte, 64)), "a\x00b"} {
		_, err := relay.New(relay.Config{Pool: pool, Brokers: []string{"127.0.0.1:9"}, Schema: s})
		require.ErrorContains(t, err, "Config.Schema", "schema %q", s)
	}
}

// A Fleet serves several schemas through one pool: each target's rows
// reach Kafka; a target without pgbox's tables is reported and retried,
// and runs once its tables exist, without holding the others back; a
// target removed stops and gives its lanes up, one added starts.
func TestFleetServesTargets(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 3)
	ctx := context.Background()
	empty := testdb.Empty(t)
	kafkatest.CreateTopic(t, ts.addrs, "late", 3, nil)
	targets := []relay.Target{{Name: "t0", Pool: ts.shared, Schema: ts.schemas[0].Schema},
		{Name: "t1", Pool: ts.shared, Schema: ts.schemas[1].Schema},
		{Name: "late", Pool: ts.shared, Schema: empty.Schema}}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: ts.relayConfig("fleet"), Targets: targets, NeedsOperatorRetry: 300 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	writeTo(t, ts.schemas[0], topicOf(0), 60, true)
	writeTo(t, ts.schemas[1], topicOf(1), 60, true)
	// Rows whose writer sends no notification are found by the idle poll
	// (which asks first whether the outbox holds any row).
	writeTo(t, ts.schemas[0], topicOf(0), 40, false)
	writeTo(t, ts.schemas[1], topicOf(1), 40, false)
	for i := range 2 {
		got := kafkatest.ReadAll(t, ts.addrs, topicOf(i), 100, 30*time.Second)
		require.Len(t, got, 100)
		for _, m := range got {
			require.Equal(t, ts.schemas[i].Schema, string(m.Value))
		}
	}
	state := func(name string) relay.TargetState { return targetState(t, f, name) }
	waitFor(t, "the empty schema reported", func() bool { return state("late").State == "needs operator" })
	require.ErrorIs(t, state("late").Err, relay.ErrNeedsOperator)
	require.ErrorContains(t, state("late").Err, "migrate")
	require.Equal(t, "running", state("t0").State)
	require.Equal(t, map[string]int{"running": 2, "needs operator": 1}, f.TargetCounts())

	// Its tables appear: the next try runs it.
	migrateEmpty(t, empty)
	writeTo(t, empty, "late", 10, false)
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, "late", 10, 30*time.Second), 10)
	waitFor(t, "late running", func() bool { return state("late").State == "running" && state("late").Stats.Lanes > 0 })

	// t1 leaves, t2 joins.
	require.NoError(t, f.SetTargets([]relay.Target{targets[0], targets[2], {Name: "t2", Pool: ts.shared, Schema: ts.schemas[2].Schema}}))
	var owned int
	require.NoError(t, ts.schemas[1].Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL`).Scan(&owned))
	require.Zero(t, owned, "the removed target gave its lanes up before SetTargets returned")
	writeTo(t, ts.schemas[1], topicOf(1), 5, true)
	writeTo(t, ts.schemas[2], topicOf(2), 20, true)
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(2), 20, 30*time.Second), 20)
	time.Sleep(time.Second) // well past a poll: the removed target's rows stay
	require.Equal(t, 5, count(t, ts.schemas[1]))
	st := f.Stats()
	require.EqualValues(t, 100+100+10+20, st.Published, "published by every target, the removed one's included (counters never go back)")

	err = f.SetTargets([]relay.Target{targets[0], targets[0]})
	require.ErrorContains(t, err, `"t0" is used twice`)
	require.Len(t, f.Targets(), 3, "a refused list changes nothing")
}

// migrateEmpty applies pgbox's migrations to db's (empty) schema.
func migrateEmpty(t *testing.T, db *testdb.DB) {
	t.Helper()
	s := db.SQL(t)
	require.NoError(t, migrations.Up(context.Background(), s))
}

// A Fleet's relay does not claim again at once after a batch that emptied
// its outbox: a claim that finds nothing costs its database far more than
// the watch that finds what came since (a hundred busy targets spent a
// third of their claims on nothing). Thirty rows committed one at a time
// are thirty batches; the claims that found nothing are counted from
// pg_stat_user_functions.
func TestFleetNoEmptyClaimAfterBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ts := newTenants(t, 1)
	db := ts.schemas[0]
	cfg, err := pgxpool.ParseConfig(ts.decoy.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["track_functions"] = "pl"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f, err := relay.NewFleet(relay.FleetConfig{Relay: ts.relayConfig("no-empty-claim"), DormantAfter: -1,
		Targets: []relay.Target{{Name: "t", Pool: pool, Schema: db.Schema}}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	waitFor(t, "lanes taken", func() bool { return f.Stats().Lanes > 0 })

	calls := func() int64 {
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions
			WHERE schemaname = $1 AND funcname = 'pgbox_outbox_claim2'`, db.Schema).Scan(&n))
		return n
	}
	batches0 := f.Stats().Batches
	const rows = 30
	for i := range rows {
		writeTo(t, db, topicOf(0), 1, false)
		want := uint64(i + 1)
		waitFor(t, "row published", func() bool { return f.Stats().Published >= want })
	}
	batches := f.Stats().Batches - batches0
	require.EqualValues(t, rows, batches, "one batch a row")
	time.Sleep(1500 * time.Millisecond) // every backend's function counts reported (at most once a second)
	claims := calls()
	t.Logf("%d batches, %d claims in all (the idle polls' and stale full claims included)", batches, claims)
	require.Less(t, claims, int64(batches)+15, "claims that found nothing after a batch")
}
