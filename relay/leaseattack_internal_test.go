package relay

// Hostile review of the started-target kick (commit 378db1e, dormant.go and
// fleet.go): the kick channel of each pool lives in Fleet.pools, made by
// listenPools with the pool's poll and deleted by it when the pool's last target
// goes. What must hold: no entry (and no reference to a pool) outlives the
// pool's last target, nothing blocks, nothing leaks (goleak, TestMain).

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

func laKicks(f *Fleet) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pools)
}

func laFleet(t *testing.T, noListen bool, targets ...Target) (*Fleet, func()) {
	t.Helper()
	f, err := NewFleet(FleetConfig{Relay: Config{Brokers: []string{"127.0.0.1:1"}, NoListen: noListen,
		HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second, PollInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}, Targets: targets})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	return f, func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("Fleet.Run did not return")
		}
	}
}

// A Fleet without LISTEN has no idle poll (listenPools returns at once),
// so nothing ever deletes a pool's kick entry: every pool a target ever
// used stayed in the Fleet's kick map, the pool with it, for its life (001c656).
func TestLeaseAttackKickEntryNoListen(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	f, stop := laFleet(t, true)
	defer stop()
	for range 3 {
		cfg := db.Pool.Config()
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		require.NoError(t, f.SetTargets([]Target{{Name: "t", Pool: p, Schema: db.Schema}}))
		waitForInternal(t, "target running", func() bool { return len(f.Targets()) == 1 && f.Targets()[0].State == "running" })
		require.NoError(t, f.SetTargets(nil))
		p.Close()
	}
	require.Zero(t, laKicks(f), "kick entries of pools no target uses (NoListen: no idle poll to kick)")
}

// Targets added and removed at once, on a fresh pool each time: serve may
// take its kick channel after listenPools deleted the pool's entry (the
// target was removed while it started), which makes an entry nobody
// deletes.
func TestLeaseAttackKickEntryRacesRemoval(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	f, stop := laFleet(t, false)
	defer stop()
	for range 40 {
		p, err := pgxpool.NewWithConfig(context.Background(), db.Pool.Config())
		require.NoError(t, err)
		require.NoError(t, f.SetTargets([]Target{{Name: "t", Pool: p, Schema: db.Schema}}))
		require.NoError(t, f.SetTargets(nil))
		p.Close()
	}
	require.Zero(t, laKicks(f), "kick entries left for pools no target uses")
}

func waitForInternal(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
