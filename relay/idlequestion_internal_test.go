package relay

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// The Fleet's idle question reads the claim index, not the table, whatever
// the statistics say: an outbox keeps its deleted rows until autovacuum
// comes (migration 00150: after 5,000), and one that went idle with fewer
// keeps them; a sequential scan read every page of them at every poll
// (10,000 deleted 1 KB rows: 1,429 pages), where the index's dead entries
// are marked by the first scan and skipped. The question's answers stay
// right.
func TestIdleQuestionUsesClaimIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	exec := func(sql string) {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec(`ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`)
	exec(`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), i % 256, 'orders', convert_to('k' || i, 'UTF8'), convert_to(repeat('x', 1000), 'UTF8')
		FROM generate_series(1, 10000) i`)
	exec(`ANALYZE pgbox_outbox`)
	exec(`DELETE FROM pgbox_outbox`)

	// What the idle poll sends, in one implicit transaction per target.
	asked := func(f func(tx pgx.Tx) error) {
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, questionSetSQL); err != nil {
				return err
			}
			return f(tx)
		}))
	}
	ask := func() (held bool) {
		var us int64
		asked(func(tx pgx.Tx) error { return tx.QueryRow(ctx, idleQuestion(db.Schema)).Scan(&held, &us) })
		return held
	}
	var plan string
	asked(func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "EXPLAIN (FORMAT TEXT) "+idleQuestion(db.Schema))
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		plan = strings.Join(lines, "\n")
		return err
	})
	require.Contains(t, plan, "pgbox_outbox_claim_idx", plan)
	require.NotContains(t, plan, "Seq Scan", plan)
	require.NotContains(t, plan, "Bitmap", plan)

	require.False(t, ask(), "deleted rows are not held")
	exec(`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value) VALUES (gen_random_uuid(), 7, 'orders', 'k', 'v')`)
	require.True(t, ask(), "a row is")
}
