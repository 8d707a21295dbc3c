package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
)

// TestHorizonWarning: the overview warns when the horizon is held past
// inspect.HorizonWarnAge (the bound docs/alerts.yml fires on), naming the
// holder, and not before.
func TestHorizonWarning(t *testing.T) {
	t.Parallel()
	holder := inspect.HorizonHolder{Kind: inspect.HolderSession, PID: 4242, Application: "pg_dump", State: "active"}
	age := (inspect.HorizonWarnAge + time.Minute).Seconds()
	s := &inspect.Snapshot{Horizon: inspect.Horizon{AgeSeconds: &age, AgeTransactions: 5, Holders: []inspect.HorizonHolder{holder}}}
	w := warnings(s, nil)
	require.Len(t, w, 1)
	require.Contains(t, w[0], "session pid 4242 (pg_dump, active)")
	require.Contains(t, w[0], "held 11m")
	age = (inspect.HorizonWarnAge - time.Minute).Seconds()
	require.Empty(t, warnings(s, nil))
}
