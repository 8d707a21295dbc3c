// Package outboxstats reads which schemas' outboxes hold rows from
// PostgreSQL's statistics (pg_stat_user_tables), reading no table: cheap
// for a thousand schemas, a second or so behind, and only ever a hint
// (which target to check and start first, which to start awake).
package outboxstats

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// rowsSQL is the outbox rows of each schema of the database, by the
// statistics.
const rowsSQL = `SELECT schemaname::text, n_live_tup FROM pg_stat_user_tables WHERE relname = 'pgbox_outbox' AND n_live_tup > 0`

// Rows returns the schemas of pool's database whose outbox holds rows by
// the statistics, with their number.
func Rows(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, rowsSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var schema string
		var n int64
		if err := rows.Scan(&schema, &n); err != nil {
			return nil, err
		}
		out[schema] = n
	}
	return out, rows.Err()
}
