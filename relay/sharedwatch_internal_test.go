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

// The pool's watch asks every watching target in one pipeline on one
// connection (the pool has one) and wakes exactly those with rows above
// their floor, their slots marked and the newest id handed over; a target
// whose question fails (its table dropped) is woken to probe every slot,
// and the others are answered all the same. It works with its questions
// prepared (asked twice, then after the server forgot them: DEALLOCATE
// ALL, as a pooler's DISCARD ALL does) and unnamed (exec mode).
func TestSharedWatchAsksAllAtOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
			require.NoError(t, err)
			cfg.MaxConns = 1
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)

			// rows: ids above the floor; below: only ids at or below it;
			// dropped: no table; asleep: rows, but it no longer waits.
			names := []string{"rows", "below", "dropped", "asleep"}
			relays := map[string]*Relay{}
			var rs []*Relay
			var tops []int64
			for _, name := range names {
				d := testdb.New(t)
				var top int64
				require.NoError(t, d.Pool.QueryRow(ctx, `WITH i AS (INSERT INTO pgbox_outbox (topic, key, value)
					SELECT 't', convert_to('k' || g, 'UTF8'), '\x00' FROM generate_series(1, 5) g RETURNING id) SELECT max(id) FROM i`).Scan(&top))
				r := &Relay{cfg: Config{Schema: d.Schema}, wake: make(chan struct{}, 1), shared: &sharedWatch{}}
				r.shared.on.Store(name != "asleep")
				r.shared.floor.Store(top - 3)
				if name == "below" {
					r.shared.floor.Store(top)
				}
				if name == "dropped" {
					_, err := d.Pool.Exec(ctx, `DROP TABLE pgbox_outbox CASCADE`)
					require.NoError(t, err)
				}
				relays[name] = r
				rs = append(rs, r)
				tops = append(tops, top)
			}
			f := &Fleet{cfg: FleetConfig{Relay: Config{LeaseTTL: 10 * time.Second}}}
			check := func(round string) {
				t.Helper()
				require.NoError(t, f.watchAll(ctx, pool, rs), round)
				woken := map[string]bool{}
				for _, name := range names {
					r := relays[name]
					select {
					case <-r.wake:
						woken[name] = true
					default:
					}
				}
				require.Equal(t, map[string]bool{"rows": true, "dropped": true}, woken, round)
				r := relays["rows"]
				require.Equal(t, tops[0], r.shared.top.Swap(0), round+": the newest id found")
				dirty, all := r.takeDirty()
				require.False(t, all, round)
				require.False(t, dirty.empty(), round+": the rows' slots are marked")
				_, all = relays["dropped"].takeDirty()
				require.True(t, all, round+": a failed question probes every slot")
				for _, name := range []string{"below", "asleep"} {
					d, all := relays[name].takeDirty()
					require.True(t, d.empty() && !all, "%s: %s marked nothing", round, name)
				}
			}
			check("first")
			check("second")
			if mode == pgx.QueryExecModeCacheStatement {
				_, err := pool.Exec(ctx, `DEALLOCATE ALL`)
				require.NoError(t, err)
				// Every prepared question is gone: each fails once (its
				// target probes every slot), then is prepared again.
				require.NoError(t, f.watchAll(ctx, pool, rs))
				for _, name := range names {
					select {
					case <-relays[name].wake:
					default:
					}
					relays[name].takeDirty()
					relays[name].shared.top.Store(0)
				}
				check("after DEALLOCATE ALL")
			}
		})
	}
}
