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
	c := h.take(0)
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
