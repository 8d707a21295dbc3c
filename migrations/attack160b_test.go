package migrations_test

// Second review of 00160 after 6b5bbfe: the rekeyed trigger
// (pgbox_outbox_rewind_rekeyed) against the claim a v0.1.0 relay calls
// during an upgrade (pgbox_outbox_claim, which deletes the rewinds of its
// slots as it applies them), and the schema its rewinds are written to.
// (A script rekeying 100,000 parked rows in one statement, measured once:
// 1.12 s without the trigger, 2.16 s with it, 100,000 rewinds; then
// claim2 with none of them seen 21 ms, with all seen 6.8 ms; the v0.1.0
// claim 133 ms, deleting them, then 25 ms.)

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// A v0.1.0 relay owns every lane, its floors past a row held by a parked
// row of its key. The parked row is unparked by hand (a retry from psql):
// 00120's trigger writes the rewind, which reaches the v0.1.0 claim (00160
// replaces it), which starts the slot at the parked row again, returns it
// and the row it held, and deletes the rewind (its design). PASSES.
func TestAttack160bLegacyClaimAppliesTheRetryRewind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, q, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at) SELECT g, 16, 'old', now() + interval '1 hour' FROM generate_series(0, 15) g`)
	var parked, held int64
	var slot int
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value, parked_at) VALUES ('t', 'k', 'parked', now()) RETURNING id, slot`).Scan(&parked, &slot))
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'held') RETURNING id`).Scan(&held))
	var epoch int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT epoch FROM pgbox_relay_lanes WHERE lane = $1`, slot%16).Scan(&epoch))
	legacy := func() (ids []int64, floor int64) {
		t.Helper()
		rows, err := db.Pool.Query(ctx, `SELECT id, floor FROM pgbox_outbox_claim('old', 16, ARRAY[$1::int], ARRAY[$2::bigint], ARRAY[$3::bigint], 100, 100)`,
			slot, held+1, epoch)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var id, f *int64
			require.NoError(t, rows.Scan(&id, &f))
			if id != nil {
				ids = append(ids, *id)
			} else {
				floor = *f
			}
		}
		require.NoError(t, rows.Err())
		return ids, floor
	}
	ids, floor := legacy()
	require.Empty(t, ids, "above the floor, nothing")
	require.Equal(t, held+1, floor)
	exec(`UPDATE pgbox_outbox SET parked_at = NULL WHERE id = $1`, parked) // an operator's retry by hand
	ids, floor = legacy()
	require.Equal(t, []int64{parked, held}, ids, "the rewind brought the retried row and the row it held back")
	require.Equal(t, parked, floor)
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox_rewinds`).Scan(&left))
	require.Zero(t, left, "the v0.1.0 claim consumed it")
	ids, _ = legacy()
	require.Empty(t, ids)
}

// pgbox_outbox_rewind(), the function behind 00120's triggers, named
// pgbox_outbox_rewinds unqualified and, unlike pgbox_outbox_xid_first and
// pgbox_outbox_fill_slot, had no search_path of its own: the rewind went
// to whatever pgbox_outbox_rewinds the session's search_path found. Two
// schemas of one database (a Fleet's targets, `make tenants`): an operator
// whose session is set to tenant B retries a parked row of tenant A by
// its qualified name. A's rewind was written into B's table: A's relays
// never saw it (the rows the row held waited for the sweep and were
// counted below a floor), B's relays rescanned for nothing. (With a
// search_path that has no pgbox_outbox_rewinds the UPDATE failed.)
// Failed before 00160 pinned the function's search_path.
func TestAttack160bRewindTriggerWritesItsOwnSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testdb.New(t), testdb.New(t)
	qa := pgx.Identifier{a.Schema, "pgbox_outbox"}.Sanitize()
	count := func(db *testdb.DB) int {
		t.Helper()
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox_rewinds`).Scan(&n))
		return n
	}
	_, err := a.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value, parked_at) VALUES ('t', 'k', 'parked', now())`)
	require.NoError(t, err)
	for _, c := range []struct{ what, sql string }{
		{"unparked (00120's trigger)", `UPDATE ` + qa + ` SET parked_at = NULL WHERE value = 'parked'`},
	} {
		beforeA, beforeB := count(a), count(b)
		_, err = b.Pool.Exec(ctx, c.sql) // b's session: search_path is b's schema
		require.NoError(t, err, c.what)
		gotA, gotB := count(a)-beforeA, count(b)-beforeB
		require.Equal(t, []int{1, 0}, []int{gotA, gotB},
			"%s on %s from a session whose search_path is %s: rewinds written to %s: %d, to %s: %d",
			c.what, a.Schema, b.Schema, a.Schema, gotA, b.Schema, gotB)
	}
}
