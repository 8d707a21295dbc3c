package relay

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// A relay is caught up (TargetState.CaughtUp) only once a claim over
// lanes it holds found less than a full batch: a claim that owned no slot
// (the first heartbeat, before Kafka answered, takes no lanes) found
// nothing because it could claim nothing, and a Fleet's start took the
// backlog's target for caught up 41 ms after it started (make test, under
// load: TestRunTargetsBacklogFirstBounded).
func TestCaughtUpOnlyOverHeldLanes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r, err := New(Config{Pool: db.Pool, Brokers: []string{"127.0.0.1:1"}, BatchSize: 10, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, r.ensureLanes(ctx))
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
		SELECT 't', convert_to('k' || g, 'UTF8'), 'v' FROM generate_series(1, 5) g`)
	require.NoError(t, err)

	require.NoError(t, r.heartbeat(ctx)) // Kafka not reached: no lanes
	require.Zero(t, r.lanes.Load())
	c, gen, err := r.takeBatch(ctx, nil)
	require.NoError(t, err)
	require.True(t, r.leaseHeld(gen), "the claim ran")
	require.Empty(t, c.rows)
	require.False(t, r.caughtUp.Load(), "caught up by a claim that held no lane")

	r.kafkaReady.Store(true)
	require.NoError(t, r.heartbeat(ctx))
	require.NotZero(t, r.lanes.Load())
	only := &slotSet{}
	only.add(0)
	_, _, err = r.takeBatch(ctx, only)
	require.NoError(t, err)
	require.False(t, r.caughtUp.Load(), "caught up by a claim of some slots only")
	c, _, err = r.takeBatch(ctx, nil)
	require.NoError(t, err)
	require.Len(t, c.rows, 5)
	require.True(t, r.caughtUp.Load(), "a claim over every held slot found less than a batch")
}
