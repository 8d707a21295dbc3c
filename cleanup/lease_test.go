package cleanup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A lease another cleaner holds makes a pass skip; an expired one (its
// cleaner died) is taken over; a pass whose lease was taken over stops.
func TestLeaseHeldExpiredLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.bulkKeys(t, "t", 30, fixedNow().Add(-48*time.Hour))
	ctx := context.Background()
	exec := func(q string) {
		_, err := b.db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}

	exec(`INSERT INTO pgbox_cleanup_lease (owner, expires_at) VALUES ('other', now() + interval '1 minute')`)
	rep, err := b.cleaner(t, Config{Now: fixedNow}).RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, rep.Locked)
	require.Equal(t, 30, b.count(t))

	exec(`UPDATE pgbox_cleanup_lease SET expires_at = now() - interval '1 second'`)
	rep, err = b.cleaner(t, Config{Now: fixedNow, BatchSize: 10}).RunOnce(ctx)
	require.NoError(t, err)
	require.False(t, rep.Locked)
	require.Equal(t, 0, b.count(t))

	// Lost mid-pass: another cleaner takes the lease over after the first batch.
	b.bulkKeys(t, "t", 30, fixedNow().Add(-48*time.Hour))
	c := b.cleaner(t, Config{Now: fixedNow, BatchSize: 10})
	c.hookBatch = func() { exec(`UPDATE pgbox_cleanup_lease SET owner = 'thief'`) }
	_, err = c.RunOnce(ctx)
	require.ErrorIs(t, err, errLeaseLost)
	require.Equal(t, 20, b.count(t), "no batch runs once the lease is lost")
}
