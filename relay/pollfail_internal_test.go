package relay

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A failed round of the idle poll wakes nobody until pollFailWake rounds
// in a row have failed: a dormant target's row (the Fleet listens on a
// channel nobody notifies: only the poll finds it) is published only
// after the third failure, by the target polling for itself.
func TestFleetPollFailureWakesAfterThree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, cfg := fleetRig(t)
	db := testdb.New(t)
	cfg.PollInterval = 100 * time.Millisecond
	cfg.Channel = "pgbox_test_nobody_notifies" // no writer's notification wakes it: only the poll
	f, err := NewFleet(FleetConfig{Relay: cfg, Targets: []Target{{Name: "t", Pool: pool, Schema: db.Schema}}, DormantAfter: 200 * time.Millisecond})
	require.NoError(t, err)
	var failing atomic.Bool
	var failures atomic.Int64
	f.pollErr = func() error {
		if !failing.Load() {
			return nil
		}
		failures.Add(1)
		return errors.New("injected: the round failed")
	}
	runFleet(t, f)
	deadline := time.Now().Add(30 * time.Second)
	for ts := f.Targets(); len(ts) != 1 || !ts[0].Dormant; ts = f.Targets() {
		require.True(t, time.Now().Before(deadline), "never dormant")
		time.Sleep(20 * time.Millisecond)
	}
	failing.Store(true)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "w", Value: []byte("late")})
	}))
	for f.Stats().Published < 1 {
		require.True(t, time.Now().Before(deadline), "never published (failures %d)", failures.Load())
		time.Sleep(5 * time.Millisecond)
	}
	require.GreaterOrEqual(t, failures.Load(), int64(3), "woken before 3 failed rounds (pollFailWake)")
}

// A dormant target reports its database's failure when the idle poll of
// its database fails, within a PollInterval or two, and no longer once a
// round answers: its dormant row is renewed only every dormantBeat or so
// (30 s), so before, an outage showed up to 30 s late, and lingered as
// long after (the review of the idle poll's failures).
func TestFleetDormantTargetReportsPollFailure(t *testing.T) {
	t.Parallel()
	pool, cfg := fleetRig(t)
	db := testdb.New(t)
	cfg.PollInterval = 100 * time.Millisecond
	f, err := NewFleet(FleetConfig{Relay: cfg, Targets: []Target{{Name: "t", Pool: pool, Schema: db.Schema}}, DormantAfter: 200 * time.Millisecond})
	require.NoError(t, err)
	var failing atomic.Bool
	injected := errors.New("injected: the idle poll's round failed")
	f.pollErr = func() error {
		if failing.Load() {
			return injected
		}
		return nil
	}
	runFleet(t, f)
	deadline := time.Now().Add(30 * time.Second)
	for ts := f.Targets(); len(ts) != 1 || !ts[0].Dormant; ts = f.Targets() {
		require.True(t, time.Now().Before(deadline), "never dormant")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, f.Targets()[0].Err)

	failing.Store(true)
	seen := false
	for until := time.Now().Add(5 * time.Second); time.Now().Before(until) && !seen; time.Sleep(5 * time.Millisecond) {
		seen = errors.Is(f.Targets()[0].Err, injected)
	}
	require.True(t, seen, "the dormant target never reported its database's failure within 5 s (dormantBeat: %v)", dormantBeat)

	failing.Store(false)
	cleared := false
	for until := time.Now().Add(5 * time.Second); time.Now().Before(until) && !cleared; time.Sleep(5 * time.Millisecond) {
		cleared = f.Targets()[0].Err == nil
	}
	require.True(t, cleared, "the failure still reported 5 s after the poll answered again: %v", f.Targets()[0].Err)
}

// Targets that go dormant together do not renew their dormant rows
// together: each renewal comes a random wait of 2/3 to 4/3 of
// dormantBeat after the last (nextDormantBeat). At a fixed period a
// thousand targets that went dormant in the same second renewed in the
// same second every 30 s. Fails with a fixed dormantBeat: every target's
// renewals come dormantBeat apart, give or take a heartbeat tick.
func TestFleetDormantRenewalsSpread(t *testing.T) {
	for range 1000 {
		w := nextDormantBeat()
		require.GreaterOrEqual(t, w, dormantBeat*2/3)
		require.Less(t, w, dormantBeat*4/3)
	}
	old := dormantBeat
	dormantBeat = time.Second
	t.Cleanup(func() { dormantBeat = old })
	ctx := context.Background()
	pool, cfg := fleetRig(t)
	cfg.PollInterval = 100 * time.Millisecond
	const n = 8
	var targets []Target
	var reads []string
	for i := range n {
		db := testdb.New(t)
		targets = append(targets, Target{Name: "t" + strconv.Itoa(i), Pool: pool, Schema: db.Schema})
		reads = append(reads, "(SELECT max(heartbeat_at) FROM "+pgx.Identifier{db.Schema, "pgbox_relay_instances"}.Sanitize()+" WHERE sleeping)")
	}
	// Every target's last renewal in one round trip: samples 20 ms apart
	// see every renewal (the waits are 0.67 s or more) however loaded the
	// machine. NULL: not dormant right now (woken), not sampled.
	sample := "SELECT " + strings.Join(reads, ", ")
	f, err := NewFleet(FleetConfig{Relay: cfg, Targets: targets, DormantAfter: 200 * time.Millisecond})
	require.NoError(t, err)
	runFleet(t, f)
	deadline := time.Now().Add(30 * time.Second)
	for {
		dormant := 0
		for _, ts := range f.Targets() {
			if ts.Dormant {
				dormant++
			}
		}
		if dormant == n {
			break
		}
		require.True(t, time.Now().Before(deadline), "only %d of %d targets dormant", dormant, n)
		time.Sleep(20 * time.Millisecond)
	}
	// Each target's renewals, as its dormant row's heartbeat_at.
	renewals := make([][]time.Time, n)
	for until := time.Now().Add(6 * time.Second); time.Now().Before(until); time.Sleep(20 * time.Millisecond) {
		ats := make([]*time.Time, n)
		dest := make([]any, n)
		for i := range ats {
			dest[i] = &ats[i]
		}
		require.NoError(t, pool.QueryRow(ctx, sample).Scan(dest...))
		for i, at := range ats {
			if at == nil {
				renewals[i] = nil // woken: its next dormant row starts a new run
				continue
			}
			if k := len(renewals[i]); k == 0 || !renewals[i][k-1].Equal(*at) {
				renewals[i] = append(renewals[i], *at)
			}
		}
	}
	var gaps []time.Duration
	for i, rs := range renewals {
		for k := 1; k < len(rs); k++ {
			g := rs[k].Sub(rs[k-1])
			// The wait, then up to a heartbeat tick until the loop looks.
			require.GreaterOrEqual(t, g, dormantBeat*2/3, "target %d renewed too soon", i)
			require.LessOrEqual(t, g, dormantBeat*4/3+3*cfg.HeartbeatInterval, "target %d renewed too late", i)
			gaps = append(gaps, g)
		}
	}
	require.GreaterOrEqual(t, len(gaps), 2*n, "renewals seen: %v", renewals)
	slices.Sort(gaps)
	require.Greater(t, gaps[len(gaps)-1]-gaps[0], dormantBeat/4,
		"every renewal came the same wait after the last (%v to %v): targets that went dormant together renew together", gaps[0], gaps[len(gaps)-1])
}
