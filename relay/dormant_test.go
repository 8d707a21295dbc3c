package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// dormantFleet runs a Fleet over ts's schemas (one pool) whose targets go
// dormant after 300 ms without rows.
func dormantFleet(t *testing.T, ts *tenants, name string, before ...func(*relay.Fleet)) (*relay.Fleet, func() error) {
	t.Helper()
	var targets []relay.Target
	for i, db := range ts.schemas {
		targets = append(targets, relay.Target{Name: fmt.Sprintf("t%d", i), Pool: ts.shared, Schema: db.Schema})
	}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: ts.relayConfig(name), Targets: targets, DormantAfter: 300 * time.Millisecond,
		NeedsOperatorRetry: 300 * time.Millisecond})
	require.NoError(t, err)
	for _, fn := range before {
		fn(f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("Fleet.Run did not return 30 s after its context ended")
		}
	})
	t.Cleanup(func() { require.NoError(t, stop()) })
	return f, stop
}

func heldLanes(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL AND expires_at > now()`).Scan(&n))
	return n
}

// instanceVersion changes whenever a row of the instance table is
// written (a heartbeat, a dormant beat).
func instanceVersion(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var v string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(instance || ':' || xmin::text || ':' || heartbeat_at::text, ',' ORDER BY instance), '') FROM pgbox_relay_instances`).Scan(&v))
	return v
}

// Idle targets go dormant: their lanes are given up, their heartbeats
// stop (no write to the instance table for seconds), status reads them as
// live and dormant with no unowned lane to worry about. Rows wake them:
// rows of a writer that notifies, and rows of one that does not (the
// Fleet's idle poll). At stop nothing is left behind.
func TestFleetTargetsGoDormantAndWake(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 2)
	f, stop := dormantFleet(t, ts, "dormant")
	for i, db := range ts.schemas {
		writeTo(t, db, topicOf(i), 20, true)
		require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(i), 20, 30*time.Second), 20)
	}
	waitFor(t, "both targets dormant", func() bool {
		for _, s := range f.Targets() {
			if !s.Dormant || s.Stats.Lanes != 0 {
				return false
			}
		}
		return true
	})
	ctx := context.Background()
	for _, db := range ts.schemas {
		waitFor(t, "lanes given up in "+db.Schema, func() bool { return heldLanes(t, db.Pool) == 0 })
		snap, err := inspect.Read(ctx, db.Pool, inspect.Config{})
		require.NoError(t, err)
		require.Len(t, snap.Instances, 1)
		in := snap.Instances[0]
		require.True(t, in.Live && in.Dormant, "%+v", in)
		require.True(t, snap.DormantOnly())
		require.Contains(t, snap.InstanceState(in), "dormant")
	}
	// Dormant: no heartbeat writes the instance table for 1.5 s (ten
	// heartbeat intervals of this configuration).
	before := instanceVersion(t, ts.schemas[0].Pool)
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, before, instanceVersion(t, ts.schemas[0].Pool), "a dormant target renewed its lease")

	// Rows without a notification: the Fleet's idle poll finds them.
	writeTo(t, ts.schemas[0], topicOf(0), 7, false)
	got := kafkatest.ReadAll(t, ts.addrs, topicOf(0), 27, 30*time.Second)
	require.Len(t, got, 27)
	// Rows with one: the LISTEN connection wakes the target.
	writeTo(t, ts.schemas[1], topicOf(1), 5, true)
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(1), 25, 30*time.Second), 25)
	waitFor(t, "outboxes drained", func() bool { return count(t, ts.schemas[0]) == 0 && count(t, ts.schemas[1]) == 0 })
	require.EqualValues(t, 52, f.Stats().Published)

	waitFor(t, "dormant again", func() bool {
		for _, s := range f.Targets() {
			if !s.Dormant {
				return false
			}
		}
		return true
	})
	require.NoError(t, stop())
	for _, db := range ts.schemas {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_instances`).Scan(&n))
		require.Zero(t, n, "a dormant target's instance row is released at stop")
	}
}

// Attack: a dormant Fleet target and a plain relay on the same schema. The
// dormant instance must leave the lane ranking (the other takes every
// lane), and when rows come both may wake and rebalance: every row
// arrives, and no key's events arrive out of order.
func TestFleetDormantBesideAnotherInstance(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 1)
	f, _ := dormantFleet(t, ts, "fleet")
	db := ts.schemas[0]
	waitFor(t, "dormant", func() bool { return f.Targets()[0].Dormant })
	cfg := ts.relayConfig("plain")
	cfg.Pool, cfg.Schema = db.Pool, db.Schema
	start(t, cfg)
	waitFor(t, "the plain relay holds every lane", func() bool { return heldLanes(t, db.Pool) == 8 })

	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Notify: true})
	require.NoError(t, err)
	const keys, rounds = 20, 15
	for round := range rounds {
		msgs := make([]outbox.Message, keys)
		for k := range msgs {
			msgs[k] = outbox.Message{Topic: topicOf(0), Key: []byte(keyed(k)), Value: []byte(strconv.Itoa(round))}
		}
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))
		if round%5 == 4 {
			time.Sleep(500 * time.Millisecond) // let the fleet's target go dormant again between bursts
		}
	}
	got := kafkatest.ReadAll(t, ts.addrs, topicOf(0), keys*rounds, 60*time.Second)
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range got {
		v, err := strconv.Atoi(string(m.Value))
		require.NoError(t, err)
		id := string(m.Key) + "/" + string(m.Value)
		if seen[id] {
			continue // a duplicate (at least once allows it)
		}
		seen[id] = true
		prev, ok := last[string(m.Key)]
		require.True(t, !ok || v > prev, "key %s: event %d arrived after %d", m.Key, v, prev)
		last[string(m.Key)] = v
	}
	require.Len(t, seen, keys*rounds, "every event arrived")
}

// Attack: a dormant target's schema is dropped. The Fleet's idle poll
// asks every idle target in one pipeline: the dropped schema's question
// fails alone, its target is woken and reported, and the others are still
// found and served by the same poll.
func TestFleetIdlePollIsolatesAFailingTarget(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 3)
	f, _ := dormantFleet(t, ts, "isolate")
	waitFor(t, "all dormant", func() bool {
		for _, s := range f.Targets() {
			if !s.Dormant {
				return false
			}
		}
		return true
	})
	ctx := context.Background()
	_, err := ts.decoy.Pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{ts.schemas[1].Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	writeTo(t, ts.schemas[0], topicOf(0), 3, false)
	writeTo(t, ts.schemas[2], topicOf(2), 4, false)
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(0), 3, 30*time.Second), 3)
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(2), 4, 30*time.Second), 4)
	waitFor(t, "the dropped target reported", func() bool { return faState(t, f, "t1").State == "needs operator" })
	require.ErrorIs(t, faState(t, f, "t1").Err, relay.ErrNeedsOperator)
	writeTo(t, ts.schemas[0], topicOf(0), 2, false)
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(0), 5, 30*time.Second), 5)
}

// A negative DormantAfter keeps idle targets' lanes; zero is the default.
func TestFleetDormantAfterSettings(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 1)
	targets := []relay.Target{{Name: "t0", Pool: ts.shared, Schema: ts.schemas[0].Schema}}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: ts.relayConfig("never"), Targets: targets, DormantAfter: -1})
	require.NoError(t, err)
	runFleet(t, f)
	waitFor(t, "lanes held", func() bool { return faState(t, f, "t0").Stats.Lanes == 8 })
	time.Sleep(1500 * time.Millisecond) // well past a dormancy of any short setting
	s := faState(t, f, "t0")
	require.False(t, s.Dormant)
	require.Equal(t, 8, s.Stats.Lanes)
	require.Equal(t, 8, heldLanes(t, ts.schemas[0].Pool))
}

// Run's stop leaves no instance row behind, however often a heartbeat is
// in flight when it stops (a heartbeat cut off by the stop could commit on
// the server after the release).
func TestStopLeavesNoInstanceRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := b.db
	for i := range 25 {
		cfg := b.config(fmt.Sprintf("stop-%d", i))
		cfg.HeartbeatInterval, cfg.LeaseTTL = 2*time.Millisecond, time.Second
		rr := start(t, cfg)
		waitFor(t, "registered", func() bool { return rr.r.Stats().Instances > 0 })
		time.Sleep(time.Duration(i%5) * 3 * time.Millisecond)
		rr.stop(t)
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_relay_instances`).Scan(&n))
		require.Zero(t, n, "round %d: an instance row outlived its relay's stop", i)
	}
}

// Attack: a held xmin horizon keeps the dead rows of one target's
// published backlog, so the idle poll's question for it reads them all.
// That target alone is found slow (by the server's own clock, not by when
// the answer arrived): it claims at its own polls (from its floors) and
// stays awake, while the other targets of the same pipeline go dormant.
func TestFleetIdlePollSlowTargetStaysAwake(t *testing.T) {
	// Not parallel: writing and deleting its dead rows keeps a transaction
	// (an xid) running for a second or more, which the floor tests running
	// beside it would see as the cluster's oldest writer.
	ts := newTenants(t, 3)
	ctx := context.Background()
	slow := ts.schemas[1]
	hold, err := pgx.Connect(ctx, slow.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Close(context.Background()) })
	htx, err := hold.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	var one int
	require.NoError(t, htx.QueryRow(ctx, `SELECT 1`).Scan(&one)) // the snapshot is taken: VACUUM keeps what it sees
	_, err = slow.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), g % 256, 'dead', NULL, 'x' FROM generate_series(1, 100000) g`)
	require.NoError(t, err)
	_, err = slow.Pool.Exec(ctx, `DELETE FROM pgbox_outbox`)
	require.NoError(t, err)
	// Slow here means 2 ms of the server's time, and four times the other
	// targets' (the rule is the same at 10 ms): the dead rows take longer
	// than that on any machine, the empty outboxes far less.
	f, _ := dormantFleet(t, ts, "slow", func(f *relay.Fleet) { relay.SetFleetEmptySlow(f, 2*time.Millisecond) })
	waitFor(t, "t0 and t2 dormant", func() bool { return faState(t, f, "t0").Dormant && faState(t, f, "t2").Dormant })
	time.Sleep(time.Second) // a few more polls
	require.False(t, faState(t, f, "t1").Dormant, "the slow target went dormant: the poll asks it the slow question every second")
	require.Greater(t, faState(t, f, "t1").Stats.Lanes, 0)
	// It still publishes (its own polls claim).
	writeTo(t, slow, topicOf(1), 5, false)
	require.Len(t, kafkatest.ReadAll(t, ts.addrs, topicOf(1), 5, 30*time.Second), 5)
	require.NoError(t, htx.Rollback(ctx))
}
