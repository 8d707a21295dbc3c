package relay

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// db is how the relay reaches its tables.
//
// Without Config.Schema it is the pool itself: the pool's search_path finds
// the tables, and a statement costs what it always did.
//
// With Config.Schema, every statement is sent together with
// set_config('search_path', schema, true), in one round trip (a pipeline)
// and one implicit transaction: the setting lasts exactly as long as the
// statement, whatever connection of the pool it got and whatever that
// connection ran before. So relays of many schemas share one pool, and no
// statement of one can reach another's tables: a connection never carries
// a schema over, and a statement never runs without its own. A
// transaction (begin) sets it LOCAL first. A schema that does not exist
// leaves nothing on the path, so the tables are reported missing (the
// operator's fix is named), never found elsewhere.
type db struct {
	pool *pgxpool.Pool
	path string // the search_path value (the quoted schema); "" uses the pool's
}

const setPathSQL = `SELECT set_config('search_path', $1, true)`

func newDB(pool *pgxpool.Pool, schema string) *db {
	d := &db{pool: pool}
	if schema != "" {
		d.path = pgx.Identifier{schema}.Sanitize()
	}
	return d
}

// exec runs sql.
func (d *db) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.path == "" {
		return d.pool.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	b := d.batch()
	b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	return tag, d.pool.SendBatch(ctx, b).Close()
}

// queryRow runs sql and scans its one row into dest.
func (d *db) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	if d.path == "" {
		return d.pool.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	b := d.batch()
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
	return d.pool.SendBatch(ctx, b).Close()
}

// query runs sql and hands its rows to read, which must not keep them.
func (d *db) query(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	if d.path == "" {
		rows, err := d.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := read(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	b := d.batch()
	b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		if err := read(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	})
	return d.pool.SendBatch(ctx, b).Close()
}

// begin runs fn in a transaction, committed when fn returns nil.
func (d *db) begin(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if d.path != "" {
			if _, err := tx.Exec(ctx, setPathSQL, d.path); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// listenConfig is the connection config a LISTEN connection copies.
func (d *db) listenConfig() *pgx.ConnConfig { return d.pool.Config().ConnConfig.Copy() }

func (d *db) batch() *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(setPathSQL, d.path)
	return b
}
