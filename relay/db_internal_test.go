package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// Relays of several schemas on one connection each run their own prepared
// statement, on a generic plan: PostgreSQL plans a statement again when it
// runs under another search_path than last time, so one statement shared
// by the schemas was planned at nearly every call. Past preparedPerConn
// the connection drops them all and prepares again what runs next, each
// statement still reading its own schema's table.
func TestDBPreparesPerSchema(t *testing.T) { // not parallel: it lowers preparedPerConn
	ctx := context.Background()
	pool := poolOf(t, 1)

	const countSQL = `SELECT count(*) FROM pgbox_outbox WHERE id > $1`
	var dbs []*db
	for i, rows := range []int{3, 5} {
		d := testdb.New(t)
		_, err := d.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value) SELECT 't', NULL, '\x00' FROM generate_series(1, $1) g`, rows)
		require.NoError(t, err, "schema %d", i)
		dbs = append(dbs, newDB(pool, d.Schema))
	}
	ask := func(round int) {
		t.Helper()
		for i, want := range []int64{3, 5} {
			var n int64
			require.NoError(t, dbs[i].queryRow(ctx, countSQL, []any{0}, &n), "round %d, schema %d", round, i)
			require.Equal(t, want, n, "round %d: schema %d's statement read its own table", round, i)
		}
	}
	for round := range 6 {
		ask(round)
	}
	type stmt struct {
		name            string
		generic, custom int64
	}
	statements := func() []stmt {
		t.Helper()
		var out []stmt
		require.NoError(t, pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
			rows, err := c.Query(ctx, `SELECT name, generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1 ORDER BY name`, countSQL)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var s stmt
				if err := rows.Scan(&s.name, &s.generic, &s.custom); err != nil {
					return err
				}
				out = append(out, s)
			}
			return rows.Err()
		}))
		return out
	}
	got := statements()
	require.Len(t, got, 2, "one prepared statement per schema on the connection: %+v", got)
	for _, s := range got {
		require.Equal(t, stmt{name: s.name, generic: 6}, s, "each schema's statement ran six times on its generic plan, never planned for its parameters")
	}

	old := preparedPerConn
	preparedPerConn = 3
	t.Cleanup(func() { preparedPerConn = old })
	other := []string{`SELECT count(*) FROM pgbox_outbox WHERE id > $1 AND slot >= 0`, `SELECT count(*) FROM pgbox_outbox WHERE id > $1 AND slot < 256`}
	for round := range 3 {
		for i, want := range []int64{3, 5} {
			for _, q := range other {
				var n int64
				require.NoError(t, dbs[i].queryRow(ctx, q, []any{0}, &n), "past the bound, round %d, schema %d", round, i)
				require.Equal(t, want, n, "past the bound, round %d: schema %d's statement read its own table", round, i)
			}
		}
		ask(round)
	}
	require.NoError(t, pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgbox\_%'`).Scan(&n); err != nil {
			return err
		}
		require.LessOrEqual(t, n, 3, "the connection keeps at most preparedPerConn of the relays' statements")
		require.Len(t, connSet[bool](&preparedOn, c.Conn()), n, "the relay's record of them matches the server's")
		return nil
	}))
}
