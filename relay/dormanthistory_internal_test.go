package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// A dormant target keeps the console's chart fed: each renewal of its
// dormant row writes a history sample (topic ”, nothing waiting, nothing
// published), so the chart draws zero rather than no data while it
// sleeps, and deletes the samples older than two hours, as the awake
// relay's samples do (a target dormant for days must not grow the table).
// Before, a dormant target wrote no sample at all: "the relay records
// none" for as long as it slept.
func TestFleetDormantTargetWritesHistory(t *testing.T) {
	old := dormantBeat
	dormantBeat = 300 * time.Millisecond
	t.Cleanup(func() { dormantBeat = old })
	ctx := context.Background()
	pool, cfg := fleetRig(t)
	cfg.PollInterval = 100 * time.Millisecond
	db := testdb.New(t)
	hist := pgx.Identifier{db.Schema, "pgbox_relay_history"}.Sanitize()
	f, err := NewFleet(FleetConfig{Relay: cfg, Targets: []Target{{Name: "t", Pool: pool, Schema: db.Schema}}, DormantAfter: 200 * time.Millisecond})
	require.NoError(t, err)
	runFleet(t, f)
	deadline := time.Now().Add(30 * time.Second)
	for ts := f.Targets(); len(ts) != 1 || !ts[0].Dormant; ts = f.Targets() {
		require.True(t, time.Now().Before(deadline), "never dormant")
		time.Sleep(20 * time.Millisecond)
	}
	samples := func() (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+hist+` WHERE topic = '' AND backlog = 0 AND published = 0`).Scan(&n))
		return n
	}
	before := samples()
	// Written while it sleeps (the awake relay's samples delete such rows).
	_, err = pool.Exec(ctx, `INSERT INTO `+hist+` (at, topic, backlog, published) VALUES (now() - interval '3 hours', 'w', 5, 5)`)
	require.NoError(t, err)
	// Renewals come 0.2 to 0.4 s apart: 2 s holds at least four.
	time.Sleep(2 * time.Second)
	require.True(t, f.Targets()[0].Dormant, "woke without rows")
	require.GreaterOrEqual(t, samples()-before, 3, "a dormant target wrote no history samples while it slept")
	var stale int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+hist+` WHERE at < now() - interval '2 hours'`).Scan(&stale))
	require.Zero(t, stale, "samples older than two hours are kept while the target sleeps")
}
