package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A failed round of the idle poll wakes nobody until pollFailWake rounds
// in a row have failed: a dormant target's row (the Fleet listens on a
// channel nobody notifies: only the poll finds it) is published only
// after the third failure, by the target polling for itself.
func TestFleetPollFailureWakesAfterThree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, cfg := fleetRig(t)
	db := testdb.New(t)
	cfg.PollInterval = 100 * time.Millisecond
	cfg.Channel = "pgbox_test_nobody_notifies" // no writer's notification wakes it: only the poll
	f, err := NewFleet(FleetConfig{Relay: cfg, Targets: []Target{{Name: "t", Pool: pool, Schema: db.Schema}}, DormantAfter: 200 * time.Millisecond})
	require.NoError(t, err)
	var failing atomic.Bool
	var failures atomic.Int64
	f.pollErr = func() error {
		if !failing.Load() {
			return nil
		}
		failures.Add(1)
		return errors.New("injected: the round failed")
	}
	runFleet(t, f)
	deadline := time.Now().Add(30 * time.Second)
	for ts := f.Targets(); len(ts) != 1 || !ts[0].Dormant; ts = f.Targets() {
		require.True(t, time.Now().Before(deadline), "never dormant")
		time.Sleep(20 * time.Millisecond)
	}
	failing.Store(true)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "w", Value: []byte("late")})
	}))
	for f.Stats().Published < 1 {
		require.True(t, time.Now().Before(deadline), "never published (failures %d)", failures.Load())
		time.Sleep(5 * time.Millisecond)
	}
	require.GreaterOrEqual(t, failures.Load(), int64(3), "woken before 3 failed rounds (pollFailWake)")
}
