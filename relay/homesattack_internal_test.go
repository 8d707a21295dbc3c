package relay

// Hostile review of home connections (homes.go) and per-schema prepared
// statements (db.go), white-box part: see homesattack_test.go.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// haHomePool is a pool of MaxConns 4 (two homes) whose search_path is a
// decoy schema, lock_timeout 300ms; and the decoy.
func haHomePool(t *testing.T) (*pgxpool.Pool, *testdb.DB) {
	t.Helper()
	decoy := testdb.New(t)
	cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{decoy.Schema}.Sanitize()
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "300ms"
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, decoy
}

// haProbe makes table ha_probe(v) holding the schema's name and
// ha_uniq(k primary key) holding 1 in each of dbs' schemas.
func haProbe(t *testing.T, dbs ...*testdb.DB) {
	t.Helper()
	for _, db := range dbs {
		s := pgx.Identifier{db.Schema}.Sanitize()
		_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %[1]s.ha_probe(v text); INSERT INTO %[1]s.ha_probe VALUES (%[2]s);
			CREATE TABLE %[1]s.ha_uniq(k int PRIMARY KEY); INSERT INTO %[1]s.ha_uniq VALUES (1)`, s, "'"+db.Schema+"'"))
		require.NoError(t, err)
	}
}

// Attack: schema leakage on a shared home connection. Targets A and B
// share home 0. A's statement fails mid-pipeline (a constraint error, a
// lock_timeout, its context canceled while it waits on a lock, an error
// inside a transaction, a transaction rolled back); the next statement on
// the same backend is B's.
//
// Must hold: B's statements run in B's schema (current_schema, its
// ha_probe), on the home's backend, every time.
func TestHomesAttackSchemaNeverLeaksAfterFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, decoy := haHomePool(t)
	a, b := testdb.New(t), testdb.New(t)
	haProbe(t, a, b, decoy)
	h := newHomes(pool)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	da, dbb := newDB(pool, a.Schema), newDB(pool, b.Schema)
	da.homes, dbb.homes = h, h // both on home 0
	type where struct {
		pid    int32
		schema string
		probe  string
	}
	at := func(d *db) where {
		t.Helper()
		var w where
		require.NoError(t, d.queryRow(ctx, `SELECT pg_backend_pid(), current_schema(), (SELECT v FROM ha_probe)`, nil, &w.pid, &w.schema, &w.probe))
		return w
	}
	home := at(dbb).pid
	aLocked := false
	check := func(what string) {
		t.Helper()
		for range 3 {
			w := at(dbb)
			require.Equal(t, where{home, b.Schema, b.Schema}, where{w.pid, w.schema, w.probe}, "after %s: B's statement ran elsewhere than B's schema", what)
			home = w.pid
			if aLocked {
				continue
			}
			wa := at(da)
			require.Equal(t, a.Schema, wa.schema, "after %s: A's statement in A's schema", what)
			require.Equal(t, a.Schema, wa.probe, "after %s", what)
		}
	}
	check("nothing")

	_, err := da.exec(ctx, `INSERT INTO ha_uniq VALUES (1)`)
	require.Error(t, err, "a duplicate key")
	check("A's constraint error")

	lockA := func() func() {
		c, err := pgx.Connect(ctx, testdb.ServerURL(t))
		require.NoError(t, err)
		tx, err := c.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %s.ha_probe IN ACCESS EXCLUSIVE MODE`, pgx.Identifier{a.Schema}.Sanitize()))
		require.NoError(t, err)
		return func() { _ = tx.Rollback(ctx); _ = c.Close(ctx) }
	}
	unlock := lockA()
	aLocked = true
	_, err = da.exec(ctx, `SELECT count(*) FROM ha_probe`)
	require.Error(t, err, "A's lock_timeout")
	check("A's lock_timeout")

	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = da.exec(cctx, `SELECT count(*) FROM ha_probe`)
	cancel()
	require.Error(t, err, "A's statement canceled")
	unlock()
	aLocked = false
	home = at(dbb).pid // a canceled statement may cost the connection
	check("A's canceled statement")

	boom := errors.New("boom")
	err = da.begin(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ha_probe VALUES ('a2')`); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	check("A's transaction rolled back")
	err = da.begin(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO ha_uniq VALUES (1)`)
		return err
	})
	require.Error(t, err)
	check("A's transaction failed on a constraint")
	err = da.begin(ctx, func(tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, `INSERT INTO ha_uniq VALUES (1)`)
		return nil // commit of an aborted transaction: a rollback
	})
	require.Error(t, err, "the commit of an aborted transaction reports its rollback")
	check("A's aborted transaction committed")

	var n int
	require.NoError(t, a.Pool.QueryRow(ctx, `SELECT count(*) FROM ha_probe`).Scan(&n))
	require.Equal(t, 1, n, "A's rolled back insert is gone")
	require.NoError(t, decoy.Pool.QueryRow(ctx, `SELECT count(*) FROM ha_probe`).Scan(&n))
	require.Equal(t, 1, n, "the decoy untouched")
}

// Attack: an operator (or a pooler) runs DEALLOCATE ALL / DISCARD ALL on
// a home connection, and a migration changes the result shape of a
// function a prepared statement calls (cached plan must not change
// result type), in one schema of two sharing the home.
//
// Must hold: at most one statement fails, the next run (and the other
// schema's are not broken).
func TestHomesAttackPreparedGoneOrChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := haHomePool(t)
	a, b := testdb.New(t), testdb.New(t)
	for _, db := range []*testdb.DB{a, b} {
		_, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %s.ha_f() RETURNS TABLE(x int) LANGUAGE sql AS 'SELECT 1'`, pgx.Identifier{db.Schema}.Sanitize()))
		require.NoError(t, err)
	}
	h := newHomes(pool)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	da, dbb := newDB(pool, a.Schema), newDB(pool, b.Schema)
	da.homes, dbb.homes = h, h
	call := func(d *db) error {
		return d.query(ctx, `SELECT * FROM ha_f()`, nil, func(rows pgx.Rows) error {
			for rows.Next() {
			}
			return rows.Err()
		})
	}
	recovers := func(what string, d *db) {
		t.Helper()
		var errs []error
		for range 3 {
			err := call(d)
			if err == nil {
				break
			}
			errs = append(errs, err)
		}
		require.LessOrEqual(t, len(errs), 1, "after %s: at most one statement fails; got %v", what, errs)
		require.NoError(t, call(d), "after %s", what)
		// The other schema's statement has its own name: the failure of
		// the first made the connection forget them all, so it does not
		// fail in turn.
		require.NoError(t, call(dbb), "after %s: the other schema's statement, at once", what)
		require.NoError(t, call(da), "after %s", what)
	}
	require.NoError(t, call(da))
	require.NoError(t, call(dbb))

	for _, op := range []string{"DEALLOCATE ALL", "DISCARD ALL"} {
		c, _, _ := h.take(0, time.Now())
		require.NotNil(t, c, "home 0 holds a connection")
		_, err := c.Exec(ctx, op)
		require.NoError(t, err)
		require.True(t, h.keep(0, c))
		recovers(op, da)
	}

	_, err := a.Pool.Exec(ctx, fmt.Sprintf(`DROP FUNCTION %[1]s.ha_f(); CREATE FUNCTION %[1]s.ha_f() RETURNS TABLE(x int, y text) LANGUAGE sql AS $$SELECT 1, 'y'$$`,
		pgx.Identifier{a.Schema}.Sanitize()))
	require.NoError(t, err)
	recovers("a migration changed ha_f's result shape", da)
	_, err = a.Pool.Exec(ctx, fmt.Sprintf(`CREATE OR REPLACE VIEW %[1]s.ha_v AS SELECT 1 AS x`, pgx.Identifier{a.Schema}.Sanitize()))
	require.NoError(t, err)
}

// Attack: preparedPerConn lowered so connections DeallocateAll often,
// while the Fleet's idle poll and busy targets' watch keep prepared
// questions on the same connections (idlePreparedOn). Not parallel: it
// sets a package variable.
//
// Must hold: every row of busy and dormant targets arrives; no target
// needs an operator.
func TestHomesAttackDeallocateAllWithIdleQuestions(t *testing.T) {
	old := preparedPerConn
	preparedPerConn = 3
	t.Cleanup(func() { preparedPerConn = old })
	haFleetRows(t, 4)
	haFleetRows(t, 6)
}

func haFleetRows(t *testing.T, maxConns int32) {
	t.Helper()
	ctx := context.Background()
	k := haKafka(t)
	pool, _ := haHomePool(t)
	cfgp := pool.Config()
	cfgp.MaxConns = maxConns
	cfgp.ConnConfig.RuntimeParams["lock_timeout"] = "0"
	pool, err := pgxpool.NewWithConfig(ctx, cfgp)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var dbs []*testdb.DB
	var targets []Target
	for i := range 8 {
		db := testdb.New(t)
		dbs = append(dbs, db)
		k.topic(t, fmt.Sprintf("ha-%d", i))
		targets = append(targets, Target{Name: fmt.Sprintf("ha-%d", i), Pool: pool, Schema: db.Schema})
	}
	cfg := k.config("ha-dealloc")
	cfg.Kafka.Producer.RequiredAcks = sarama.WaitForAll
	cfg.NoListen = true
	f, err := NewFleet(FleetConfig{Relay: cfg, Targets: targets, DormantAfter: 500 * time.Millisecond})
	require.NoError(t, err)
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return")
		}
	})
	time.Sleep(1500 * time.Millisecond)
	for round := range 6 {
		for i, db := range dbs {
			if i%2 == 0 || round%3 == 0 {
				k.write(t, db, fmt.Sprintf("ha-%d", i), round*10, 10)
			}
		}
		time.Sleep(700 * time.Millisecond)
	}
	for i := range dbs {
		want := 20
		if i%2 == 0 {
			want = 60
		}
		k.expect(t, fmt.Sprintf("ha-%d", i), want, 30*time.Second)
	}
	for _, s := range f.Targets() {
		require.Equal(t, "running", s.State, "target %s: %v", s.Name, s.Err)
	}
}

type haK struct{ addrs []string }

func haKafka(t *testing.T) *haK { return &haK{addrs: kafkatest.New(t).ListenAddrs()} }

func (k *haK) topic(t *testing.T, name string) { kafkatest.CreateTopic(t, k.addrs, name, 3, nil) }

func (k *haK) config(name string) Config {
	return Config{Brokers: k.addrs, Kafka: kafkatest.Config(), Instance: name, Lanes: 8,
		HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second, PollInterval: 200 * time.Millisecond,
		MaxBackoff: 500 * time.Millisecond}
}

// write commits n rows on topic, values from.. (zero-padded), keys k0..k4.
func (k *haK) write(t *testing.T, db *testdb.DB, topic string, from, n int) {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{})
	require.NoError(t, err)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		v := from + i
		msgs[i] = outbox.Message{Topic: topic, Key: []byte(fmt.Sprintf("k%d", v%5)), Value: []byte(fmt.Sprintf("%07d", v))}
	}
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))
}

// expect: every value 0..n-1 on topic within timeout, per-key order.
func (k *haK) expect(t *testing.T, topic string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	seen := map[string]bool{}
	var got []*sarama.ConsumerMessage
	for {
		got = kafkatest.ReadAll(t, k.addrs, topic, n, time.Until(deadline)+time.Millisecond)
		clear(seen)
		for _, m := range got {
			seen[string(m.Value)] = true
		}
		if len(seen) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Len(t, seen, n, "%s: distinct rows on Kafka", topic)
	last, first := map[string]string{}, map[string]bool{}
	for _, m := range got {
		if first[string(m.Value)] {
			continue
		}
		first[string(m.Value)] = true
		if l, ok := last[string(m.Key)]; ok {
			require.Greater(t, string(m.Value), l, "%s: key %s order", topic, m.Key)
		}
		last[string(m.Key)] = string(m.Value)
	}
}
