package relay_test

// Hostile review of the lease gate (commit 378db1e: takeBatch claims
// nothing unless the lease is confirmed; the heartbeat that confirms a
// lapsed lease wakes the work loop) and of a Fleet relay's wait after a
// partial batch (commit 7fbabec). What must hold: every committed row is
// published, one key's rows in commit order, and a relay whose lease
// comes back claims without waiting for a poll it may not have.
//
// The lease is made to lapse for real: a transaction holds the relay's
// instance row (FOR UPDATE) for longer than LeaseTTL, so its heartbeat
// statement waits, times out (beatContext) and fails until the row is let
// go, as a stalled server, a lock or a paused process would.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// laBlockBeat holds instance's row of pool's pgbox_relay_instances for d:
// its heartbeats wait for it and fail (they may last LeaseTTL/2).
func laBlockBeat(pool *pgxpool.Pool, instance string, d time.Duration) error {
	ctx := context.Background()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM pgbox_relay_instances WHERE instance = $1 FOR UPDATE) x`,
			instance).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("instance row of %s: %d rows", instance, n)
		}
		time.Sleep(d)
		return nil
	})
}

// laQuiet is a relay config that finds rows only through its own work
// loop: no LISTEN, and an idle poll far beyond the test's bounds. A row
// written while it is idle is found only by the full probe the lease's
// return makes (or by the watch within the busy window).
func laQuiet(b *testBundle, name string) relay.Config {
	cfg := b.config(name)
	cfg.NoListen = true
	cfg.PollInterval = 60 * time.Second
	return cfg
}

// Rows waiting before the relay's first heartbeat are claimed once it
// confirms the lease: the first heartbeat wakes the work loop, which
// otherwise would sleep a PollInterval (60 s here).
func TestLeaseAttackFirstHeartbeatClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createCounters(t, b, 4)
	for i := range 20 {
		require.NoError(t, writeCounted(context.Background(), b, keyed(i%4)))
	}
	t0 := time.Now()
	start(t, laQuiet(b, "first"))
	laWaitEmpty(t, b, 15*time.Second)
	t.Logf("published %v after start", time.Since(t0))
	checkOrder(t, b, readEvents(t, b, 20))
}

// The lease lapses while the relay is idle (its heartbeats fail for 2.5 s,
// LeaseTTL 1 s) and rows are committed meanwhile: nobody wakes it (no
// LISTEN, PollInterval 60 s) but the heartbeat that confirms the lease
// again, with the same lanes.
func TestLeaseAttackLapsedLeaseWakesIdleRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createCounters(t, b, 4)
	rr := start(t, laQuiet(b, "lapse"))
	waitFor(t, "lanes taken", func() bool { return rr.r.Stats().Lanes > 0 })
	time.Sleep(2500 * time.Millisecond) // out of the busy window: only a wake or the poll finds rows
	blocked := make(chan error, 1)
	go func() { blocked <- laBlockBeat(b.db.Pool, rr.r.Instance(), 2500*time.Millisecond) }()
	time.Sleep(1500 * time.Millisecond) // the lease has lapsed
	for i := range 20 {
		require.NoError(t, writeCounted(context.Background(), b, keyed(i%4)))
	}
	require.NoError(t, <-blocked)
	t0 := time.Now()
	laWaitEmpty(t, b, 15*time.Second)
	t.Logf("published %v after the heartbeat could run again", time.Since(t0))
	checkOrder(t, b, readEvents(t, b, 20))
}

// The same lapse while the relay is busy: rows are written throughout,
// so the watch names their slots while no claim may run; those names are
// spent on claims the gate turns down (takeDirty) and only the lease's
// return may find the rows again.
func TestLeaseAttackLapseWhileBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	createCounters(t, b, 8)
	rr := start(t, laQuiet(b, "busy"))
	waitFor(t, "lanes taken", func() bool { return rr.r.Stats().Lanes > 0 })
	ctx := context.Background()
	var stopW atomic.Bool
	var wg sync.WaitGroup
	var written atomic.Int64
	wg.Go(func() {
		for i := 0; !stopW.Load(); i++ {
			if err := writeCounted(ctx, b, keyed(i%8)); err != nil {
				t.Error(err)
				return
			}
			written.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, laBlockBeat(b.db.Pool, rr.r.Instance(), 2500*time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	stopW.Store(true)
	wg.Wait()
	t0 := time.Now()
	laWaitEmpty(t, b, 15*time.Second)
	t.Logf("%d rows; the last published %v after the writes ended", written.Load(), time.Since(t0))
	checkOrder(t, b, readEvents(t, b, int(written.Load())))
}

// Two instances; one's heartbeats fail past its lease, so the other takes
// all lanes; it comes back (its first heartbeat holds none: the other
// still holds its share, released only at the other's next heartbeat and
// unclaimable for one interval more), then gets lanes. Then the other
// stops and it takes them all. Rows written throughout, no LISTEN, no
// poll within the test: every row must still come out, in key order.
func TestLeaseAttackLapseRebalanceKeepsOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const keys = 12
	createCounters(t, b, keys)
	r1 := start(t, laQuiet(b, "r1"))
	r2 := start(t, laQuiet(b, "r2"))
	waitFor(t, "lanes shared", func() bool { return r1.r.Stats().Lanes > 0 && r2.r.Stats().Lanes > 0 })
	ctx := context.Background()
	var stopW atomic.Bool
	var wg sync.WaitGroup
	var written atomic.Int64
	for w := range 3 {
		wg.Go(func() {
			for i := w; !stopW.Load(); i += 3 {
				if err := writeCounted(ctx, b, keyed(i%keys)); err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
				time.Sleep(3 * time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, laBlockBeat(b.db.Pool, r1.r.Instance(), 2500*time.Millisecond))
	waitFor(t, "r1 holds lanes again", func() bool { return r1.r.Stats().Lanes > 0 })
	time.Sleep(time.Second)
	require.NoError(t, laBlockBeat(b.db.Pool, r2.r.Instance(), 2500*time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	r2.stop(t)
	time.Sleep(500 * time.Millisecond)
	stopW.Store(true)
	wg.Wait()
	// Rows written while idle are found by the lanes' arrival (r2 stopped:
	// r1 takes them) or the busy watch; the poll is 60 s away.
	t0 := time.Now()
	laWaitEmpty(t, b, 20*time.Second)
	t.Logf("%d rows; the last published %v after the writes ended", written.Load(), time.Since(t0))
	dups := checkOrder(t, b, readEvents(t, b, int(written.Load())))
	t.Logf("%d duplicates", dups)
}

func laWaitEmpty(t *testing.T, b *testBundle, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for b.outboxCount(t, "true") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still in the outbox after %v", b.outboxCount(t, "true"), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A Fleet relay no longer claims again at once after a batch smaller than
// BatchSize (7fbabec). But a batch is small also when the claim's per-slot
// cap (claimPerSlot: BatchSize/4, at least 16) cut it: one hot key's
// backlog comes out a quarter batch at a time, each followed by a watch
// wait. The backlog must still drain, in order; the time is logged
// beside a relay alone's on the same backlog.
func TestLeaseAttackFleetHotKeyBacklog(t *testing.T) {
	t.Parallel()
	const rows = 4000
	ctx := context.Background()
	hot := func(pool *pgxpool.Pool, topic string) {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			msgs := make([]outbox.Message, rows)
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: topic, Key: []byte("hot"), Value: []byte{byte(i >> 8), byte(i)}}
			}
			return outbox.Write(ctx, tx, msgs...)
		}))
	}
	inOrder := func(addrs []string, topic string) {
		got := kafkatest.ReadAll(t, addrs, topic, rows, 60*time.Second)
		next := 0
		for _, m := range got {
			v := int(m.Value[0])<<8 | int(m.Value[1])
			if v < next { // a duplicate
				continue
			}
			require.Equal(t, next, v, "hot key out of order or lost")
			next++
		}
		require.Equal(t, rows, next)
	}

	// The Fleet.
	ts := newTenants(t, 1)
	db := ts.schemas[0]
	cfg := ts.relayConfig("hot")
	cfg.BatchSize = 400 // 100 a slot
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, DormantAfter: -1,
		Targets: []relay.Target{{Name: "t", Pool: ts.shared, Schema: db.Schema}}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	waitFor(t, "lanes taken", func() bool { return f.Stats().Lanes > 0 })
	b0 := f.Stats().Batches
	t0 := time.Now()
	hot(db.Pool, topicOf(0))
	waitFor(t, "fleet backlog drained", func() bool { return count(t, db) == 0 })
	fleetTook, fleetBatches := time.Since(t0), f.Stats().Batches-b0
	inOrder(ts.addrs, topicOf(0))

	// A relay alone, same batch size.
	b := setup(t)
	rcfg := b.config("alone")
	rcfg.BatchSize = 400
	rr := start(t, rcfg)
	waitFor(t, "lanes taken", func() bool { return rr.r.Stats().Lanes > 0 })
	a0 := rr.r.Stats().Batches
	t1 := time.Now()
	hot(b.db.Pool, b.topic)
	laWaitEmpty(t, b, 60*time.Second)
	aloneTook, aloneBatches := time.Since(t1), rr.r.Stats().Batches-a0
	inOrder(b.addrs, b.topic)
	t.Logf("%d rows of one key: Fleet %v in %d batches, relay alone %v in %d batches", rows, fleetTook, fleetBatches, aloneTook, aloneBatches)
}

// The same hot key, but its backlog was committed before the Fleet
// started (a restart after an outage or a deploy): the rows lie below the
// watch's starting floor (the newest id at start), so after each
// quarter-batch (the per-slot cap) the watch finds nothing, and the next
// claim waits for the busy window to end (2 s) and the sleeping flag's
// full probe. 1000 rows, 100 a claim: ten such waits, where a relay
// alone claims again at once.
func TestLeaseAttackFleetHotBacklogAtStart(t *testing.T) {
	t.Parallel()
	const rows = 1000
	ctx := context.Background()
	ts := newTenants(t, 1)
	db := ts.schemas[0]
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		msgs := make([]outbox.Message, rows)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: topicOf(0), Key: []byte("hot"), Value: []byte{byte(i >> 8), byte(i)}}
		}
		return outbox.Write(ctx, tx, msgs...)
	}))
	cfg := ts.relayConfig("hot-start")
	cfg.BatchSize = 400 // 100 a slot
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, DormantAfter: -1,
		Targets: []relay.Target{{Name: "t", Pool: ts.shared, Schema: db.Schema}}})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	t0 := time.Now()
	deadline := t0.Add(8 * time.Second)
	for count(t, db) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows of one key still waiting 8 s after the Fleet started (%d batches)", count(t, db), rows, f.Stats().Batches)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d rows of one key drained %v after start in %d batches", rows, time.Since(t0), f.Stats().Batches)
	got := kafkatest.ReadAll(t, ts.addrs, topicOf(0), rows, 60*time.Second)
	next := 0
	for _, m := range got {
		if v := int(m.Value[0])<<8 | int(m.Value[1]); v >= next {
			require.Equal(t, next, v, "hot key out of order or lost")
			next++
		}
	}
	require.Equal(t, rows, next)
}

// A dormant Fleet target whose lanes another instance holds: rows come,
// the Fleet's poll wakes the target, its heartbeat confirms a lease with
// no lanes (no lapse wake: nothing to claim), and only when the other
// instance stops does it get lanes, which must wake it (the lanes-changed
// wake) although it was woken, found nothing and went idle meanwhile. The
// other instance is quiet (no LISTEN, PollInterval 60 s) and idle when the
// rows come, so it finds none of them: the target must publish them all.
func TestLeaseAttackDormantTargetGetsLanesLater(t *testing.T) {
	t.Parallel()
	ts := newTenants(t, 1)
	f, _ := dormantFleet(t, ts, "fleet")
	db := ts.schemas[0]
	waitFor(t, "dormant", func() bool { return f.Targets()[0].Dormant })
	b := &testBundle{addrs: ts.addrs, db: db}
	cfg := laQuiet(b, "plain")
	cfg.Channel = ""
	other := start(t, cfg)
	waitFor(t, "the plain relay holds every lane", func() bool { return heldLanes(t, db.Pool) == 8 && other.r.Stats().Lanes == 8 })
	time.Sleep(2500 * time.Millisecond) // the plain relay's busy window ends
	ctx := context.Background()
	for i := range 40 {
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return outbox.Write(ctx, tx, outbox.Message{Topic: topicOf(0), Key: []byte(keyed(i % 8)), Value: []byte(strconv.Itoa(i))})
		}))
	}
	time.Sleep(time.Second) // the Fleet's poll wakes the target; it may get a share, or none
	t.Logf("%d of 40 rows waiting when the other instance stops", count(t, db))
	other.stop(t)
	t0 := time.Now()
	waitFor(t, "rows published", func() bool { return count(t, db) == 0 })
	t.Logf("published %v after the other instance stopped (%+v)", time.Since(t0), f.Targets()[0].Stats.Lanes)
	require.Less(t, time.Since(t0), 15*time.Second)
	got := kafkatest.ReadAll(t, ts.addrs, topicOf(0), 40, 60*time.Second)
	last := map[string]int{}
	for _, m := range got {
		v, err := strconv.Atoi(string(m.Value))
		require.NoError(t, err)
		if prev, ok := last[string(m.Key)]; ok && v <= prev {
			continue // a duplicate
		}
		_, ok := last[string(m.Key)]
		require.True(t, !ok || v == last[string(m.Key)]+8, "key %s: %d after %d", m.Key, v, last[string(m.Key)])
		last[string(m.Key)] = v
	}
	require.Len(t, last, 8)
}
