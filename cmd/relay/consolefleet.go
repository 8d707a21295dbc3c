package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/relay"
)

// The console of `relay run` with a target list: console.NewFleet over the
// process's targets. A target's pages read its tables through the pool of
// its database the relay already has (no pool, no connection of its own:
// the console stays within --db-conn-budget), every statement in a
// transaction that sets the target's schema as its search_path first
// (set_config(..., true): it ends with the transaction), and at most
// consoleConns of that pool's connections at once, so the console can
// never take the relay's. The fleet overview's figures are `relay status`'s
// (readTarget), read in the background, --targets-concurrency targets at
// a time.

// consoleConnsMax is the most connections of a database's pool the console
// uses at once: a quarter of the pool, at least 1, at most this.
const consoleConnsMax = 2

func consoleConns(poolConns int32) int {
	return min(consoleConnsMax, max(1, int(poolConns)/4))
}

// serveFleetConsole serves the fleet console on --console-addr until ctx
// ends; it returns once the listener is bound. The returned close stops
// the figures' reading under way.
func (fr *fleetRun) serveFleetConsole(ctx context.Context, lk *lazyKafka) (<-chan error, func(), error) {
	a := fr.a
	o := a.opts.Console
	auth, err := o.auth()
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	cc := a.cleanupConfig(nil, lk, false).CutoffsConfig()
	cf := &consoleFleet{fr: fr, log: a.log.With("component", "console"), dbs: map[string]*targetDB{},
		slots: map[*pgxpool.Pool]chan struct{}{}, redact: map[string]string{}}
	h, err := console.NewFleet(console.FleetConfig{
		Console: console.Config{Auth: auth, HidePayloads: o.HidePayloads, Logger: a.log.With("component", "console"),
			Inspect: inspect.Config{Lanes: a.opts.Relay.Lanes, Cutoffs: &cc}},
		Fleet:              cf,
		SummaryConcurrency: a.opts.Targets.EachConcurrency,
	})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		h.Close()
		return nil, nil, usageError("PGBOX_CONSOLE_ADDR (--console-addr) %q: %v", o.Addr, err)
	}
	ch := serve(ctx, ln, a.opts.HTTPConnsPerClient, h)
	a.log.Info("console listening", "addr", ln.Addr().String(), "users", len(auth.Users), "token", auth.Tokens != nil,
		"proxy_header", auth.ProxyHeader, "hide_payloads", o.HidePayloads, "targets", true)
	return ch, h.Close, nil
}

// consoleFleet is console.Fleet over a fleetRun: its list, the Fleet's
// states, the databases' pools.
type consoleFleet struct {
	fr  *fleetRun
	log *logger

	mu     sync.Mutex
	dbs    map[string]*targetDB            // by target name
	slots  map[*pgxpool.Pool]chan struct{} // the console's connections per pool
	redact map[string]string               // database URL -> without its password
}

// Targets lists the targets of the list: the Fleet's state of those it
// serves, "refused" with the reason for the others, "starting" for those
// the binary has not checked yet.
func (cf *consoleFleet) Targets() []console.FleetTarget {
	states := map[string]relay.TargetState{}
	for _, s := range cf.fr.f.Targets() {
		states[s.Name] = s
	}
	fr := cf.fr
	fr.mu.Lock()
	list := fr.list
	refused := make(map[string]string, len(fr.refused))
	for name, r := range fr.refused {
		refused[name] = r.err
	}
	fr.mu.Unlock()
	out := make([]console.FleetTarget, 0, len(list))
	for _, t := range list {
		ft := console.FleetTarget{Name: t.Name, Schema: t.Schema, Database: cf.redacted(t.DatabaseURL), State: "starting"}
		if s, ok := states[t.Name]; ok {
			ft.State, ft.Dormant, ft.Lanes, ft.Published = s.State, s.Dormant, s.Stats.Lanes, s.Stats.Published
			if s.Err != nil {
				ft.Err = s.Err.Error()
			}
		} else if err, ok := refused[t.Name]; ok {
			ft.State, ft.Err = targetStateRefused, err
		}
		out = append(out, ft)
	}
	return out
}

// redacted is url without its password, parsed once per database.
func (cf *consoleFleet) redacted(url string) string {
	cf.mu.Lock()
	defer cf.mu.Unlock()
	r, ok := cf.redact[url]
	if !ok {
		r = dbconf.RedactDSN(url)
		cf.redact[url] = r
	}
	return r
}

// spec returns the listed target name and its database's pool (nil when
// the connection budget left it none).
func (cf *consoleFleet) spec(name string) (targetSpec, *pgxpool.Pool, error) {
	fr := cf.fr
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for _, t := range fr.list {
		if t.Name == name {
			if db, ok := fr.dbs[t.DatabaseURL]; ok {
				return t, db.pool, nil
			}
			return t, nil, nil
		}
	}
	return targetSpec{}, nil, fmt.Errorf("target %q: %w", name, console.ErrUnknownTarget)
}

// DB returns the target's schema over its database's pool: the same value
// while its schema and pool are unchanged.
func (cf *consoleFleet) DB(name string) (console.DB, error) {
	db, _, err := cf.db(name)
	return db, err
}

func (cf *consoleFleet) db(name string) (*targetDB, targetSpec, error) {
	t, pool, err := cf.spec(name)
	if err != nil {
		return nil, t, err
	}
	if pool == nil {
		return nil, t, fmt.Errorf("target %q: its database %s has no connection pool in this process (see the target's refusal: no room in PGBOX_DB_CONN_BUDGET (--db-conn-budget), or its URL is invalid)",
			name, dbconf.RedactDSN(t.DatabaseURL))
	}
	cf.mu.Lock()
	defer cf.mu.Unlock()
	if db, ok := cf.dbs[name]; ok && db.pool == pool && db.schema == t.Schema {
		return db, t, nil
	}
	slots, ok := cf.slots[pool]
	if !ok {
		cf.forgetClosedPools()
		slots = make(chan struct{}, consoleConns(pool.Config().MaxConns))
		cf.slots[pool] = slots
	}
	db := &targetDB{pool: pool, schema: t.Schema, path: pgx.Identifier{t.Schema}.Sanitize(), slots: slots}
	cf.dbs[name] = db
	return db, t, nil
}

// forgetClosedPools drops what the console keeps of pools the fleetRun
// has closed (their databases are no longer listed), when a new pool
// appears: a pool is opened once per database, so this runs rarely.
func (cf *consoleFleet) forgetClosedPools() {
	live := map[*pgxpool.Pool]bool{}
	cf.fr.mu.Lock()
	for _, db := range cf.fr.dbs {
		live[db.pool] = true
	}
	cf.fr.mu.Unlock()
	for p := range cf.slots {
		if !live[p] {
			delete(cf.slots, p)
		}
	}
	for name, db := range cf.dbs {
		if !live[db.pool] {
			delete(cf.dbs, name)
		}
	}
}

// Summarize reads the target's `relay status` line.
func (cf *consoleFleet) Summarize(ctx context.Context, name string) console.FleetSummary {
	db, t, err := cf.db(name)
	if err != nil {
		if errors.Is(err, console.ErrUnknownTarget) {
			return console.FleetSummary{State: console.SummaryFailed, Detail: "no longer listed"}
		}
		return console.FleetSummary{State: console.SummaryUnreachable, Detail: err.Error()}
	}
	state, detail, snap := readTarget(ctx, db, t, inspect.Config{Lanes: relay.LanesDefault, Logger: cf.log})
	s := console.FleetSummary{State: state, Detail: detail}
	if snap != nil {
		s.Figures = figuresOf(snap).console()
	}
	return s
}

// targetDB is one target's tables over its database's shared pool: a
// console.DB. Every statement runs in a transaction that first sets the
// target's schema as the search_path for that transaction only, so no
// statement can reach another target's tables whatever its connection ran
// before, and the pool's connections keep their own search_path for the
// relay. Statements are described afresh in that transaction
// (QueryExecModeDescribeExec) rather than prepared once per connection:
// a statement prepared under one target's schema is never run against
// another's tables of another shape. slots caps the pool's connections
// the console holds at once.
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
	err := d.inTx(ctx, func(tx pgx.Tx) (err error) {
		tag, err = tx.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// QueryRow runs sql in a transaction of its own on the target's schema
// when the row is scanned.
func (d *targetDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return lazyRow(func(dest ...any) error {
		return d.inTx(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sql, args...).Scan(dest...) })
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

func (d *targetDB) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := d.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
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
