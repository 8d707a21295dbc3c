package relay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// A history sample records each topic's backlog (parked rows excluded) and
// what this instance published of it; an idle outbox still leaves a marker
// row; samples older than two hours go.
func TestRecordHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	r := &Relay{cfg: Config{Pool: db.Pool}}
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
