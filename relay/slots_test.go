package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNotificationPayloadNarrowsTheProbe(t *testing.T) {
	t.Parallel()
	r := &Relay{}
	r.markDirty("3,17")
	r.markDirty("tenant:1:200") // today's writers name their schema first
	s, all := r.takeDirty()
	require.False(t, all)
	require.Equal(t, []int32{3, 17, 200}, r.floors.order(&s), "the slots named")
	s, all = r.takeDirty()
	require.False(t, all)
	require.True(t, s.empty(), "taken")

	// Anything else — an empty payload (another notifier), garbage, a slot
	// out of range — means "probe everything".
	for _, p := range []string{"", "x", "3,,4", "256", "-1", "tenant:", "tenant:x"} {
		r.markDirty(p)
		_, all = r.takeDirty()
		require.True(t, all, "payload %q", p)
	}
}

// A probe visits the least recently probed slots first, so slots that keep
// finding rows cannot keep the others waiting; a pass probes every owned
// slot once one has waited longer than the poll interval.
func TestProbeOrderStalestFirst(t *testing.T) {
	t.Parallel()
	var f floorState
	now := time.Now()
	for s := range 256 {
		f.probed[s] = now
	}
	f.probed[9] = now.Add(-time.Minute)
	f.probed[4] = now.Add(-time.Second)
	all := f.order(nil)
	require.Len(t, all, 256)
	require.Equal(t, []int32{9, 4, 0, 1}, all[:4])
	f.owned.add(4)
	require.False(t, f.stale(now, 2*time.Second))
	require.True(t, f.stale(now, 500*time.Millisecond))
}

// testRelay is a Relay for tests that call its parts without New.
func testRelay(cfg Config, id string) *Relay {
	return &Relay{cfg: cfg, id: id, db: newDB(cfg.Pool, cfg.Schema)}
}
