package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// The rekeyed trigger now fires for any row, and its rewind's INSERT holds
// ROW EXCLUSIVE on pgbox_outbox_rewinds until the transaction ends, which
// every claim waits for (claim2 begins with LOCK TABLE
// pgbox_outbox_rewinds IN SHARE MODE). A writer (00120: any SQL writer)
// that inserts its row and then sets its topic or key in the same
// transaction (an ORM's insert-then-update, a routing decided later)
// records a rewind for a row no relay can have seen, and every claim of
// the schema, every lane of every relay, waits for the writer's
// transaction to end. On 6b5bbfe the trigger fired for parked rows only:
// writers never touched the rewinds. A fix: skip rows inserted by the
// same transaction (xmin = pg_current_xact_id()), or rows not yet visible
// to any claim. FAILS on f621cc3.
func TestAttack160cWriterRekeyInOpenTransactionStallsClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at) SELECT g, 16, 'x', now() + interval '1 hour' FROM generate_series(0, 15) g`)
	require.NoError(t, err)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var id int64
	require.NoError(t, tx.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('pending', 'k', 'v') RETURNING id`).Scan(&id))
	_, err = tx.Exec(ctx, `UPDATE pgbox_outbox SET topic = 'orders' WHERE id = $1`, id)
	require.NoError(t, err)
	// The writer's transaction goes on with its business work.

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET lock_timeout = '2s'`)
	require.NoError(t, err)
	start := time.Now()
	rows, err := conn.Query(ctx, `SELECT id FROM pgbox_outbox_claim2('x', 16,
		(SELECT array_agg(g) FROM generate_series(0, 255) g), array_fill(0::bigint, ARRAY[256]), array_fill(0::bigint, ARRAY[256]),
		NULL, 0, 0, 0, '{}', false, 100, 1000)`)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	_, _ = conn.Exec(ctx, `RESET lock_timeout`)
	require.NoError(t, err, "a claim during a writer's open transaction that inserted a row and set its topic (waited %v)", time.Since(start))
}
