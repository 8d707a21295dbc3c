package relay

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// A relay claims nothing while its lease is not confirmed (before the
// first heartbeat that took lanes, after a gap, while a dormant Fleet
// target wakes): such a batch could not be sent (sendBatch holds it
// back), and at 100 waking targets the held-back batches were 62 wasted
// claims and a heartbeat's wait each (make tenants). The heartbeat that
// confirms the lease again wakes the work loop, which then claims.
func TestNoClaimWithoutConfirmedLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r, err := New(Config{Pool: db.Pool, Brokers: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, r.ensureLanes(ctx))
	r.kafkaReady.Store(true)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), g % 256, 't', convert_to('k' || g, 'UTF8'), 'v' FROM generate_series(1, 5) g`)
	require.NoError(t, err)

	// Before any heartbeat: no lease, no claim.
	c, _, err := r.takeBatch(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, c.rows, "claimed before the first heartbeat")

	require.NoError(t, r.heartbeat(ctx))
	require.NotZero(t, r.lanes.Load(), "the heartbeat took lanes")
	c, gen, err := r.takeBatch(ctx, nil)
	require.NoError(t, err)
	require.Len(t, c.rows, 5, "claimed under the lease")
	require.True(t, r.leaseHeld(gen))

	// The lease lapses (a paused process, a dormant target's lanes given
	// up while the lane rows still name it): the lanes are still this
	// instance's in the table, and nothing is claimed.
	r.leaseUntil.Store(0)
	c, _, err = r.takeBatch(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, c.rows, "claimed while the lease had lapsed")

	// The heartbeat that confirms it again wakes the work loop.
	select {
	case <-r.wake:
	default:
	}
	require.NoError(t, r.heartbeat(ctx))
	select {
	case <-r.wake:
	case <-time.After(time.Second):
		t.Fatal("the heartbeat that confirmed a lapsed lease did not wake the work loop")
	}
	c, gen2, err := r.takeBatch(ctx, nil)
	require.NoError(t, err)
	require.Len(t, c.rows, 5, "claimed once the lease is confirmed")
	require.NotEqual(t, gen, gen2, "a lapsed lease starts a new generation")
}
