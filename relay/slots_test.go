package relay

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNotificationPayloadNarrowsTheProbe(t *testing.T) {
	t.Parallel()
	r := &Relay{}
	r.markDirty("3,17")
	r.markDirty("200")
	s, all := r.takeDirty()
	require.False(t, all)
	require.Equal(t, []int32{17, 200, 3}, s.list(10), "rotation order from slot 10")
	s, all = r.takeDirty()
	require.False(t, all)
	require.True(t, s.empty(), "taken")

	// Anything else — an empty payload (another notifier), garbage, a slot
	// out of range — means "probe everything".
	for _, p := range []string{"", "x", "3,,4", "256", "-1"} {
		r.markDirty(p)
		_, all = r.takeDirty()
		require.True(t, all, "payload %q", p)
	}
	require.Len(t, allSlots(5), 256)
	require.Equal(t, int32(5), allSlots(5)[0])
	require.Equal(t, int32(4), allSlots(5)[255])
}
