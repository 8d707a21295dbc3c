package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

func parkedIDList(t *testing.T, db *testdb.DB) []int64 {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT id FROM pgbox_outbox WHERE parked_at IS NOT NULL ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

// `parked retry` and `parked discard` with an id that is not a parked row
// fail (exit 1) naming it, as `dead replay` does, and change nothing.
func TestParkedUnknownIDFails(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	park(t, db, "orders", time.Hour, "e")
	ids := parkedIDList(t, db)
	require.Len(t, ids, 1)
	env := []string{"DATABASE_URL=" + db.URL}
	missing := strconv.FormatInt(ids[0]+1000, 10)

	for _, args := range [][]string{
		{"parked", "retry", missing},
		{"parked", "retry", strconv.FormatInt(ids[0], 10), missing},
		{"parked", "discard", "--yes", missing},
	} {
		r := runRelay(t, time.Minute, env, args...)
		require.Equal(t, 1, r.Code, "%v: %s", args, r.Stdout)
		require.Contains(t, r.Stderr, "no such parked row "+missing, args)
		require.Equal(t, ids, parkedIDList(t, db), "%v changed nothing", args)
	}
	r := runRelay(t, time.Minute, env, "dead", "replay", missing)
	require.Equal(t, 1, r.Code, r.Stdout)
	require.Contains(t, r.Stderr, "no such dead letter")

	r = runRelay(t, time.Minute, env, "parked", "retry", strconv.FormatInt(ids[0], 10))
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "retried 1 parked row(s)")
	require.Empty(t, parkedIDList(t, db))
}

// The discard preview counts every selected row but says how many --limit
// let it show.
func TestDiscardPreviewRespectsLimit(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	for range 3 {
		park(t, db, "orders", time.Hour, "e")
	}
	env := []string{"DATABASE_URL=" + db.URL}
	r := runRelay(t, time.Minute, env, "parked", "discard", "--limit=2")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "would discard 3 parked row(s) (2 shown: --limit)")
	require.Contains(t, r.Stderr, "add --yes to delete the 3 row(s) selected (2 shown: --limit)")
	require.NotContains(t, r.Stderr, "3 row(s) shown")

	r = runRelay(t, time.Minute, env, "parked", "discard")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "would discard 3 parked row(s)\n")
	require.Len(t, parkedIDList(t, db), 3)
}
