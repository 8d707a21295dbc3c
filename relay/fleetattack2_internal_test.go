package relay

// Hostile review of three changes (helper's attacks, round 2): a Fleet
// target's idle skip (wake.go nothingToClaim), the Fleet's shared watch
// rate (Fleet.watchers, Relay.watchEvery) and the history sample of a fresh
// outbox (history.go historyTopSQL's coalesce(..., 0)).

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// attack2Fleet runs a Fleet over n fresh targets of one pool until the test
// ends; it returns the Fleet, the targets' databases and a stop function
// (idempotent) that waits for Run to return.
func attack2Fleet(t *testing.T, n int, tune func(*Config)) (*Fleet, []*testdb.DB, []Target, func()) {
	t.Helper()
	ctx := context.Background()
	c := kafkatest.New(t)
	kafkatest.CreateTopic(t, c.ListenAddrs(), "w", 1, nil)
	pool, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var ts []Target
	var dbs []*testdb.DB
	for i := range n {
		d := testdb.New(t)
		dbs = append(dbs, d)
		ts = append(ts, Target{Name: fmt.Sprint(i), Pool: pool, Schema: d.Schema})
	}
	kc := kafkatest.Config()
	kc.Producer.RequiredAcks = -1
	cfg := Config{Brokers: c.ListenAddrs(), Kafka: kc, HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second}
	if tune != nil {
		tune(&cfg)
	}
	// These attacks are on an awake target's own idle poll: no dormancy
	// (targets would start dormant, without lanes).
	f, err := NewFleet(FleetConfig{Relay: cfg, Targets: ts, DormantAfter: -1})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		require.NoError(t, <-done)
	}
	t.Cleanup(stop)
	attack2Wait(t, f, "every target holds lanes", func() bool {
		for _, s := range f.Targets() {
			if s.Stats.Lanes == 0 {
				return false
			}
		}
		return true
	})
	return f, dbs, ts, stop
}

func attack2Wait(t *testing.T, f *Fleet, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s (watchers %d)", what, f.watchers.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Attack (idle skip, cost): emptySQL walks pgbox_outbox with no lower
// bound. Under a held snapshot (pg_dump, a long report) every deleted row
// stays in the claim index and the heap, and no scan may mark it dead, so
// each idle poll's "cheap question" reads all of them; the claim it
// replaces starts each slot at its floor and reads none. What must hold:
// a slow question is not asked again for a while (the idle polls claim,
// as a relay alone does), so a hold costs one slow question per target
// per emptyPause, not one a second. Logs the plan and the time.
func TestFleetAttack2EmptyCheckUnderHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), g % 256, 't', 'k', 'v' FROM generate_series(1, 200000) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE pgbox_outbox`)
	require.NoError(t, err)
	// The hold: a repeatable-read snapshot taken before the delete.
	hold, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	var one int
	require.NoError(t, hold.QueryRow(ctx, `SELECT 1 FROM pgbox_outbox LIMIT 1`).Scan(&one))
	_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox`)
	require.NoError(t, err)

	r := testRelay(Config{Pool: db.Pool, Logger: slog.New(slog.DiscardHandler)}, "")
	r.log = r.cfg.Logger
	var times []time.Duration
	for range 3 {
		t0 := time.Now()
		var empty bool
		require.NoError(t, r.db.queryRow(ctx, emptySQL, nil, &empty))
		times = append(times, time.Since(t0))
		require.True(t, empty)
	}
	// Whatever this machine's speed, a question slower than the bound
	// (here 1 ns: every one) pauses the skip.
	r.emptySlow = time.Nanosecond
	t0 := time.Now()
	r.nothingToClaim(ctx) // asks, finds it slow
	require.True(t, r.emptyPausedUntil.After(time.Now().Add(emptyPause-time.Minute)), "a slow question pauses the skip")
	t1 := time.Now()
	require.False(t, r.nothingToClaim(ctx), "paused: the idle poll claims")
	require.Less(t, time.Since(t1), time.Millisecond, "paused: nothing asked (the first took %s)", t1.Sub(t0))
	var plan []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+emptySQL).Scan(&plan))
	var p []struct {
		Plan map[string]any `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(plan, &p))
	var blocks float64
	var walk func(n map[string]any)
	nodes := ""
	walk = func(n map[string]any) {
		nodes += fmt.Sprintf("%v(%v) ", n["Node Type"], n["Index Name"])
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
	}
	walk(p[0].Plan)
	blocks = p[0].Plan["Shared Hit Blocks"].(float64) + p[0].Plan["Shared Read Blocks"].(float64)
	t.Logf("emptySQL with 200k rows deleted under a held snapshot: %v; plan %s; %v blocks", times, nodes, blocks)
	// The same question along the claim index (what the planner picks once
	// statistics say the table is small): every dead entry, and its heap.
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		var idx []byte
		t0 := time.Now()
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+emptySQL).Scan(&idx); err != nil {
			return err
		}
		var q []struct {
			Plan map[string]any `json:"Plan"`
		}
		if err := json.Unmarshal(idx, &q); err != nil {
			return err
		}
		nodes = ""
		walk(q[0].Plan)
		t.Logf("emptySQL without seqscan: %s; plan %s; %v blocks", time.Since(t0), nodes,
			q[0].Plan["Shared Hit Blocks"].(float64)+q[0].Plan["Shared Read Blocks"].(float64))
		return nil
	}))
	t.Logf("%v blocks per question under the hold (%v each): asked once per %s per target", blocks, times, emptyPause)
}

// Attack (idle skip): rows an idle Fleet target must still find within a
// poll interval with no notification: a row whose writer's transaction
// was in progress across idle polls (the EXISTS did not see it) and
// commits later, and a parked row an operator retries (parked_at back to
// NULL; its id is below the slot's floor). What must hold: both are
// published (deleted) within a few poll intervals.
func TestFleetAttack2IdleSkipFindsLateAndRetriedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, dbs, _, _ := attack2Fleet(t, 1, func(c *Config) { c.PollInterval = 200 * time.Millisecond; c.NoListen = false })
	db := dbs[0]
	attack2Wait(t, f, "asleep", func() bool { return f.watchers.Load() == 0 })

	// A parked row (the relay never claims it), and a row of another key
	// in its slot published meanwhile, so that the slot's floor passes the
	// parked row's id.
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (slot, topic, key, value, parked_at) VALUES (7, 'w', 'p', 'v', now())`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (slot, topic, key, value) VALUES (7, 'w', 'q', 'v2')`)
	require.NoError(t, err)
	count := func(where string) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox WHERE `+where).Scan(&n))
		return n
	}
	attack2Wait(t, f, "the unparked row published", func() bool { return count("parked_at IS NULL") == 0 })
	attack2Wait(t, f, "asleep", func() bool { return f.watchers.Load() == 0 })

	// The late writer: its transaction spans several idle polls.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('w', 'late', 'v')`)
	require.NoError(t, err)
	time.Sleep(700 * time.Millisecond) // three idle polls find the outbox empty
	require.NoError(t, tx.Commit(ctx))
	t0 := time.Now()
	attack2Wait(t, f, "the late row published", func() bool { return count("true") == 1 })
	t.Logf("late row published %s after its commit", time.Since(t0))
	require.Less(t, time.Since(t0), 5*time.Second)

	// The operator's retry: the parked row comes back below the floor.
	attack2Wait(t, f, "asleep", func() bool { return f.watchers.Load() == 0 })
	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = NULL, attempts = 0, failing_since = NULL WHERE parked_at IS NOT NULL`)
	require.NoError(t, err)
	t0 = time.Now()
	attack2Wait(t, f, "the retried row published", func() bool { return count("true") == 0 })
	t.Logf("retried row published %s after its retry", time.Since(t0))
	require.Less(t, time.Since(t0), 5*time.Second)
}

// Attack (shared watch rate): Fleet.watchers counts a relay from the
// start of its work loop until its sleeping flag is set. With
// Config.NoListen a relay never sets the flag, so every idle target (which
// watches nothing: it polls every PollInterval) is counted as watching,
// for ever, and every busy target's watch slows as if they all were busy
// (10,000 NoListen targets at the default 5000/s: every busy one watches
// every 2 s instead of 2 ms). What must hold: once no target has had rows
// for the busy window and its grace, the count is 0.
func TestFleetAttack2WatchersNoListenIdle(t *testing.T) {
	t.Parallel()
	f, _, _, _ := attack2Fleet(t, 2, func(c *Config) { c.NoListen = true })
	time.Sleep(busyWindow + 2*sleepGrace + 500*time.Millisecond)
	require.EqualValues(t, 0, f.watchers.Load(), "idle NoListen targets counted as watching")
}

// Attack (shared watch rate, drift): a busy target removed by SetTargets
// while it watches, its replacement added back, and the Fleet stopped
// while a target is in its grace. What must hold: the count is back to 0
// once every target sleeps, and 0 after Run returns (a count stuck high
// slows every busy target's watch for ever; a negative one is worse:
// watchEvery would be BusyPollInterval whatever WatchRate).
func TestFleetAttack2WatchersNoDrift(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, dbs, ts, stop := attack2Fleet(t, 2, nil)
	attack2Wait(t, f, "every target asleep", func() bool { return f.watchers.Load() == 0 })
	w, err := outbox.NewWriter(outbox.Config{Notify: true})
	require.NoError(t, err)
	write := func(d *testdb.DB) {
		require.NoError(t, pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
			return w.Write(ctx, tx, outbox.Message{Topic: "w", Key: []byte("k"), Value: []byte("v")})
		}))
	}
	write(dbs[0])
	attack2Wait(t, f, "target 0 watching", func() bool { return f.watchers.Load() == 1 })
	require.NoError(t, f.SetTargets(ts[1:]))
	// The removed target's count went with it (the other may watch a
	// moment for its own reasons: the count must come back to 0).
	attack2Wait(t, f, "the removed target's count gone", func() bool { return f.watchers.Load() == 0 })
	require.NoError(t, f.SetTargets(ts))
	attack2Wait(t, f, "every target holds lanes", func() bool {
		for _, s := range f.Targets() {
			if s.Stats.Lanes == 0 {
				return false
			}
		}
		return true
	})
	attack2Wait(t, f, "every target asleep again", func() bool { return f.watchers.Load() == 0 })
	// Stop while target 1 is busy (watching, or in its grace).
	write(dbs[1])
	attack2Wait(t, f, "target 1 watching", func() bool { return f.watchers.Load() == 1 })
	stop()
	require.EqualValues(t, 0, f.watchers.Load(), "after Run returned")
}

// Attack (history of a fresh outbox): ALTER ... RESTART while rows remain
// makes pg_sequence_last_value NULL again, now read as 0: below the
// highest id seen, so "the sequence went back" and every slot is searched
// for again. The rows above the restart must still be counted (they are:
// the search finds them). But the sequence stays "back" at every sample
// until a writer takes an id: each sample throws its state away and counts
// every slot from its start again, reading every dead entry a hold keeps
// (the cost issue 32 removed). Before the change a NULL last value left
// the state alone. What must hold: the backlog is right, and a sample that
// sees the same sequence as the previous one keeps its state.
func TestFleetAttack2HistoryRestartWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r := testRelay(Config{Pool: db.Pool}, "")
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), g % 256, 't', 'k', 'v' FROM generate_series(1, 1000) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox WHERE id <= 990`)
	require.NoError(t, err)
	backlog, err := r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 10, backlog)
	_, err = db.Pool.Exec(ctx, `ALTER TABLE pgbox_outbox ALTER COLUMN id RESTART`)
	require.NoError(t, err)
	backlog, err = r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 10, backlog, "rows above the restart are counted")
	const sentinel = 1 << 40
	r.hist.scan = sentinel // a sample that keeps its state leaves it
	backlog, err = r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 10, backlog)
	require.EqualValues(t, sentinel, r.hist.scan, "the sample threw its state away although the sequence did not move")
}

// Attack (history of a fresh outbox): rows written with OVERRIDING SYSTEM
// VALUE before the sequence ever handed out an id (a restore, a copy from
// another outbox) far above the first discovery window. last_value is NULL,
// read as 0. What must hold: they are counted at the first sample, and the
// next sample keeps the state (same churn as above).
func TestFleetAttack2HistoryOverrideBeforeNextval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r := testRelay(Config{Pool: db.Pool}, "")
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (id, event_id, slot, topic, key, value) OVERRIDING SYSTEM VALUE
		SELECT 5000000 + g, gen_random_uuid(), g % 256, 't', 'k', 'v' FROM generate_series(1, 20) g`)
	require.NoError(t, err)
	backlog, err := r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 20, backlog, "rows of ids no sequence handed out are counted")
	const sentinel = 1 << 40
	r.hist.scan = sentinel
	backlog, err = r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 20, backlog)
	require.EqualValues(t, sentinel, r.hist.scan, "the sample threw its state away although the sequence did not move")
}

// Attack (history): a relay role without privilege on the sequence takes
// the NULL path (unchanged by the coalesce, which sits inside the CASE):
// rows above the first window are still counted once found. What must
// hold: the backlog is right and the sample does not fail.
func TestFleetAttack2HistoryNoSequencePrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	role := "pgbox_attack2_" + fmt.Sprint(time.Now().UnixNano())
	_, err := db.Pool.Exec(ctx, `CREATE ROLE `+role)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA %[1]s TO %[2]s; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA %[1]s TO %[2]s`,
		pgx.Identifier{db.Schema}.Sanitize(), role))
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (id, event_id, slot, topic, key, value) OVERRIDING SYSTEM VALUE
		SELECT 300000 + g, gen_random_uuid(), g % 256, 't', 'k', 'v' FROM generate_series(1, 7) g`)
	require.NoError(t, err)
	cfg := db.Pool.Config()
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE `+role)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r := testRelay(Config{Pool: pool}, "")
	var top *int64
	require.NoError(t, pool.QueryRow(ctx, historyTopSQL).Scan(&top))
	require.Nil(t, top, "no privilege: NULL")
	var backlog int64
	for range 5 { // discovery may take a few samples
		backlog, err = r.recordHistory(ctx, nil)
		require.NoError(t, err)
		if backlog == 7 {
			break
		}
	}
	require.EqualValues(t, 7, backlog)
}
