package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/internal/outboxstats"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

// `relay run` with a target list (--targets, --targets-query): one
// relay.Fleet serves every target in this process. One pool per database,
// the pools sized within --db-conn-budget; each target checked
// (checkTarget) before the Fleet gets it; the list re-read every
// --targets-refresh and the Fleet's targets set to it, the pools resized
// as databases come and go (resizePools).

// dbConnBudgetDefault is --db-conn-budget.
const dbConnBudgetDefault = 20

// minPoolConns is the smallest pool a database of the list gets.
const minPoolConns = 2

// targetStateRefused is the state of a target the binary did not give to
// the Fleet: its check refused it, or the connection budget had no room
// for its database. Next to the Fleet's states in /readyz and the
// pgbox_relay_targets gauge.
const targetStateRefused = "refused"

// targetStates are every state pgbox_relay_targets reports, 0 included.
var targetStates = []string{"starting", "running", "needs operator", "stopped", targetStateRefused}

// connBudget splits --db-conn-budget over the databases of the list: each
// database's pool (at most --db-max-conns, at least minPoolConns) and its
// LISTEN connection, plus the connections the process opens besides:
// one to check targets (checks run one at a time), with --targets-query
// one to the control database, and with --cleanup-interval one cleanup
// pass's pool (cleanupTargetConns; more passes at once borrow what is
// free). The split follows the databases listed while the relay runs
// (resizePools): the pools are replaced by pools of the new share.
type connBudget struct {
	total   int
	fixed   int // the check connection, the control connection, a cleanup pass
	cleanup int // of fixed, the cleanup pass's
	listen  int // per database: 1, or 0 with --no-listen
	perDB   int // --db-max-conns

	mu   sync.Mutex // reconcile takes and gives, the cleanup borrows
	used int        // fixed plus every open pool's MaxConns and LISTEN, plus what is borrowed
}

func newConnBudget(o *options) *connBudget {
	b := &connBudget{total: o.Targets.ConnBudget, fixed: 1, listen: 1, perDB: o.DBMaxConns}
	if o.Targets.Query != "" {
		b.fixed++
	}
	if o.CleanupInterval > 0 {
		b.cleanup = cleanupTargetConns
		b.fixed += b.cleanup
	}
	if o.Relay.NoListen {
		b.listen = 0
	}
	b.used = b.fixed
	return b
}

// what says what the budget counts, for its errors.
func (b *connBudget) what() string {
	s := fmt.Sprintf("%d per database (a pool of at least %d", minPoolConns+b.listen, minPoolConns)
	if b.listen > 0 {
		s += " and its LISTEN connection"
	}
	s += ") plus 1 to check targets"
	if b.fixed-b.cleanup > 1 {
		s += " and 1 to the --targets-query control database"
	}
	if b.cleanup > 0 {
		s += fmt.Sprintf(" and %d for a cleanup pass (--cleanup-interval)", b.cleanup)
	}
	return s
}

// split sizes the pools of the first list's dbs databases (at most
// --db-max-conns each, the budget shared evenly), or refuses a budget too
// small for them with an error naming the setting and the number needed.
func (b *connBudget) split(dbs int) (int, error) {
	if dbs == 0 {
		return 0, nil
	}
	need := b.fixed + dbs*(minPoolConns+b.listen)
	if b.total < need {
		return 0, usageError("PGBOX_DB_CONN_BUDGET (--db-conn-budget) %d is too small for the %d databases of the target list: it needs at least %d, %s",
			b.total, dbs, need, b.what())
	}
	return b.share(dbs), nil
}

// share is the pool each of dbs databases gets from an even split: at most
// --db-max-conns, at least minPoolConns (take refuses the databases for
// which even that is not left).
func (b *connBudget) share(dbs int) int {
	if dbs == 0 {
		return b.perDB
	}
	return max(minPoolConns, min(b.perDB, (b.total-b.fixed)/dbs-b.listen))
}

// free is the budget's room not handed out.
func (b *connBudget) free() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total - b.used
}

// grow reserves the room for a pool of from connections to be replaced by
// one of to, or of as many as the free room allows; it returns the new
// pool's size (from: no room). The reservation is taken before the old
// pool closes.
func (b *connBudget) grow(from, to int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := max(from, min(to, from+b.total-b.used))
	b.used += n - from
	return n
}

// shrunk gives back what a pool of from connections replaced by one of to
// frees, once the old pool's connections are closed.
func (b *connBudget) shrunk(from, to int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= from - to
}

// take reserves a pool for one more database: share conns (0: as many as
// --db-max-conns), or what is left when less. It fails,
// naming the setting and the number needed, when less than minPoolConns
// plus LISTEN is left.
func (b *connBudget) take(share int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	free := b.total - b.used - b.listen
	if free < minPoolConns {
		return 0, fmt.Errorf("no room left in PGBOX_DB_CONN_BUDGET (--db-conn-budget) %d for this database: %d of it are taken, a new database needs %d more (raise it to at least %d and restart the relay)",
			b.total, b.used, minPoolConns+b.listen, b.used+minPoolConns+b.listen)
	}
	n := min(cmp.Or(share, b.perDB), free, b.perDB)
	b.used += n + b.listen
	return n, nil
}

func (b *connBudget) give(conns int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= conns + b.listen
}

// borrow lends up to most units of size connections from the budget's
// free room, leaving room for a new database's smallest pool; it returns
// how many units it lent. giveBack returns them.
func (b *connBudget) borrow(size, most int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	free := b.total - b.used - (minPoolConns + b.listen)
	n := max(0, min(most, free/size))
	b.used += n * size
	return n
}

func (b *connBudget) giveBack(conns int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= conns
}

// planned is how many connections the budget has handed out.
func (b *connBudget) planned() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// fleetDB is one database of the list: the pool its targets share.
type fleetDB struct {
	url   string
	pool  *pgxpool.Pool
	conns int
	// open counts the connections dialled with the pool's settings and not
	// yet closed: the pool's, the Fleet's LISTEN, a check's (countConns).
	open *atomic.Int64
}

// countConns makes cfg's connections counted by the returned counter:
// every connection dialled with cfg, or with a copy of it, adds one until
// it is closed.
func countConns(cfg *pgxpool.Config) *atomic.Int64 {
	open := new(atomic.Int64)
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		return &countedConn{Conn: c, open: open}, nil
	}
	return open
}

// countedConn is a connection countConns counts.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// closedWaitMax bounds how long a pool being replaced waits for the
// connections dialled with its settings to close after the pool has: the
// Fleet closes a dropped pool's LISTEN connection on its own goroutine.
const closedWaitMax = 5 * time.Second

// waitClosed waits until every connection db.open counts is closed; false:
// some were still open after closedWaitMax, or ctx ended.
func (db *fleetDB) waitClosed(ctx context.Context) bool {
	deadline := time.Now().Add(closedWaitMax)
	for db.open.Load() > 0 {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// servedTarget is a target given to the Fleet.
type servedTarget struct {
	spec targetSpec
	// verified: checkTarget passed. A target whose database did not
	// answer the check is given to the Fleet too (it retries it) and
	// checked again at each refresh until a check gets an answer.
	verified bool
}

// refusal is a target not given to the Fleet and why; err is logged
// again only when it changes.
type refusal struct {
	spec targetSpec
	err  string
}

// fleetRun is `relay run`'s state with a target list. reconcile runs on
// one goroutine at a time and alone writes dbs, served and refused, under
// mu (which guards what /readyz and /metrics read).
type fleetRun struct {
	a *app
	f *relay.Fleet
	// checked is closed once the first round of checks has ended (nil:
	// no wait), so the figures' reader does not read targets whose
	// database's pool is not open yet as unreachable.
	checked chan struct{}
	budget  *connBudget
	// share is the pool size an even split of the budget gives each listed
	// database (resizePools); a database added gets as much, if left.
	share int
	// listedDBs are the databases of the list last reconciled, listed
	// unchanged since listedSince: pools below their share grow only once
	// that is growAfter ago.
	listedDBs   map[string]bool
	listedSince time.Time
	log         *slog.Logger

	dbs    map[string]*fleetDB // by database URL
	served map[string]servedTarget

	mu      sync.Mutex
	refused map[string]refusal
	listed  int
	list    []targetSpec // the list last read (the console's)
}

// cmdRunTargets is cmdRun with a target list.
func cmdRunTargets(ctx context.Context, a *app) error {
	o := a.opts
	kcfg, err := o.Kafka.Sarama()
	if err != nil {
		return err
	}
	lk := &lazyKafka{brokers: o.Kafka.Brokers, cfg: kcfg}
	defer lk.Close()
	rc, err := a.relayConfig(nil)
	if err != nil {
		return err
	}
	rc.Pool = nil
	f, err := relay.NewFleet(relay.FleetConfig{Relay: rc, DormantAfter: o.Targets.fleetDormantAfter(), WatchRate: o.Targets.WatchRate})
	if err != nil {
		return err
	}
	fr := &fleetRun{a: a, f: f, checked: make(chan struct{}), budget: newConnBudget(o), log: a.log.With("component", "targets"),
		dbs: map[string]*fleetDB{}, served: map[string]servedTarget{}, refused: map[string]refusal{}}
	// The pools close once everything using them stopped: not after a
	// shutdown that overran its deadline (a pool's Close waits for its
	// connections in use; the process exits anyway).
	closePools := true
	defer func() {
		if closePools {
			fr.closePools()
		}
	}()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := make(chan []targetSpec)
	list, watchDone, err := watchTargets(runCtx, a, func(next []targetSpec) {
		select {
		case changes <- next:
		case <-runCtx.Done():
		}
	})
	if err != nil {
		return err
	}
	if fr.share, err = fr.budget.split(len(databasesOf(list))); err != nil {
		cancel()
		<-watchDone
		return err
	}
	// The database figures of every target are read by the reader, in
	// rounds; a scrape and the console's fleet overview show its last
	// reads. The cleaner's counters are exported whatever --target-metrics.
	mcfg := pgboxprom.Config{Relay: f, Targets: fr, Logger: a.log.With("component", "metrics")}
	var cleaner *fleetCleanup
	if o.CleanupInterval > 0 {
		cleaner = newFleetCleanup(fr, lk)
		mcfg.FleetCleaner = cleaner
	}
	reader := newFleetReader(fr, cleaner)
	if !o.TargetMetrics.off {
		mcfg.Fleet = reader
	}
	exp, err := newMetrics(mcfg)
	if err != nil {
		cancel()
		<-watchDone
		return err
	}
	var httpDone <-chan error
	if o.HTTPAddr != "" {
		_, httpDone, err = serveHTTP(runCtx, o.HTTPAddr, o.HTTPConnsPerClient, exp, &fleetReadiness{kafka: lk, fr: fr, lanes: o.Relay.Lanes}, a.log)
		if err != nil {
			cancel()
			<-watchDone
			return err
		}
	}

	var consoleDone <-chan error
	if o.Console.Addr != "" {
		var closeConsole func()
		if consoleDone, closeConsole, err = fr.serveFleetConsole(runCtx, lk, reader); err != nil {
			cancel()
			<-watchDone
			return err
		}
		defer closeConsole()
	}

	a.log.Info("relay running", "targets", len(list), "databases", len(databasesOf(list)),
		"db_conn_budget", o.Targets.ConnBudget, "lanes", o.Relay.Lanes,
		"refresh", fmtDuration(o.Targets.Refresh), "cleanup_interval", o.CleanupInterval.String(),
		"target_metrics", o.TargetMetrics.String(), "kafka", o.Kafka.Redacted())

	stopped, pending := make(chan string, 6), map[string]bool{}
	start := func(name string, fn func()) {
		pending[name] = true
		go func() { fn(); stopped <- name }()
	}
	fleetErr, httpErr := make(chan error, 1), make(chan error, 1)
	start("relay", func() { fleetErr <- f.Run(runCtx) })
	start("targets", func() {
		// The Fleet runs first: each target starts as soon as its check
		// passes, those with rows first (checkOrder).
		began := time.Now()
		fr.reconcile(runCtx, list)
		close(fr.checked)
		if runCtx.Err() == nil {
			fr.mu.Lock()
			served, refused := len(fr.served), len(fr.refused)
			fr.mu.Unlock()
			a.log.Info("targets checked", "served", served, "refused", refused, "databases", len(fr.dbs),
				"db_conns_planned", fr.budget.planned(), "took", time.Since(began).Round(time.Millisecond))
		}
		fr.follow(runCtx, list, changes)
		<-watchDone
	})
	start("metrics", func() { exp.col.Run(runCtx) })
	if !o.TargetMetrics.off || o.Console.Addr != "" {
		start("target reads", func() { reader.Run(runCtx) })
	}
	if cleaner != nil {
		start("cleanup", func() { cleaner.Run(runCtx) })
	}
	if httpDone != nil {
		start("http", func() {
			if err := <-httpDone; err != nil {
				httpErr <- err
			}
		})
	}
	if consoleDone != nil {
		start("console", func() {
			if err := <-consoleDone; err != nil {
				httpErr <- fmt.Errorf("console: %w", err)
			}
		})
	}
	// Fleet.Run returns only when ctx ends: a target's failure is reported
	// and retried, never returned.
	runErr := awaitStop(ctx, a, fleetErr, httpErr, "relay fleet")
	cancel()
	if err := waitStopped(stopped, pending, o.ShutdownTimeout); err != nil {
		closePools = false
		return err
	}
	if runErr != nil {
		return runErr
	}
	s := f.Stats()
	a.log.Info("relay stopped", "published", s.Published, "retried", s.Retried, "parked", s.Parked)
	return nil
}

// databasesOf returns the database URLs of list, once each.
func databasesOf(list []targetSpec) map[string]bool {
	dbs := map[string]bool{}
	for _, t := range list {
		dbs[t.DatabaseURL] = true
	}
	return dbs
}

// follow applies each new list the watch reads, and every --targets-refresh
// checks again the targets refused or not yet checked, until ctx ends.
func (fr *fleetRun) follow(ctx context.Context, list []targetSpec, changes <-chan []targetSpec) {
	every := cmp.Or(fr.a.opts.Targets.Refresh, targetsRefreshDefault)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case next := <-changes:
			list = next
			fr.reconcile(ctx, list)
		case <-tick.C:
			if fr.pending() || fr.growDue() {
				fr.reconcile(ctx, list)
			}
		}
	}
}

// pending reports whether a target waits for a check: refused, or served
// without one.
func (fr *fleetRun) pending() bool {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if len(fr.refused) > 0 {
		return true
	}
	for _, s := range fr.served {
		if !s.verified {
			return true
		}
	}
	return false
}

// reconcile makes list the targets served: the Fleet stops the targets no
// longer listed (or listed with another schema or database) and the pools
// of databases no longer listed are closed; then every target not served,
// or served without a check, is checked, and those that pass (or whose
// database does not answer: the Fleet retries them) are given to the Fleet.
func (fr *fleetRun) reconcile(ctx context.Context, list []targetSpec) {
	fr.mu.Lock()
	fr.listed, fr.list = len(list), list
	want := map[string]targetSpec{}
	for _, t := range list {
		want[t.Name] = t
	}
	for name, r := range fr.refused {
		if want[name] != r.spec {
			delete(fr.refused, name)
		}
	}
	fr.mu.Unlock()
	changed := false
	for name, s := range fr.served {
		if want[name] != s.spec {
			fr.drop(name)
			changed = true
		}
	}
	if changed {
		fr.apply(ctx)
	}
	listed := databasesOf(list)
	for url, db := range fr.dbs {
		if !listed[url] {
			db.pool.Close() // its targets have stopped: SetTargets returned
			if !db.waitClosed(ctx) && ctx.Err() == nil {
				fr.log.Warn("a connection of a database no longer listed is still open; its share is given back anyway", "database", dbconf.RedactDSN(url), "open", db.open.Load())
			}
			fr.budget.give(db.conns)
			fr.mu.Lock()
			delete(fr.dbs, url)
			fr.mu.Unlock()
			fr.log.Info("database no longer listed: its pool is closed", "database", dbconf.RedactDSN(url), "db_conns_planned", fr.budget.planned())
		}
	}
	fr.resizePools(ctx, listed)

	down := map[string]error{} // databases that did not answer a check this round
	changed = false
	var lastApply time.Time
	applyNow := func() {
		fr.apply(ctx)
		changed, lastApply = false, time.Now()
	}
	todo, rows := fr.checkOrder(ctx, list)
	var chk checker
	defer chk.close()
	var backlogged []string // started this round with rows by the statistics
	for _, t := range todo {
		if ctx.Err() != nil {
			return
		}
		if rows[t] == 0 && len(backlogged) > 0 {
			// The targets with rows first, alone for a while: the others'
			// checks and starts wait until they have caught up.
			if changed {
				applyNow()
			}
			fr.awaitCaughtUp(ctx, backlogged)
			backlogged = nil
		}
		db, err := fr.database(ctx, t.DatabaseURL)
		if err != nil {
			fr.refuse(t, fmt.Errorf("target %q (schema %s, database %s): %w", t.Name, t.Schema, dbconf.RedactDSN(t.DatabaseURL), err))
			continue
		}
		err = down[t.DatabaseURL]
		if err == nil {
			err = chk.check(ctx, db, t)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			fr.serve(t, true)
			changed = true
			if rows[t] > 0 { // its rows wait: it starts now
				lastApply = time.Time{}
				backlogged = append(backlogged, t.Name)
			}
		case pgerr.IsRetryable(err) && !pgerr.IsLockTimeout(err):
			// The database did not answer. (A lock on one target's table,
			// checkLockTimeout, is that target's alone: refused below and
			// checked again at the next refresh; before, it made every
			// later target of its database served unchecked.)
			down[t.DatabaseURL] = err
			if _, ok := fr.served[t.Name]; !ok {
				fr.log.Warn("target's database did not answer its check: the relay serves it, retrying, and checks it again at the next refresh",
					"target", t.Name, "schema", t.Schema, "database", dbconf.RedactDSN(t.DatabaseURL), "err", err)
				fr.serve(t, false)
				changed = true
			}
		default:
			if _, ok := fr.served[t.Name]; ok { // served unchecked until now
				fr.drop(t.Name)
				fr.apply(ctx)
			}
			fr.refuse(t, err)
		}
		// Targets start as they pass, not after the whole list's checks.
		if changed && time.Since(lastApply) > time.Second {
			applyNow()
		}
	}
	if changed {
		fr.apply(ctx)
	}
}

// backlogFirstFor bounds how long the checks and starts of the targets
// whose outbox the statistics show empty wait, in a round of checks, for
// those with rows to catch up (a variable for the tests).
var backlogFirstFor = 5 * time.Second

// awaitCaughtUp waits until each target named has caught up
// (relay.TargetState.CaughtUp: the rows it started with are claimed),
// or no longer runs, or backlogFirstFor has passed. Two cores shared by a
// thousand idle targets' checks and starts drained a backlog beside them
// at half a single relay's rate; after them, at 0.8-0.9 (make tenants,
// from the process start). What the wait costs: a row written meanwhile
// to an idle target waits for it to start, at most backlogFirstFor more.
func (fr *fleetRun) awaitCaughtUp(ctx context.Context, names []string) {
	began := time.Now()
	named := make(map[string]bool, len(names))
	for _, n := range names {
		named[n] = true
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		draining := 0
		for _, s := range fr.f.Targets() {
			if named[s.Name] && !s.CaughtUp && (s.State == "starting" || s.State == "running") {
				draining++
			}
		}
		took := time.Since(began)
		if draining == 0 {
			fr.log.Info("targets with rows caught up: checking the others", "targets", len(names), "took", took.Round(time.Millisecond))
			return
		}
		if took >= backlogFirstFor {
			fr.log.Info("targets with rows still draining: checking the others beside them", "draining", draining, "waited", took.Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// database returns the pool of the database url, opened (without
// connecting) within the budget.
func (fr *fleetRun) database(ctx context.Context, url string) (*fleetDB, error) {
	if db, ok := fr.dbs[url]; ok {
		return db, nil
	}
	conns, err := fr.budget.take(fr.share)
	if err != nil {
		return nil, err
	}
	cfg, err := poolConfig(url, "", conns)
	if err == nil {
		open := countConns(cfg)
		var pool *pgxpool.Pool
		if pool, err = pgxpool.NewWithConfig(ctx, cfg); err == nil {
			db := &fleetDB{url: url, pool: pool, conns: conns, open: open}
			fr.mu.Lock()
			fr.dbs[url] = db
			fr.mu.Unlock()
			fr.log.Info("database pool opened", "database", dbconf.RedactDSN(url), "max_conns", conns, "db_conns_planned", fr.budget.planned())
			return db, nil
		}
	}
	fr.budget.give(conns)
	return nil, fmt.Errorf("database %s: %s", dbconf.RedactDSN(url), dbconf.RedactErr(err, url))
}

// growAfter is how long the listed databases stay unchanged before the
// pools below their share grow: three --targets-refresh.
func (fr *fleetRun) growAfter() time.Duration {
	return 3 * cmp.Or(fr.a.opts.Targets.Refresh, targetsRefreshDefault)
}

// growDue reports whether resizePools would grow a pool now.
func (fr *fleetRun) growDue() bool {
	if time.Since(fr.listedSince) < fr.growAfter() || fr.budget.free() == 0 {
		return false
	}
	for _, db := range fr.dbs {
		if db.conns < fr.share {
			return true
		}
	}
	return false
}

// resizePools keeps the budget split evenly over the listed databases.
// When a listed database has no pool yet and the budget's free room is
// short of its share, the largest pools above the share (of equal ones,
// those serving the fewest targets) shrink to it until the room is there:
// a database added gets its share at once. Once
// the listed databases have not changed for growAfter, the pools below the
// share grow to it as far as the free room goes: the connections of a
// database removed go to the others. Growing waits so that a list that
// flaps (a database removed and listed again) does not replace pools back
// and forth: the database listed again finds its room still free.
func (fr *fleetRun) resizePools(ctx context.Context, listed map[string]bool) {
	if sizes := fr.planPools(listed, time.Now()); len(sizes) > 0 {
		fr.replacePools(ctx, sizes)
	}
}

// planPools is resizePools' plan at now: the databases whose pools are to
// be replaced and their new sizes (the room of those that grow reserved).
func (fr *fleetRun) planPools(listed map[string]bool, now time.Time) map[string]int {
	if !maps.Equal(listed, fr.listedDBs) {
		fr.listedDBs, fr.listedSince = listed, now
	}
	fr.share = fr.budget.share(len(listed))
	need := -fr.budget.free()
	for url := range listed {
		if _, ok := fr.dbs[url]; !ok {
			need += fr.share + fr.budget.listen
		}
	}
	sizes := map[string]int{}
	if need > 0 {
		// The largest pools first; of equal pools, those with the fewest
		// targets to hand over.
		targets := map[string]int{}
		for _, s := range fr.served {
			targets[s.spec.DatabaseURL]++
		}
		big := slices.SortedFunc(maps.Values(fr.dbs), func(a, b *fleetDB) int {
			return cmp.Or(b.conns-a.conns, targets[a.url]-targets[b.url], strings.Compare(a.url, b.url))
		})
		for _, db := range big {
			if need <= 0 || db.conns <= fr.share {
				break // the databases that find no room are refused by take
			}
			sizes[db.url] = fr.share
			need -= db.conns - fr.share
		}
	}
	if need <= 0 && now.Sub(fr.listedSince) >= fr.growAfter() {
		for _, url := range slices.Sorted(maps.Keys(fr.dbs)) {
			db := fr.dbs[url]
			if db.conns >= fr.share {
				continue
			}
			if n := fr.budget.grow(db.conns, fr.share); n > db.conns {
				sizes[url] = n
			}
		}
	}
	return sizes
}

// replacePools gives the databases of sizes pools of those sizes: pgxpool
// cannot change a live pool's MaxConns. Their targets stop first
// (SetTargets returns once they have: a batch in flight is finished or
// released, the lanes given up), then each old pool closes and every
// connection dialled with its settings (its pool's, the Fleet's LISTEN) is
// closed before the new pool opens; then the targets start on the new
// pool. No target is served by two pools at once, and a database's old
// and new pools are never open together: the budget holds the larger of
// the two sizes throughout (grow reserves before, shrunk gives back after).
func (fr *fleetRun) replacePools(ctx context.Context, sizes map[string]int) {
	fr.applyExcept(ctx, sizes)
	for _, url := range slices.Sorted(maps.Keys(sizes)) {
		old, n := fr.dbs[url], sizes[url]
		old.pool.Close()
		if !old.waitClosed(ctx) {
			if ctx.Err() != nil {
				return // shutting down: closePools closes what is left
			}
			fr.log.Warn("a connection of a resized database's old pool is still open; the new pool opens anyway", "database", dbconf.RedactDSN(url), "open", old.open.Load())
		}
		if n < old.conns {
			fr.budget.shrunk(old.conns, n)
		}
		cfg := old.pool.Config() // a copy, the connection counter's dialler with it
		cfg.MaxConns = int32(n)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		fr.mu.Lock()
		if err == nil {
			fr.dbs[url] = &fleetDB{url: url, pool: pool, conns: n, open: old.open}
		} else {
			delete(fr.dbs, url)
		}
		fr.mu.Unlock()
		if err != nil {
			fr.budget.give(n)
			if ctx.Err() != nil {
				return
			}
			err = fmt.Errorf("database %s: resizing its pool: %s", dbconf.RedactDSN(url), dbconf.RedactErr(err, url))
			for name, s := range fr.served {
				if s.spec.DatabaseURL == url {
					fr.drop(name)
					fr.refuse(s.spec, err)
				}
			}
			continue
		}
		fr.log.Info("database pool resized", "database", dbconf.RedactDSN(url), "max_conns", n, "was", old.conns,
			"databases", len(fr.listedDBs), "db_conns_planned", fr.budget.planned())
	}
	fr.apply(ctx)
}

// checker is a reconcile round's check connection: a pool of one
// connection to the database of the target checked last. Checks run one
// at a time, the targets of a database one after the other (checkOrder),
// each naming its schema (checkTarget): a thousand schemas of a database
// are checked on one connection, not a thousand.
type checker struct {
	url  string
	pool *pgxpool.Pool
}

// check checks t on db's check connection, opened when the last check was
// of another database.
func (c *checker) check(ctx context.Context, db *fleetDB, t targetSpec) error {
	ctx, cancel := context.WithTimeout(ctx, dbconf.PingTimeout)
	defer cancel()
	if c.url != db.url {
		c.close()
		cfg := db.pool.Config()
		cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("target %q: database %s: %s", t.Name, dbconf.RedactDSN(db.url), dbconf.RedactErr(err, db.url))
		}
		c.url, c.pool = db.url, pool
	}
	// A target whose table is locked (a long migration, an operator's
	// LOCK) fails its check quickly, alone, not the whole round.
	return checkTarget(ctx, c.pool, t, checkLockTimeout)
}

func (c *checker) close() {
	if c.pool != nil {
		c.pool.Close()
		c.url, c.pool = "", nil
	}
}

// checkLockTimeout bounds how long a Fleet's check waits for a lock on a
// target's table.
const checkLockTimeout = 2 * time.Second

// rowsAsk bounds how long checkOrder waits for a database's statistics.
const rowsAsk = time.Second

// checkOrder returns the targets of list that wait for a check, in the
// order they are checked and started: those whose outbox holds rows
// first, the most first (after a restart, the tenants with a backlog do
// not wait for a thousand idle ones), then by database, in the list's
// order. It also returns each target's rows by the statistics (0: none,
// or unknown: a database that did not answer within rowsAsk).
func (fr *fleetRun) checkOrder(ctx context.Context, list []targetSpec) ([]targetSpec, map[targetSpec]int64) {
	var todo []targetSpec
	dbOrder := map[string]int{}
	var urls []string // dbOrder's keys in the list's order
	for _, t := range list {
		if s, ok := fr.served[t.Name]; ok && s.verified {
			continue
		}
		if _, ok := dbOrder[t.DatabaseURL]; !ok {
			dbOrder[t.DatabaseURL] = len(dbOrder)
			urls = append(urls, t.DatabaseURL)
		}
		todo = append(todo, t)
	}
	var mu sync.Mutex
	bySchema := map[[2]string]int64{} // (database URL, schema) -> rows
	var wg sync.WaitGroup
	// In the list's order: when the budget has room for only some new
	// databases, the first listed get it, as before checkOrder.
	for _, url := range urls {
		db, err := fr.database(ctx, url)
		if err != nil {
			continue // its targets are refused with this error
		}
		wg.Go(func() {
			qctx, cancel := context.WithTimeout(ctx, rowsAsk)
			defer cancel()
			rows, err := outboxstats.Rows(qctx, db.pool)
			if err != nil {
				return
			}
			mu.Lock()
			for schema, n := range rows {
				bySchema[[2]string{url, schema}] = n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	rows := make(map[targetSpec]int64, len(todo))
	for _, t := range todo {
		if n := bySchema[[2]string{t.DatabaseURL, t.Schema}]; n > 0 {
			rows[t] = n
		}
	}
	slices.SortStableFunc(todo, func(a, b targetSpec) int {
		if c := cmp.Compare(rows[b], rows[a]); c != 0 {
			return c
		}
		return cmp.Compare(dbOrder[a.DatabaseURL], dbOrder[b.DatabaseURL])
	})
	return todo, rows
}

// serve records t as served; apply gives it to the Fleet.
func (fr *fleetRun) serve(t targetSpec, verified bool) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if r, ok := fr.refused[t.Name]; ok {
		delete(fr.refused, t.Name)
		fr.log.Info("target accepted: the relay serves it", "target", t.Name, "schema", t.Schema, "was", r.err)
	}
	fr.served[t.Name] = servedTarget{spec: t, verified: verified}
}

func (fr *fleetRun) drop(name string) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	delete(fr.served, name)
}

// refuse records t as refused and logs it at ERROR, once per change of
// its error.
func (fr *fleetRun) refuse(t targetSpec, err error) {
	msg := err.Error()
	fr.mu.Lock()
	prev, ok := fr.refused[t.Name]
	fr.refused[t.Name] = refusal{spec: t, err: msg}
	fr.mu.Unlock()
	if ok && prev.err == msg {
		return
	}
	fr.log.Error("target refused: the relay does not serve it, the others run; it is checked again every --targets-refresh",
		"target", t.Name, "schema", t.Schema, "database", dbconf.RedactDSN(t.DatabaseURL), "err", msg)
}

// apply sets the Fleet's targets to those served; it returns once the
// targets removed have stopped.
func (fr *fleetRun) apply(ctx context.Context) { fr.applyExcept(ctx, nil) }

// applyExcept is apply without the targets of the databases in skip: they
// stop.
func (fr *fleetRun) applyExcept(ctx context.Context, skip map[string]int) {
	fr.mu.Lock()
	ts := make([]relay.Target, 0, len(fr.served))
	for _, name := range slices.Sorted(maps.Keys(fr.served)) {
		s := fr.served[name]
		if _, ok := skip[s.spec.DatabaseURL]; ok {
			continue
		}
		ts = append(ts, relay.Target{Name: name, Pool: fr.dbs[s.spec.DatabaseURL].pool, Schema: s.spec.Schema})
	}
	fr.mu.Unlock()
	if err := fr.f.SetTargets(ts); err != nil { // checked by the list's parser: not expected
		fr.log.ErrorContext(ctx, "cannot set the fleet's targets", "err", err)
	}
}

// closePools closes every database's pool, once the Fleet and reconcile
// have stopped.
func (fr *fleetRun) closePools() {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for _, db := range fr.dbs {
		db.pool.Close()
	}
}

// counts returns the number of targets per state (the Fleet's, and
// refused) and the Fleet's targets.
func (fr *fleetRun) counts() (map[string]int, []relay.TargetState) {
	states := fr.f.Targets()
	n := map[string]int{}
	for _, s := range states {
		n[s.State]++
	}
	fr.mu.Lock()
	n[targetStateRefused] = len(fr.refused)
	fr.mu.Unlock()
	return n, states
}

// TargetCounts makes fleetRun a pgboxprom.Targets: the Fleet's counts,
// refused added, every state present (0 included) so that an alert on one
// has a series to read.
func (fr *fleetRun) TargetCounts() map[string]int {
	n, _ := fr.counts()
	for _, s := range targetStates {
		n[s] += 0
	}
	return n
}

// fleetReadiness answers /readyz with a target list: ready when Kafka
// answers and at least one target holds lanes (or is a standby: more
// instances than lanes, or dormant), or when the list is empty. A target refused or
// failing does not make the process unready while another is served: one
// tenant's missing migration must not stop a rollout; a relay serving none
// of its targets is not ready.
type fleetReadiness struct {
	kafka *lazyKafka
	fr    *fleetRun
	lanes int
}

// fleetReadyReport is /readyz's body with a target list.
type fleetReadyReport struct {
	Ready bool   `json:"ready"`
	Kafka string `json:"kafka"`
	// Targets counts the targets per state (refused: not served).
	Targets map[string]int `json:"targets"`
	// Serving counts the running targets that hold lanes, stand by, or are
	// dormant (idle, lanes given up until rows come).
	Serving int `json:"serving"`
	// Problems lists up to 20 targets not running, or running with a
	// failure, as "name: state: error".
	Problems []string `json:"problems,omitempty"`
}

const readyProblemsMax = 20

func (r *fleetReadiness) report(ctx context.Context) (bool, any) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	rep := fleetReadyReport{Kafka: "ok"}
	if err := r.kafka.ping(ctx); err != nil {
		rep.Kafka = "unreachable: " + err.Error()
	}
	n, states := r.fr.counts()
	rep.Targets = n
	problem := func(s string) {
		if len(rep.Problems) < readyProblemsMax {
			rep.Problems = append(rep.Problems, s)
		}
	}
	for _, s := range states {
		if s.State == "running" && (s.Stats.Lanes > 0 || s.Stats.Instances > r.lanes || s.Dormant) {
			rep.Serving++
		}
		if s.State != "running" || s.Err != nil {
			msg := s.Name + ": " + s.State
			if s.Err != nil {
				msg += ": " + strings.Join(strings.Fields(s.Err.Error()), " ")
			}
			problem(msg)
		}
	}
	r.fr.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(r.fr.refused)) {
		problem(name + ": " + targetStateRefused + ": " + r.fr.refused[name].err)
	}
	listed := r.fr.listed
	r.fr.mu.Unlock()
	rep.Ready = rep.Kafka == "ok" && (listed == 0 || rep.Serving > 0)
	return rep.Ready, rep
}
