package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// 00170 under the roles docs/operations.md describes, none the owner: a
// relay's role with SELECT on the id sequence and SELECT, INSERT, UPDATE on
// the marker raises seq_hw (the marker's trigger copies it to
// pgbox_relay_seq_hw), and a writer's role with INSERT on the outbox alone
// has a sequence set back moved forward past it, at READ COMMITTED and
// REPEATABLE READ (a snapshot from before the raise).
func TestSequenceResetUnderGrantedRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	suffix := time.Now().UnixNano() % 1e9
	relayRole, writerRole := fmt.Sprintf("t_relay_%d", suffix), fmt.Sprintf("t_writer_%d", suffix)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	for _, q := range []string{
		`CREATE ROLE ` + relayRole, `CREATE ROLE ` + writerRole,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + relayRole + `, ` + writerRole,
		`GRANT SELECT ON SEQUENCE pgbox_outbox_id_seq TO ` + relayRole,
		`GRANT SELECT, INSERT, UPDATE ON pgbox_relay_marker TO ` + relayRole,
		`GRANT INSERT ON pgbox_outbox TO ` + writerRole,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		for _, r := range []string{relayRole, writerRole} {
			_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+r)
			_, _ = db.Pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+r)
		}
	})
	as := func(role string, iso pgx.TxIsoLevel, q string) pgx.Tx {
		t.Helper()
		tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		_, err = tx.Exec(ctx, `SET LOCAL ROLE `+role)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, q)
		require.NoError(t, err, q)
		return tx
	}
	insert := `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'v')`

	// A REPEATABLE READ writer takes its snapshot before the relay's raise.
	rr := as(writerRole, pgx.RepeatableRead, `SELECT 1`)
	relay := as(relayRole, pgx.ReadCommitted, `INSERT INTO pgbox_relay_marker (seq_hw) VALUES (0)`)
	_, err := relay.Exec(ctx, `UPDATE pgbox_relay_marker SET seq_hw = 500`)
	require.NoError(t, err)
	require.NoError(t, relay.Commit(ctx))
	_, err = db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)

	_, err = rr.Exec(ctx, insert)
	require.NoError(t, err)
	require.NoError(t, rr.Commit(ctx))
	rc := as(writerRole, pgx.ReadCommitted, insert)
	require.NoError(t, rc.Commit(ctx))
	var ids []int64
	rows, err := db.Pool.Query(ctx, `SELECT id FROM pgbox_outbox ORDER BY id`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{501, 502}, ids, "both writers' ids above the relay's seq_hw")
}
