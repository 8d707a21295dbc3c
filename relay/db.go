package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// per connection and schema, inside a transaction that sets the schema
// first, and the pipeline runs that prepared statement. Each schema has
// its own prepared statement (preparedName): PostgreSQL analyzes and plans
// a prepared statement again whenever it runs under another search_path
// than last time, so one statement shared by the schemas a connection
// serves was planned again at nearly every call once a hundred busy
// targets shared a pool (the heartbeat 1.1 ms, the delete 0.6 ms of
// planning a call: about 0.4 of a core, make tenants at 101 schemas). A
// connection keeps at most preparedPerConn of them; past that it drops
// them all and prepares again what runs next. The functions the
// statements call (pgbox_outbox_claim2...) are each schema's own, and
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
	names   sync.Map      // sql -> its prepared name (preparedName)
	homes   *homes        // a Fleet's target: its pool's homes (homes.go); nil: none
	home    int           // which of them is its
}

// setPathSQL sets the schema for the statement beside it, and generic
// plans: each (connection, schema, statement) is planned once, where
// PostgreSQL's default plans a statement five times for its parameters
// first (and a plpgsql function's statements too, so the claim's): with a
// hundred schemas over a pool's ten connections, the first minute of a
// Fleet's busy targets went mostly to planning. The relay's statements
// (the claim's inside its function too: TestClaimPlanCannotFlip) take the same
// plan whatever their parameters.
const setPathSQL = `SELECT set_config('search_path', $1, true), set_config('plan_cache_mode', 'force_generic_plan', true)`

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
	c, err := d.acquire(ctx)
	if err != nil {
		return err
	}
	defer d.release(c)
	conn := c.Conn()
	name := sql
	if d.prepare {
		name = d.preparedName(sql)
		if err := d.prepared(ctx, conn, name, sql); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	b.Queue(setPathSQL, d.path)
	queue(b, name)
	err = c.SendBatch(ctx, b).Close()
	switch code := pgerr.Code(err); {
	case !d.prepare:
	case code == pgerr.CodeInvalidSQLStatementName:
		// The statement is gone, and with it, most likely, every other
		// statement of the connection (DISCARD ALL, DEALLOCATE ALL, as a
		// pooler or an operator runs them): each schema's would fail once
		// in turn. Forget them all and prepare afresh what runs next.
		_ = forgetPrepared(ctx, conn)
	case code == pgerr.CodeFeatureNotSupported:
		// Its result changed shape (a migration): prepare it afresh.
		forget(conn, name)
		_ = conn.Deallocate(ctx, name)
	}
	return err
}

// preparedName is the name sql is prepared under for d's schema: short
// (PostgreSQL keeps 63 bytes of a name) and the same on every connection.
func (d *db) preparedName(sql string) string {
	if v, ok := d.names.Load(sql); ok {
		return v.(string)
	}
	h := sha256.Sum256([]byte(d.path + "\x00" + sql))
	name := "pgbox_" + hex.EncodeToString(h[:12])
	d.names.Store(sql, name)
	return name
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

// preparedPerConn bounds the statements the relays prepare on one
// connection: about 10 a schema, so a connection keeps those of the 200
// or so schemas it served last. A prepared statement holds its plan in
// the backend's memory. A variable for the tests.
var preparedPerConn = 2048

// prepared prepares sql as name on c in a transaction that sets the
// schema first, unless it is already.
func (d *db) prepared(ctx context.Context, c *pgx.Conn, name, sql string) error {
	done := connSet[bool](&preparedOn, c)
	if done[name] {
		return nil
	}
	if len(done) >= preparedPerConn {
		// Drop them all rather than track which was used last; those
		// still in use are prepared again.
		if err := forgetPrepared(ctx, c); err != nil {
			return err
		}
	}
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setPathSQL, d.path); err != nil {
			return err
		}
		_, err := tx.Conn().Prepare(ctx, name, sql)
		return err
	})
	if err == nil {
		done[name] = true
	}
	return err
}

// forgetPrepared drops every statement prepared on c, pgx's own and the
// Fleet's idle and watch questions too (DeallocateAll), and forgets them.
func forgetPrepared(ctx context.Context, c *pgx.Conn) error {
	if v, ok := preparedOn.Load(c); ok {
		clear(v.(map[string]bool))
	}
	idlePreparedOn.Delete(c.PgConn())
	return c.DeallocateAll(ctx)
}

func forget(c *pgx.Conn, name string) {
	if v, ok := preparedOn.Load(c); ok {
		delete(v.(map[string]bool), name)
	}
}

// preparedMax bounds the connections preparedOn remembers: pools replace
// their connections (MaxConnLifetime), and a closed connection's set is
// dropped only here. Past it every set is dropped; the next statement on
// each connection is prepared again (pgx has it prepared already, so that
// costs the transaction's round trips, once).
const preparedMax = 4096

// connSet is conn's set in m (preparedOn, idlePreparedOn, isolationOn), made if need
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
	isolationOn.Clear()
}

// begin runs fn in a transaction, committed when fn returns nil.
func (d *db) begin(ctx context.Context, fn func(pgx.Tx) error) error {
	release, err := d.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	c, err := d.acquire(ctx)
	if err != nil {
		return err
	}
	defer d.release(c)
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
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
