package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
)

// TestStatusShowsHorizonHolder: while a session holds a REPEATABLE READ
// snapshot, `relay status` prints the xmin horizon's section and `status
// --json` lists that session (every holder: the shared test server has
// others) with its pid, application and state.
func TestStatusShowsHorizonHolder(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pid, _ := db.HoldSnapshot(t, "status-horizon-holder")
	env := []string{"DATABASE_URL=" + db.URL}

	r := runRelay(t, time.Minute, env, "status", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st inspect.Snapshot
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st), r.Stdout)
	var held *inspect.HorizonHolder
	for i, x := range st.Horizon.Holders {
		if x.PID == pid {
			held = &st.Horizon.Holders[i]
		}
	}
	require.NotNil(t, held, "pid %d not among %d holders", pid, len(st.Horizon.Holders))
	require.Zero(t, st.Horizon.More, "--json lists every holder")
	require.Equal(t, inspect.HolderSession, held.Kind)
	require.Equal(t, "status-horizon-holder", held.Application)
	require.Equal(t, "idle in transaction", held.State)
	require.NotNil(t, held.AgeSeconds)
	require.Positive(t, *held.AgeSeconds)
	require.NotNil(t, st.Horizon.AgeSeconds)

	r = runRelay(t, time.Minute, env, "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "XMIN HORIZON: held")
	require.Contains(t, r.Stdout, "KIND  ")
}
