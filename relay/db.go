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
// connection ran before. So relays of many schemas share one pool, no
// statement of one can reach another's tables (a connection never carries
// a schema over, a statement never runs without its own), and the pool's
// connections keep their own search_path for whatever else uses the pool.
// A transaction (begin) sets it LOCAL first. A schema that does not exist
// leaves nothing on the path, so the tables are reported missing (the
// operator's fix is named), never found elsewhere.
//
// A prepared statement is parsed before the pipeline runs, so with the
// connection's own search_path: prepare parses it, once per connection,
// inside a transaction that sets the schema when the connection's path
// does not find the tables. PostgreSQL analyzes a prepared statement again
// whenever it runs under another search_path than last time, so the
// statement always reads the tables of the schema set beside it.
type db struct {
	pool    *pgxpool.Pool
	path    string // the search_path value (the quoted schema); "" uses the pool's
	prepare bool   // the pool's exec mode prepares statements (or describes them) before it runs them
}

const setPathSQL = `SELECT set_config('search_path', $1, true)`

func newDB(pool *pgxpool.Pool, schema string) *db {
	d := &db{pool: pool}
	if schema != "" {
		d.path = pgx.Identifier{schema}.Sanitize()
		switch pool.Config().ConnConfig.DefaultQueryExecMode {
		case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol: // parsed in the pipeline, after set_config
		default:
			d.prepare = true
		}
	}
	return d
}

// exec runs sql.
func (d *db) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.path == "" {
		return d.pool.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	err := d.send(ctx, sql, func(b *pgx.Batch) {
		b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	})
	return tag, err
}

// queryRow runs sql and scans its one row into dest.
func (d *db) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	if d.path == "" {
		return d.pool.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	return d.send(ctx, sql, func(b *pgx.Batch) {
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
	})
}

// query runs sql and hands its rows to read, which must not keep them.
func (d *db) query(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	readAll := func(rows pgx.Rows) error {
		if err := read(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	if d.path == "" {
		rows, err := d.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		return readAll(rows)
	}
	return d.send(ctx, sql, func(b *pgx.Batch) { b.Queue(sql, args...).Query(readAll) })
}

// send runs set_config and the statement queue adds, in one pipeline, on
// a connection where sql is prepared.
func (d *db) send(ctx context.Context, sql string, queue func(*pgx.Batch)) error {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	if d.prepare {
		if err := d.prepared(ctx, c.Conn(), sql); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	b.Queue(setPathSQL, d.path)
	queue(b)
	return c.SendBatch(ctx, b).Close()
}

// prepared prepares sql on c (named by its text, so the pipeline runs it),
// unless it is already: then it costs nothing. A connection whose own
// search_path does not find the tables fails to parse it; it is parsed
// again in a transaction that sets the schema.
func (d *db) prepared(ctx context.Context, c *pgx.Conn, sql string) error {
	if _, err := c.Prepare(ctx, sql, sql); err == nil {
		return nil
	}
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setPathSQL, d.path); err != nil {
			return err
		}
		_, err := tx.Conn().Prepare(ctx, sql, sql)
		return err
	})
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
