package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/dbconf"
)

// One target's tables over its database's shared pool, for everything
// `relay run` with a target list reads besides relaying: the figures'
// reader (fleetReader: /metrics and the console's fleet overview) and the
// console's target pages. No pool and no connection of their own: they
// stay within --db-conn-budget, and at most readerConns of a pool's
// connections at once, so they never take the relay's.

// readerConnsMax is the most connections of a database's pool the reader
// and the console use at once: a quarter of the pool, at least 1, at most
// this.
const readerConnsMax = 2

func readerConns(poolConns int32) int {
	return min(readerConnsMax, max(1, int(poolConns)/4))
}

// targetDBs hands out each listed target's targetDB, sharing one set of
// slots per pool between the reader and the console.
type targetDBs struct {
	fr *fleetRun

	mu    sync.Mutex
	dbs   map[string]*targetDB            // by target name
	slots map[*pgxpool.Pool]chan struct{} // the connections in use per pool
}

func newTargetDBs(fr *fleetRun) *targetDBs {
	return &targetDBs{fr: fr, dbs: map[string]*targetDB{}, slots: map[*pgxpool.Pool]chan struct{}{}}
}

// targetPool is a target and its database's pool (nil when the
// connection budget left it none).
type targetPool struct {
	spec targetSpec
	pool *pgxpool.Pool
}

// listedPools returns the targets of the list, in its order, with their
// pools.
func (fr *fleetRun) listedPools() []targetPool {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return fr.withPools(fr.list, true)
}

// withPools pairs specs with their databases' pools, keeping those whose
// database the process has not opened when all is set. The caller holds
// fr.mu.
func (fr *fleetRun) withPools(specs []targetSpec, all bool) []targetPool {
	out := make([]targetPool, 0, len(specs))
	for _, t := range specs {
		db, ok := fr.dbs[t.DatabaseURL]
		switch {
		case ok:
			out = append(out, targetPool{spec: t, pool: db.pool})
		case all:
			out = append(out, targetPool{spec: t})
		}
	}
	return out
}

// get returns the target's schema over pool: the same value while its
// schema and pool are unchanged.
func (d *targetDBs) get(t targetSpec, pool *pgxpool.Pool) (*targetDB, error) {
	if pool == nil {
		return nil, fmt.Errorf("target %q: its database %s has no connection pool in this process (see the target's refusal: no room in PGBOX_DB_CONN_BUDGET (--db-conn-budget), or its URL is invalid)",
			t.Name, dbconf.RedactDSN(t.DatabaseURL))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if db, ok := d.dbs[t.Name]; ok && db.pool == pool && db.schema == t.Schema {
		return db, nil
	}
	slots, ok := d.slots[pool]
	if !ok {
		d.forgetClosedPools()
		slots = make(chan struct{}, readerConns(pool.Config().MaxConns))
		d.slots[pool] = slots
	}
	db := &targetDB{pool: pool, schema: t.Schema, path: pgx.Identifier{t.Schema}.Sanitize(), slots: slots}
	d.dbs[t.Name] = db
	return db, nil
}

// forgetClosedPools drops what is kept of pools the fleetRun has closed
// (their databases are no longer listed), and of targets no longer
// listed, when a new pool appears: a pool is opened once per database, so
// this runs rarely.
func (d *targetDBs) forgetClosedPools() {
	live, listed := map[*pgxpool.Pool]bool{}, map[string]bool{}
	d.fr.mu.Lock()
	for _, db := range d.fr.dbs {
		live[db.pool] = true
	}
	for _, t := range d.fr.list {
		listed[t.Name] = true
	}
	d.fr.mu.Unlock()
	for p := range d.slots {
		if !live[p] {
			delete(d.slots, p)
		}
	}
	for name, db := range d.dbs {
		if !live[db.pool] || !listed[name] {
			delete(d.dbs, name)
		}
	}
}

// targetDB is one target's tables over its database's shared pool: a
// console.DB. Every statement runs in a transaction that first sets the
// target's schema as the search_path for that transaction only, so no
// statement can reach another target's tables whatever its connection ran
// before, and the pool's connections keep their own search_path for the
// relay; a schema's name is quoted, whatever its case or characters.
// Statements are described afresh in that transaction
// (QueryExecModeDescribeExec) rather than prepared once per connection:
// a statement prepared under one target's schema is never run against
// another's tables of another shape. slots caps the pool's connections
// the reader and the console hold at once.
type targetDB struct {
	pool   *pgxpool.Pool
	schema string
	path   string // the quoted schema
	slots  chan struct{}
}

// Begin starts a transaction on the target's schema; its end (Commit or
// Rollback) gives its connection back.
func (d *targetDB) Begin(ctx context.Context) (pgx.Tx, error) {
	select {
	case d.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	release := sync.OnceFunc(func() { <-d.slots })
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		release()
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.QueryExecModeDescribeExec, d.path); err != nil {
		_ = tx.Rollback(ctx)
		release()
		return nil, err
	}
	return &targetTx{Tx: tx, release: release}, nil
}

// Exec runs sql in a transaction of its own on the target's schema.
func (d *targetDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := pgx.BeginFunc(ctx, d, func(tx pgx.Tx) (err error) {
		tag, err = tx.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// QueryRow runs sql in a transaction of its own on the target's schema
// when the row is scanned.
func (d *targetDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return lazyRow(func(dest ...any) error {
		return pgx.BeginFunc(ctx, d, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sql, args...).Scan(dest...) })
	})
}

// Query runs sql in a transaction of its own on the target's schema,
// committed when the rows are closed or read to their end.
func (d *targetDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := d.Begin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return &targetRows{Rows: rows, end: sync.OnceFunc(func() {
		rows.Close()
		if rows.Err() != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return
		}
		_ = tx.Commit(context.WithoutCancel(ctx))
	})}, nil
}

// targetTx is a transaction on a target's schema: its statements are
// described in it (see targetDB).
type targetTx struct {
	pgx.Tx
	release func()
}

func (t *targetTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, sql, describe(args)...)
}

func (t *targetTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, sql, describe(args)...)
}

func (t *targetTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.Tx.QueryRow(ctx, sql, describe(args)...)
}

func (t *targetTx) Commit(ctx context.Context) error {
	defer t.release()
	return t.Tx.Commit(ctx)
}

func (t *targetTx) Rollback(ctx context.Context) error {
	defer t.release()
	return t.Tx.Rollback(ctx)
}

// describe puts QueryExecModeDescribeExec before args, unless they name a
// mode already.
func describe(args []any) []any {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			return args
		}
	}
	return append([]any{pgx.QueryExecModeDescribeExec}, args...)
}

// targetRows ends its transaction when closed or read to the end.
type targetRows struct {
	pgx.Rows
	end func()
}

func (r *targetRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.end()
	return false
}

func (r *targetRows) Close() { r.end() }

type lazyRow func(dest ...any) error

func (f lazyRow) Scan(dest ...any) error { return f(dest...) }
