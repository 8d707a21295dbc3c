package relay

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/pgerr"
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
// pgx prepares (or describes) a statement before the pipeline that runs
// it, so with the connection's own search_path, which may hold no pgbox
// tables or older ones. So the relay prepares each statement itself, once
// per connection, inside a transaction that sets the schema first, and the
// pipeline runs that prepared statement. PostgreSQL analyzes a prepared
// statement again whenever it runs under another search_path than last
// time, so it always reads the tables of the schema set beside it. The
// statements are the same text for every schema, so a connection holds one
// prepared statement each, whatever number of schemas it serves (a
// statement per schema was tried: no faster, and a backend serving a
// thousand schemas held a thousand times the prepared statements); the
// functions they call (pgbox_outbox_claim2...) are each schema's own, and
// PostgreSQL keeps their plans apart.
//
// slots, when a Fleet sets it, caps the pool's connections one target
// holds at once, so a target whose statements hang (a held lock, a slow
// disk) leaves the others connections to run on.
type db struct {
	pool    *pgxpool.Pool
	path    string        // the search_path value (the quoted schema); "" uses the pool's
	prepare bool          // the pool's exec mode prepares statements (or describes them) before it runs them
	slots   chan struct{} // nil: no cap
}

const setPathSQL = `SELECT set_config('search_path', $1, true)`

func newDB(pool *pgxpool.Pool, schema string) *db {
	d := &db{pool: pool}
	if schema != "" {
		d.path = pgx.Identifier{schema}.Sanitize()
		d.prepare = keepsPrepared(pool) // else parsed in the pipeline, after set_config
	}
	return d
}

// keepsPrepared reports whether pool's exec mode prepares statements: not
// exec or simple_protocol, the modes for a pooler in transaction mode
// (PgBouncer), which may run the next statement on another server
// connection (docs/operations.md).
func keepsPrepared(pool *pgxpool.Pool) bool {
	switch pool.Config().ConnConfig.DefaultQueryExecMode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return false
	}
	return true
}

// exec runs sql.
func (d *db) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.path == "" {
		return d.pool.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	err := d.send(ctx, sql, func(b *pgx.Batch, sql string) {
		b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	})
	return tag, err
}

// queryRow runs sql and scans its one row into dest.
func (d *db) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	if d.path == "" {
		return d.pool.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	return d.send(ctx, sql, func(b *pgx.Batch, sql string) {
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
	return d.send(ctx, sql, func(b *pgx.Batch, sql string) { b.Queue(sql, args...).Query(readAll) })
}

// send runs set_config and the statement queue adds, in one pipeline, on
// a connection where sql is prepared.
func (d *db) send(ctx context.Context, sql string, queue func(b *pgx.Batch, sql string)) error {
	release, err := d.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	if d.prepare {
		if err := d.prepared(ctx, conn, sql); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	b.Queue(setPathSQL, d.path)
	queue(b, sql)
	err = c.SendBatch(ctx, b).Close()
	if code := pgerr.Code(err); d.prepare && (code == pgerr.CodeInvalidSQLStatementName || code == pgerr.CodeFeatureNotSupported) {
		// The statement is gone (a pooler's DISCARD ALL) or its result
		// changed shape (a migration): prepare it afresh next time.
		forget(conn, sql)
		_ = conn.Deallocate(ctx, sql)
	}
	return err
}

// slot takes one of the target's connection slots, if it has a cap.
func (d *db) slot(ctx context.Context) (release func(), err error) {
	if d.slots == nil {
		return func() {}, nil
	}
	select {
	case d.slots <- struct{}{}:
		return func() { <-d.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// preparedOn holds, per connection, the statements prepared on it with a
// schema on the path (only the goroutine holding the connection touches
// its set). Closed connections' sets are dropped now and then (forgetAll).
var (
	preparedOn  sync.Map // *pgx.Conn -> map[string]bool
	preparedNew atomic.Int64
)

// prepared prepares sql on c (named by its text, so the pipeline runs it)
// in a transaction that sets the schema first, unless it is already.
func (d *db) prepared(ctx context.Context, c *pgx.Conn, sql string) error {
	done := connSet[bool](&preparedOn, c)
	if done[sql] {
		return nil
	}
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setPathSQL, d.path); err != nil {
			return err
		}
		_, err := tx.Conn().Prepare(ctx, sql, sql)
		return err
	})
	if err == nil {
		done[sql] = true
	}
	return err
}

func forget(c *pgx.Conn, sql string) {
	if v, ok := preparedOn.Load(c); ok {
		delete(v.(map[string]bool), sql)
	}
}

// preparedMax bounds the connections preparedOn remembers: pools replace
// their connections (MaxConnLifetime), and a closed connection's set is
// dropped only here. Past it every set is dropped; the next statement on
// each connection is prepared again (pgx has it prepared already, so that
// costs the transaction's round trips, once).
const preparedMax = 4096

// connSet is conn's set in m (preparedOn, idlePreparedOn), made if need
// be; only the goroutine holding the connection touches it.
func connSet[V any](m *sync.Map, conn any) map[string]V {
	v, ok := m.Load(conn)
	if !ok {
		if preparedNew.Add(1) > preparedMax {
			forgetAll()
		}
		v, _ = m.LoadOrStore(conn, map[string]V{})
	}
	return v.(map[string]V)
}

func forgetAll() {
	preparedNew.Store(0)
	preparedOn.Clear()
	idlePreparedOn.Clear()
}

// begin runs fn in a transaction, committed when fn returns nil.
func (d *db) begin(ctx context.Context, fn func(pgx.Tx) error) error {
	release, err := d.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
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
