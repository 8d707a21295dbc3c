package inspect_test

// Review of 00150's backlog estimate (sqlBacklogLive: the cumulative
// statistics' live rows minus the parked index's reltuples, the claim
// index's reltuples when the live rows read 0), attacked with the outbox's
// statistics reset, deleted rows left unvacuumed and parked rows moved by an
// operator.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
)

// liveTuples waits until the outbox's cumulative statistics read want live
// rows (backends send theirs a second or so after a transaction).
func liveTuples(t *testing.T, db *testdb.DB, want int64) {
	t.Helper()
	var n, ins, del, dead int64
	require.Eventually(t, func() bool {
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT pg_stat_get_live_tuples('pgbox_outbox'::regclass), pg_stat_get_tuples_inserted('pgbox_outbox'::regclass),
				pg_stat_get_tuples_deleted('pgbox_outbox'::regclass), pg_stat_get_dead_tuples('pgbox_outbox'::regclass)`).Scan(&n, &ins, &del, &dead))
		return n == want
	}, 30*time.Second, 100*time.Millisecond, "live tuples %d, want %d (inserted %d, deleted %d, dead %d)", n, want, ins, del, dead)
}

// flushed runs sql on a connection of its own and closes it: a backend
// sends its pending statistics as it exits (an idle pool connection may
// keep them for long).
func flushed(t *testing.T, db *testdb.DB, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
}

func readSnap(t *testing.T, db *testdb.DB) *inspect.Snapshot {
	t.Helper()
	snap, err := inspect.Read(context.Background(), db.Pool, inspect.Config{})
	require.NoError(t, err)
	return snap
}

// The outbox's statistics are reset (pg_stat_reset, or a crash or an
// immediate shutdown, which discard them all) while it holds a backlog of
// 20,000 rows, then traffic goes on: 300 rows written, 200 published
// (deleted). The live rows then read 100 (the deltas since the reset), not
// 0, so the claim index's reltuples no longer stands in, and the backlog
// reads the exact limit (1,000) until the next ANALYZE or VACUUM, which
// 00150 makes rare. The estimate must stay near the real backlog.
func TestAttack150BacklogEstimateAfterStatsResetWithTraffic(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	exec(t, db, `ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`)
	flushed(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) SELECT gen_random_uuid(), 1, 'orders', 'v' FROM generate_series(1, 20000)`)
	liveTuples(t, db, 20000)
	exec(t, db, `ANALYZE pgbox_outbox`)
	liveTuples(t, db, 20000)
	require.InDelta(t, 20000, readSnap(t, db).Outbox.Unpublished, 1000, "before the reset")

	// Only this schema's table: pg_stat_reset() would reset the shared
	// database's every table.
	exec(t, db, `SELECT pg_stat_reset_single_table_counters('pgbox_outbox'::regclass)`)
	liveTuples(t, db, 0)
	snap := readSnap(t, db)
	require.True(t, snap.Outbox.Estimated)
	require.InDelta(t, 20000, snap.Outbox.Unpublished, 1000, "just after the reset: the claim index's reltuples")

	flushed(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) SELECT gen_random_uuid(), 2, 'orders', 'v' FROM generate_series(1, 300)`)
	flushed(t, db, `DELETE FROM pgbox_outbox WHERE id IN (SELECT id FROM pgbox_outbox ORDER BY id LIMIT 200)`)
	liveTuples(t, db, 100)
	snap = readSnap(t, db)
	require.True(t, snap.Outbox.Estimated)
	t.Logf("after the reset and 300 written, 200 published: unpublished %d (real 20,100)", snap.Outbox.Unpublished)
	require.GreaterOrEqual(t, snap.Outbox.Unpublished, int64(10000), "a backlog of 20,100 after a statistics reset and some traffic")
	require.GreaterOrEqual(t, snap.Outbox.Unpublished, int64(0))
}

// Deleted rows pile up unvacuumed (20,000 written, 15,000 published),
// 3,000 rows are parked and never analyzed: the estimate counts every
// unpublished unparked row at least, never below the exact limit, never
// negative, and at most the live rows.
func TestAttack150BacklogEstimateDeadRowsAndParked(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	exec(t, db, `ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`)
	flushed(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) SELECT gen_random_uuid(), 1, 'orders', 'v' FROM generate_series(1, 20000)`)
	flushed(t, db, `DELETE FROM pgbox_outbox WHERE id IN (SELECT id FROM pgbox_outbox ORDER BY id LIMIT 15000)`)
	flushed(t, db, `UPDATE pgbox_outbox SET parked_at = now() WHERE id IN (SELECT id FROM pgbox_outbox ORDER BY id LIMIT 3000)`)
	liveTuples(t, db, 5000)
	var dead int64
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgbox_outbox'::regclass`).Scan(&dead))
	t.Logf("n_dead_tup %d", dead)
	snap := readSnap(t, db)
	require.True(t, snap.Outbox.Estimated)
	require.GreaterOrEqual(t, snap.Outbox.Unpublished, int64(2000), "2,000 unparked rows")
	require.LessOrEqual(t, snap.Outbox.Unpublished, int64(5000), "at most the live rows")
	for _, tp := range snap.Topics {
		require.GreaterOrEqual(t, tp.Unpublished, int64(0), tp.Topic)
	}
}

// An operator retries 4,000 parked rows at once (they move back to the
// claim index), or discards them: the parked index's reltuples, which the
// estimate subtracts, stays at the last analyze's 4,000 until a vacuum
// (00150: after 5,000 dead rows plus 1%). The estimate must not fall far
// below the real backlog.
func TestAttack150BacklogEstimateAfterOperatorRetry(t *testing.T) {
	t.Parallel()
	for _, action := range []string{"retry", "discard"} {
		t.Run(action, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			exec(t, db, `ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`)
			flushed(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) SELECT gen_random_uuid(), 1, 'orders', 'v' FROM generate_series(1, 10000)`)
			flushed(t, db, `UPDATE pgbox_outbox SET parked_at = now() WHERE id IN (SELECT id FROM pgbox_outbox ORDER BY id LIMIT 4000)`)
			liveTuples(t, db, 10000)
			exec(t, db, `ANALYZE pgbox_outbox`)
			liveTuples(t, db, 10000)
			require.InDelta(t, 6000, readSnap(t, db).Outbox.Unpublished, 600, "before the operator's action")
			real := int64(10000)
			if action == "retry" {
				flushed(t, db, `UPDATE pgbox_outbox SET parked_at = NULL WHERE parked_at IS NOT NULL`)
			} else {
				flushed(t, db, `DELETE FROM pgbox_outbox WHERE parked_at IS NOT NULL`)
				real = 6000
				liveTuples(t, db, 6000)
			}
			time.Sleep(500 * time.Millisecond)
			snap := readSnap(t, db)
			t.Logf("%s: unpublished %d (real %d)", action, snap.Outbox.Unpublished, real)
			require.GreaterOrEqual(t, snap.Outbox.Unpublished, real/2, "%s of 4,000 parked rows: a backlog of %d", action, real)
		})
	}
}

// A TRUNCATE of an analyzed outbox (its live rows set to 0, reltuples
// kept by the new index's build), then 3,000 rows and 1,500 parked ones
// written and never analyzed, and the same after the statistics are reset
// too: the backlog reads at least about 3,000 and at most the 4,500 live
// rows (parked rows past the exact limit are taken off as the limit: the
// parked index's reltuples, 0 since the TRUNCATE, is lower), never
// negative.
func TestAttack150BacklogEstimateAfterTruncate(t *testing.T) {
	t.Parallel()
	for _, reset := range []bool{false, true} {
		db := testdb.New(t)
		exec(t, db, `ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`)
		flushed(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) SELECT gen_random_uuid(), 1, 'orders', 'v' FROM generate_series(1, 20000)`)
		liveTuples(t, db, 20000)
		exec(t, db, `ANALYZE pgbox_outbox`)
		flushed(t, db, `TRUNCATE pgbox_outbox`)
		if reset {
			exec(t, db, `SELECT pg_stat_reset_single_table_counters('pgbox_outbox'::regclass)`)
		}
		flushed(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) SELECT gen_random_uuid(), 1, 'orders', 'v' FROM generate_series(1, 3000)`)
		flushed(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value, parked_at) SELECT gen_random_uuid(), 2, 'orders', 'v', now() FROM generate_series(1, 1500)`)
		liveTuples(t, db, 4500)
		snap := readSnap(t, db)
		t.Logf("reset %v: unpublished %d (real 3,000)", reset, snap.Outbox.Unpublished)
		require.True(t, snap.Outbox.Estimated)
		require.GreaterOrEqual(t, snap.Outbox.Unpublished, int64(2700), "reset %v", reset)
		require.LessOrEqual(t, snap.Outbox.Unpublished, int64(4500), "reset %v", reset)
		for _, tp := range snap.Topics {
			require.GreaterOrEqual(t, tp.Unpublished, int64(0))
		}
	}
}
