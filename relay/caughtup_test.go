package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/relay"
)

// TargetState.CaughtUp: false while the rows a target started with are
// not all claimed (seen at every look while its outbox held a full batch
// or more), set at the claim that found less than a full batch, when at
// most that batch is left; false for a target that started dormant and
// has claimed nothing.
func TestFleetCaughtUp(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 2)
	const rows, batch = 400, 20
	writeTo(t, ts.schemas[0], topicOf(0), rows, false)
	cfg := ts.relayConfig("fleet")
	cfg.BatchSize = batch
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: []relay.Target{
		{Name: "backlog", Pool: ts.shared, Schema: ts.schemas[0].Schema},
		{Name: "idle", Pool: ts.shared, Schema: ts.schemas[1].Schema}}})
	require.NoError(t, err)
	state := func(name string) relay.TargetState { return targetState(t, f, name) }
	require.False(t, state("backlog").CaughtUp, "before Run")
	runFleet(t, f)
	looks := 0
	for deadline := time.Now().Add(30 * time.Second); ; looks++ {
		require.True(t, time.Now().Before(deadline), "backlog never caught up")
		if state("backlog").CaughtUp {
			break
		}
		time.Sleep(time.Millisecond)
	}
	left := count(t, ts.schemas[0])
	require.Less(t, left, batch, "caught up with %d rows left", left)
	require.Positive(t, looks, "seen before it caught up")
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(0), rows, 30*time.Second), rows)
	idle := state("idle")
	require.Equal(t, "running", idle.State)
	require.False(t, idle.CaughtUp, "a target that started dormant has claimed nothing")
}
