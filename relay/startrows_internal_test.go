package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A Fleet's target whose outbox the statistics show holding rows starts
// awake (it takes its lanes and publishes without waiting for the idle
// poll); one whose outbox is empty starts dormant, as before. The idle
// poll does not run here, so the awake target's rows are not found by it.
func TestFleetStartsAwakeWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, cfg := fleetRig(t)
	busy, quiet := testdb.New(t), testdb.New(t)
	require.NoError(t, pgx.BeginFunc(ctx, busy.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "w", Value: []byte("a")}, outbox.Message{Topic: "w", Value: []byte("b")})
	}))
	deadline := time.Now().Add(30 * time.Second)
	for readStartRows(ctx, pool)[busy.Schema] == 0 {
		require.True(t, time.Now().Before(deadline), "the statistics never showed the rows")
		time.Sleep(100 * time.Millisecond)
	}
	require.Zero(t, readStartRows(ctx, pool)[quiet.Schema])

	f, err := NewFleet(FleetConfig{Relay: cfg,
		Targets: []Target{{Name: "busy", Pool: pool, Schema: busy.Schema}, {Name: "quiet", Pool: pool, Schema: quiet.Schema}}})
	require.NoError(t, err)
	// No idle poll, watch or LISTEN for the pool: a target that starts
	// dormant is never woken, one that starts awake publishes.
	f.mu.Lock()
	f.pools[pool] = poolLoops{cancel: func() {}, kick: make(chan struct{}, 1), rows: &startRows{}}
	f.mu.Unlock()
	runFleet(t, f)
	state := func(name string) TargetState {
		for _, s := range f.Targets() {
			if s.Name == name {
				return s
			}
		}
		return TargetState{}
	}
	for state("busy").Stats.Published < 2 || !state("quiet").Dormant {
		require.True(t, time.Now().Before(deadline.Add(30*time.Second)), "busy %+v, quiet %+v", state("busy"), state("quiet"))
		time.Sleep(20 * time.Millisecond)
	}
	require.False(t, state("busy").Dormant)
	require.Zero(t, state("quiet").Stats.Lanes, "the quiet target started dormant")
}

// runFleet runs f until the test ends, and then checks that Run returned
// nil.
func runFleet(t *testing.T, f *Fleet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// A target that cannot prepare its lanes (its lanes table locked by an
// operator's transaction) holds its place at the start gate for at most
// startGateHold: the other targets of its pool start behind it.
func TestFleetStartGateLockedTarget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := kafkatest.New(t)
	cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 4 // a gate of one place
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	locked := testdb.New(t)
	tx, err := locked.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `LOCK TABLE pgbox_relay_lanes IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	ts := []Target{{Name: "locked", Pool: pool, Schema: locked.Schema}}
	kc := kafkatest.Config()
	kc.Producer.RequiredAcks = -1
	f, err := NewFleet(FleetConfig{Relay: Config{Brokers: c.ListenAddrs(), Kafka: kc, HeartbeatInterval: 100 * time.Millisecond,
		LeaseTTL: time.Second}, Targets: ts})
	require.NoError(t, err)
	runFleet(t, f)
	time.Sleep(300 * time.Millisecond) // the locked target has the place
	f.mu.Lock()
	require.Equal(t, 1, cap(f.pools[pool].starts), "MaxConns/4")
	f.mu.Unlock()
	for i := range 3 {
		ts = append(ts, Target{Name: string(rune('a' + i)), Pool: pool, Schema: testdb.New(t).Schema})
	}
	require.NoError(t, f.SetTargets(ts))
	dormant := func() (n int) {
		for _, s := range f.Targets() {
			if s.Dormant {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for dormant() < 3 {
		require.True(t, time.Now().Before(deadline), "%+v", f.Targets())
		time.Sleep(20 * time.Millisecond)
	}
	for _, s := range f.Targets() {
		if s.Name == "locked" {
			require.False(t, s.Dormant, "its lanes are still locked")
		}
	}
}

// fleetRig is a broker with the topic "w", a pool on the test server, and
// a relay Config for them (heartbeats every 100 ms, a 1 s lease).
func fleetRig(t *testing.T) (*pgxpool.Pool, Config) {
	t.Helper()
	c := kafkatest.New(t)
	kafkatest.CreateTopic(t, c.ListenAddrs(), "w", 1, nil)
	pool, err := pgxpool.New(context.Background(), testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	kc := kafkatest.Config()
	kc.Producer.RequiredAcks = -1
	return pool, Config{Brokers: c.ListenAddrs(), Kafka: kc, HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second}
}
