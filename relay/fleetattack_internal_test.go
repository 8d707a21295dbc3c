package relay

// Hostile review of Config.Schema (db.go) and Fleet (fleet.go), white-box
// part: see fleetattack_test.go for the end-to-end attacks.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
)

// Attack 5: notification dispatch. Payloads as writers send them
// (current_schema() ':' slots), of old writers ("3,17"), of a writer whose
// current_schema() is NULL (":3"), naming a schema no target serves, and
// schema names holding ':' (the separator) or being a prefix of another.
//
// Must hold: the named target's relays get exactly the named slots; a
// payload naming no served schema wakes every target of the pool (never
// none); a relay of another pool is never woken.
func TestFleetAttackWakeDispatch(t *testing.T) {
	pool, other := &pgxpool.Pool{}, &pgxpool.Pool{}
	f := &Fleet{targets: map[string]*fleetTarget{}}
	schemas := map[string]string{"a": "a", "co": "co", "colon": "co:lon", "colon2": "co:lon", "stopped": "b"}
	relays := map[string]*Relay{}
	for name, schema := range schemas {
		r, err := New(Config{Pool: pool, Brokers: []string{"127.0.0.1:9"}})
		require.NoError(t, err)
		ft := &fleetTarget{t: Target{Name: name, Pool: pool, Schema: schema}}
		if name != "stopped" { // a target waiting for an operator has no relay
			ft.r = r
			relays[name] = r
		}
		f.targets[name] = ft
	}
	elsewhere, err := New(Config{Pool: other, Brokers: []string{"127.0.0.1:9"}})
	require.NoError(t, err)
	f.targets["elsewhere"] = &fleetTarget{t: Target{Name: "elsewhere", Pool: other, Schema: "a"}, r: elsewhere}

	type got struct {
		slots []int
		all   bool
	}
	take := func(r *Relay) *got {
		s, all := r.takeDirty()
		select {
		case <-r.wake:
		default:
			if s.empty() && !all {
				return nil // not woken
			}
			t.Fatalf("dirty but not woken")
		}
		g := &got{all: all}
		for i := range slot.Count {
			if s.has(i) {
				g.slots = append(g.slots, i)
			}
		}
		return g
	}
	everyone := func(g *got) map[string]*got {
		m := map[string]*got{}
		for n := range relays {
			m[n] = g
		}
		return m
	}
	for _, tc := range []struct {
		payload string
		want    map[string]*got
	}{
		{"a:3,17", map[string]*got{"a": {slots: []int{3, 17}}}},
		{"co:lon:5", map[string]*got{"colon": {slots: []int{5}}, "colon2": {slots: []int{5}}}},
		{"co:6", map[string]*got{"co": {slots: []int{6}}}},
		{"3,17", everyone(&got{slots: []int{3, 17}})},    // an old writer
		{":3", everyone(&got{slots: []int{3}})},          // current_schema() NULL
		{"nosuch:4", map[string]*got{}},                  // a schema no target serves here: the idle poll finds its rows
		{"b:4", map[string]*got{}},                       // its target waits for an operator: likewise
		{"a:garbage", map[string]*got{"a": {all: true}}}, // unparsable slots: all of a's
	} {
		schema, _ := splitPayload(tc.payload)
		f.wake(pool, schema, tc.payload)
		for n, r := range relays {
			require.Equal(t, tc.want[n], take(r), "payload %q, target %s", tc.payload, n)
		}
		require.Nil(t, take(elsewhere), "payload %q woke a relay of another pool", tc.payload)
	}
}

// Attack 1f: the statement-local search_path never outlives its
// statement on a pooled connection: not after the statement fails after
// set_config ran, not after ctx cancels it mid-flight (pgx then closes the
// connection rather than return it), not after a transaction fails, in any
// exec mode. A single-connection pool makes every call reuse the one
// connection (or its replacement).
//
// Must hold: SHOW search_path on the pool is the pool's own afterwards.
func TestFleetAttackPathNeverLeaks(t *testing.T) {
	t.Parallel()
	server := testdb.ServerURL(t)
	tenant := testdb.New(t)
	home := testdb.New(t)
	modes := map[string]pgx.QueryExecMode{"CacheStatement": pgx.QueryExecModeCacheStatement, "Exec": pgx.QueryExecModeExec,
		"SimpleProtocol": pgx.QueryExecModeSimpleProtocol, "DescribeExec": pgx.QueryExecModeDescribeExec}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(server)
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["search_path"] = home.Schema
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			d := newDB(pool, tenant.Schema)
			check := func(after string) {
				t.Helper()
				var p string
				require.NoError(t, pool.QueryRow(ctx, "SHOW search_path").Scan(&p), after)
				require.Equal(t, home.Schema, p, "after %s", after)
			}
			var p string
			require.NoError(t, d.queryRow(ctx, "SELECT current_setting('search_path')", nil, &p))
			require.Equal(t, `"`+tenant.Schema+`"`, p)
			check("a statement")

			_, err = d.exec(ctx, "SELECT 1/0")
			require.Error(t, err)
			check("a failing statement")

			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err = d.exec(cctx, "SELECT pg_sleep(5)")
			cancel()
			require.Error(t, err)
			check("a canceled statement")

			err = d.query(ctx, "SELECT 1", nil, func(pgx.Rows) error { return errors.New("reader failed") })
			require.Error(t, err)
			check("a failing reader")

			err = d.begin(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "SELECT 1/0")
				return err
			})
			require.Error(t, err)
			check("a failed transaction")

			err = d.begin(ctx, func(tx pgx.Tx) error { return errors.New("fn failed") })
			require.Error(t, err)
			check("a rolled back transaction")

			require.NoError(t, d.begin(ctx, func(tx pgx.Tx) error { return nil }))
			check("a committed transaction")
		})
	}
}
