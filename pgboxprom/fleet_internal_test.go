package pgboxprom

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
)

// A target whose live relay instances are all dormant holds no lane and
// waits for nothing: its lanes are not unowned (PgboxRelayLanesUnowned
// would page for every idle tenant). One live instance that is not dormant,
// or none at all, makes them unowned again.
func TestFleetFiguresDormantLanes(t *testing.T) {
	lanes := []inspect.Lane{{Lane: 0, Lanes: 2}, {Lane: 1, Lanes: 2}}
	for _, tc := range []struct {
		name      string
		instances []inspect.Instance
		unowned   int
	}{
		{"dormant", []inspect.Instance{{Live: true, Dormant: true}}, 0},
		{"dormant and an expired one", []inspect.Instance{{Live: true, Dormant: true}, {Live: false}}, 0},
		{"dormant beside an awake one", []inspect.Instance{{Live: true, Dormant: true}, {Live: true}}, 2},
		{"none live", []inspect.Instance{{Live: false, Dormant: true}}, 2},
		{"none", nil, 2},
	} {
		f := figures(&inspect.Snapshot{Lanes: lanes, Instances: tc.instances})
		require.Equal(t, tc.unowned, f.unowned, tc.name)
	}
}
