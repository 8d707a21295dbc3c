package migrations_test

// Third review of 00160 (f621cc3): the rewind function that now computes
// pgbox_outbox_slot of the old and new keys, and the rekeyed trigger that
// fires for any row.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// pgbox_outbox_slot(NULL, NULL) loops FOR i IN 0 .. length(NULL) - 1: an
// error ("upper bound of FOR loop cannot be null"). f621cc3's rewind
// function calls it for every unpark and every delete of a parked row:
// a keyless parked row whose event_id is NULL (NOT NULL dropped by an
// operator, a row written with its slot given) can no longer be retried
// or discarded; 00120's function only inserted OLD.slot. The relay's own
// finish is caught too: a row parked from outside while its send
// succeeds is deleted there (finishSQL matches a NULL event id through
// coalesce), the delete trigger errors, the whole batch's outcome is not
// recorded and it is sent again, every pass. FAILS on f621cc3, PASSES on
// 6b5bbfe. A fix: coalesce the slot function's input (or skip a NULL) in
// the rewind function, or make pgbox_outbox_slot return NULL for
// (NULL, NULL).
func TestAttack160cRewindOfKeylessRowWithoutEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, `ALTER TABLE pgbox_outbox ALTER COLUMN event_id DROP NOT NULL`)
	require.NoError(t, err)
	for _, c := range []struct{ what, sql string }{
		{"retry (unpark)", `UPDATE pgbox_outbox SET parked_at = NULL WHERE id = $1`},
		{"discard (delete)", `DELETE FROM pgbox_outbox WHERE id = $1`},
	} {
		var id int64
		require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value, event_id, slot, parked_at)
			VALUES ('t', NULL, 'v', NULL, 7, now()) RETURNING id`).Scan(&id))
		_, err = db.Pool.Exec(ctx, c.sql, id)
		require.NoError(t, err, "%s of a keyless parked row without an event id", c.what)
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox_rewinds WHERE slot = 7 AND from_id <= $1`, id).Scan(&n))
		require.GreaterOrEqual(t, n, 1, c.what)
	}
}
