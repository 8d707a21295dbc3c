package pgboxprom_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/pgboxprom"
)

// TestHorizonMetrics: a session holding a REPEATABLE READ snapshot shows in
// pgbox_xmin_horizon_age_seconds and _transactions for kind "session", at
// least as old as the snapshot's own reading of it.
func TestHorizonMetrics(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	pid, _ := db.HoldSnapshot(t, "prom-horizon-holder")
	_, err := db.Pool.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	snap, err := inspect.Read(ctx, db.Pool, inspect.Config{HorizonList: 100000})
	require.NoError(t, err)
	var held inspect.HorizonHolder
	for _, x := range snap.Horizon.Holders {
		if x.PID == pid {
			held = x
		}
	}
	require.Equal(t, inspect.HolderSession, held.Kind, "the holder is listed")

	got := gather(t, newCollector(t, pgboxprom.Config{DB: db.Pool}))
	age, ok := got[`pgbox_xmin_horizon_age_seconds{kind="session"}`]
	require.True(t, ok, "no session series: %v", got)
	require.GreaterOrEqual(t, age, *held.AgeSeconds)
	require.GreaterOrEqual(t, got[`pgbox_xmin_horizon_age_transactions{kind="session"}`], float64(held.AgeTransactions))
	require.GreaterOrEqual(t, held.AgeTransactions, int64(1))
}
