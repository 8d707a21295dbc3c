package relay

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
)

// A history sample records each topic's backlog (parked rows excluded) and
// what this instance published of it; an idle outbox still leaves a marker
// row; samples older than two hours go.
func TestRecordHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r := testRelay(Config{Pool: db.Pool}, "")
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, parked_at)
		SELECT gen_random_uuid(), 0, t, 'k', 'v', p FROM (VALUES ('a', NULL), ('a', NULL), ('b', NULL), ('b', now())) AS v(t, p)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_relay_history (at, topic, backlog, published) VALUES (now() - interval '3 hours', 'old', 1, 1)`)
	require.NoError(t, err)
	backlog, err := r.recordHistory(ctx, map[string]uint64{"a": 7, "c": 3})
	require.NoError(t, err)
	require.EqualValues(t, 3, backlog, "the whole backlog, parked rows excluded")
	rows, err := db.Pool.Query(ctx, `SELECT topic, backlog, published FROM pgbox_relay_history ORDER BY topic`)
	require.NoError(t, err)
	type sample struct {
		Topic              string
		Backlog, Published int64
	}
	var got []sample
	for rows.Next() {
		var s sample
		require.NoError(t, rows.Scan(&s.Topic, &s.Backlog, &s.Published))
		got = append(got, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []sample{{"", 0, 0}, {"a", 2, 7}, {"b", 1, 0}, {"c", 0, 3}}, got)
}

// outboxBlocks is how many blocks of pgbox_outbox and its indexes the
// connections of pool have read or found in shared buffers (pool holds one
// connection: its statistics are flushed before they are read).
func outboxBlocks(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	require.NoError(t, err)
	var n int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)
		+ coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)
		FROM pg_statio_user_tables WHERE relid = 'pgbox_outbox'::regclass`).Scan(&n))
	return n
}

// Under a held snapshot (as pg_dump holds one) with many published, deleted
// rows, a history sample answers, writes its rows and counts the backlog
// exactly; once the relay has found where each
// slot's rows begin, a sample reads a few blocks, not the table's dead rows
// (before issue 32 every sample read the whole bloated heap, and with 1.7M
// dead rows was cancelled at every heartbeat).
func TestRecordHistoryUnderHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewDatabase(t) // the hold is per database
	const rows = 300_000
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), g % 256, 't' || (g % 3), 'k', repeat('v', 200)::bytea FROM generate_series(1, $1::int) g`, rows)
	require.NoError(t, err)
	db.HoldSnapshot(t, "history-test")
	// Everything but ten rows was published; one of the ten is parked.
	_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox WHERE id NOT IN (SELECT id FROM pgbox_outbox ORDER BY id DESC LIMIT 10)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = now() WHERE id = (SELECT max(id) FROM pgbox_outbox)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE pgbox_outbox`) // removes nothing: the snapshot is held
	require.NoError(t, err)
	var pages int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE oid = 'pgbox_outbox'::regclass`).Scan(&pages))

	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r := testRelay(Config{Pool: pool}, "")
	sample := func() int64 {
		t.Helper()
		// The heartbeat gives a sample its interval (2 s); the test gives
		// more, so that a busy machine does not fail it: what it checks is
		// what a sample reads, below.
		cctx, cancel := context.WithTimeout(ctx, 5*HeartbeatIntervalDefault)
		defer cancel()
		backlog, err := r.recordHistory(cctx, nil)
		require.NoError(t, err)
		return backlog
	}
	// The first samples find where each slot's rows begin, in bounded
	// windows; they count a lower bound meanwhile.
	for i := 0; sample() != 9; i++ {
		require.Less(t, i, 50, "the backlog is counted exactly once every slot is found")
	}
	for range 3 {
		before := outboxBlocks(t, pool)
		require.EqualValues(t, 9, sample())
		read := outboxBlocks(t, pool) - before
		// One index descent per slot (a few blocks each) and the rows:
		// nothing that grows with the dead rows.
		require.Less(t, read, pages/4, "a sample reads %d blocks; the table has %d pages", read, pages)
	}
	var samples int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_history WHERE topic = ''`).Scan(&samples))
	require.GreaterOrEqual(t, samples, 4, "every sample is written")

	// Rows written since are counted; published ones no longer are.
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), g % 256, 'new', 'k', 'v' FROM generate_series(1, 300) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox WHERE topic <> 'new' AND parked_at IS NULL`)
	require.NoError(t, err)
	require.EqualValues(t, 300, sample())
	var backlog int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT backlog FROM pgbox_relay_history WHERE topic = 'new' ORDER BY at DESC LIMIT 1`).Scan(&backlog))
	require.EqualValues(t, 300, backlog)
}

// The sequence going back (TRUNCATE … RESTART IDENTITY) makes the relay
// find where the slots' rows begin again: new rows below the old starts are
// counted.
func TestRecordHistorySequenceBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r := testRelay(Config{Pool: db.Pool}, "")
	insert := func(n int) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), g % 256, 't', 'k', 'v' FROM generate_series(1, $1::int) g`, n)
		require.NoError(t, err)
	}
	insert(1000)
	backlog, err := r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1000, backlog)
	_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox`)
	require.NoError(t, err)
	backlog, err = r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, backlog)

	_, err = db.Pool.Exec(ctx, `TRUNCATE pgbox_outbox RESTART IDENTITY`)
	require.NoError(t, err)
	insert(5)
	backlog, err = r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 5, backlog)
}

// The backlog count runs on a goroutine of its own: a count that cannot
// finish (here it waits for a lock on the history table until its
// timeout, one heartbeat interval) delays neither the heartbeat that takes
// the lanes once Kafka answers nor the rows' publishing. It used to run in
// the heartbeat loop, and the first count (at the first heartbeat, before
// Kafka answered) held the lanes back for as long as it took.
func TestBacklogCountDelaysNoHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(1, "events"))
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE pgbox_relay_history IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('events', 'k', 'v')`)
	require.NoError(t, err)

	kcfg := kafkatest.Config()
	kcfg.Producer.Idempotent, kcfg.Producer.RequiredAcks, kcfg.Net.MaxOpenRequests = true, sarama.WaitForAll, 1
	kcfg.Producer.Return.Successes = true
	r, err := New(Config{Pool: db.Pool, Brokers: c.ListenAddrs(), Kafka: kcfg, Instance: "count", Lanes: 4,
		HeartbeatInterval: 20 * time.Second, LeaseTTL: time.Minute, NoListen: true})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	t0 := time.Now()
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	for r.Stats().Published == 0 {
		require.Less(t, time.Since(t0), 10*time.Second, "the row is published while the count waits (lanes held: %d)", r.Stats().Lanes)
		time.Sleep(10 * time.Millisecond)
	}
	require.EqualValues(t, 4, r.Stats().Lanes)
}

// An outbox nobody ever wrote to (its sequence never handed out an id) has
// every slot found empty at the first sample, without windows searched
// until the time budget ends: a Fleet's thousand idle targets each did so
// every ten seconds.
func TestHistoryFreshOutboxFoundAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r := testRelay(Config{Pool: db.Pool}, "")
	start := time.Now()
	backlog, err := r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, backlog)
	for s := range slot.Count {
		require.True(t, r.hist.found[s], "slot %d found", s)
		require.EqualValues(t, 1, r.hist.from[s], "slot %d counts from the first id the sequence will give", s)
	}
	t.Logf("first sample of a fresh outbox: %s", time.Since(start))

	// Rows written next are counted.
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value) SELECT 'a', convert_to('k' || i, 'UTF8'), 'v'::bytea FROM generate_series(1, 5) i`)
	require.NoError(t, err)
	backlog, err = r.recordHistory(ctx, nil)
	require.NoError(t, err)
	require.EqualValues(t, 5, backlog)
}
