package slot_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
)

// Rows already in the outbox keep the slot they were written with, so the
// formula must never change: a key whose new rows landed in another slot
// could overtake its old ones. These are fnv1a32(key) % 256.
func TestSlotOfIsStable(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]int{"order-1": 109, "a": 44, "": 197, "payments-42": 183} {
		require.Equal(t, want, slot.Of([]byte(key), [16]byte{}), "key %q", key)
		require.Equal(t, want, slot.Of([]byte(key), [16]byte{8: 1, 15: 9}), "key %q: the event id does not matter", key)
	}
	// Keyless rows spread by their event id's random half.
	require.Equal(t, 53, slot.Of(nil, [16]byte{8: 1, 9: 2, 15: 9}))
	require.Equal(t, 53, slot.Of(nil, [16]byte{0: 7, 8: 1, 9: 2, 15: 9}), "the time half does not matter")
}

func TestLaneGroupsSlots(t *testing.T) {
	t.Parallel()
	seen := map[int]int{}
	for s := range slot.Count {
		l := slot.Lane(s, slot.LanesDefault)
		require.True(t, l >= 0 && l < slot.LanesDefault, "slot %d: lane %d", s, l)
		seen[l]++
	}
	for l := range slot.LanesDefault {
		require.Equal(t, slot.Count/slot.LanesDefault, seen[l], "lane %d", l)
	}
}
