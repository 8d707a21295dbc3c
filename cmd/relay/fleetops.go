package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxprom"
)

// What `relay run` with a target list does besides relaying: it reads
// every served target's database figures for /metrics (fleetReader), and
// prunes every served target every --cleanup-interval (fleetCleanup). Both
// work on at most --targets-concurrency targets at a time, through what
// `relay status` and `relay cleanup` over a list use (readTarget,
// cleanTarget).

// targetSeries is --target-metrics: which targets get series of their own,
// or (off) no database reads at all.
type targetSeries struct {
	all bool
	top int // with all false: the N worst targets; 0 none
	off bool
}

// targetMetricsDefault is --target-metrics: the ten worst targets, in the
// order `relay status` lists them. Ten keeps a fleet of any size to a few
// hundred series (about a dozen per target) and shows whom an alert on
// the fleet's totals is about; a list of ten or fewer gets every target's.
const targetMetricsDefault = "top:10"

// targetMetricsTopMax bounds top:N.
const targetMetricsTopMax = 1000

func (s targetSeries) String() string {
	switch {
	case s.off:
		return "off"
	case s.all:
		return "all"
	case s.top > 0:
		return "top:" + strconv.Itoa(s.top)
	}
	return "none"
}

func parseTargetSeries(v string) (targetSeries, bool) {
	v = strings.ToLower(strings.TrimSpace(v))
	switch v {
	case "none":
		return targetSeries{}, true
	case "all":
		return targetSeries{all: true}, true
	case "off":
		return targetSeries{off: true}, true
	}
	n, ok := strings.CutPrefix(v, "top:")
	if !ok {
		return targetSeries{}, false
	}
	top, err := strconv.Atoi(n)
	if err != nil || top < 1 || top > targetMetricsTopMax {
		return targetSeries{}, false
	}
	return targetSeries{top: top}, true
}

// bindTargetMetrics binds --target-metrics for `relay run`.
func (o *options) bindTargetMetrics(s *settings, has map[string]bool) {
	if !has[groupTargets] || !has[groupRelay] {
		return
	}
	value(s, &o.TargetMetrics, groupTargets, "target-metrics", "PGBOX_TARGET_METRICS", targetMetricsDefault,
		"with --targets or --targets-query, which targets /metrics gives series of their own (labelled target): none, all, or top:N, the N worst as `relay status` orders them, beside the fleet's totals; off reads no target's database for /metrics (no totals either)",
		fmt.Sprintf(`"none", "all", "top:N" with N from 1 to %d, or "off"`, targetMetricsTopMax), parseTargetSeries)
}

// targetReadTimeout bounds one target's read for the metrics, the wait
// for a connection of its database's pool included.
const targetReadTimeout = 5 * time.Second

// schemaPool reads a target through its database's shared pool: each
// transaction sets the target's schema as its search_path (SET LOCAL's
// set_config), so the reads take no connection outside the budget and
// leave the pool's connections as they were.
type schemaPool struct {
	pool   *pgxpool.Pool
	schema string
}

func (s schemaPool) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, s.schema); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// targetRead is one target's last read.
type targetRead struct {
	state, detail string
	snap          *inspect.Snapshot
}

// fleetReader reads every served target's figures in rounds, at most
// --targets-concurrency at a time, one round every --targets-refresh (and
// never more than half the time: after a round that took longer than the
// refresh, it waits as long as the round took). A scrape reads what the
// last rounds read: it costs the databases nothing.
type fleetReader struct {
	fr     *fleetRun
	series targetSeries
	every  time.Duration
	limit  int
	lanes  int
	log    *logger

	mu   sync.Mutex
	last map[string]targetRead // by target name
}

func newFleetReader(fr *fleetRun) *fleetReader {
	o := fr.a.opts
	return &fleetReader{fr: fr, series: o.TargetMetrics, every: cmp.Or(o.Targets.Refresh, targetsRefreshDefault), limit: o.Targets.EachConcurrency,
		lanes: o.Relay.Lanes, log: fr.a.log.With("component", "metrics"), last: map[string]targetRead{}}
}

// Run reads the targets until ctx ends.
func (r *fleetReader) Run(ctx context.Context) {
	for {
		start := time.Now()
		r.round(ctx)
		took := time.Since(start)
		wait := max(r.every-took, took)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// servedPool is a served target and its database's pool.
type servedPool struct {
	spec targetSpec
	pool *pgxpool.Pool
}

// servedPools returns the served targets, by name, with their pools.
func (fr *fleetRun) servedPools() []servedPool {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	out := make([]servedPool, 0, len(fr.served))
	for _, name := range slices.Sorted(maps.Keys(fr.served)) {
		s := fr.served[name]
		if db, ok := fr.dbs[s.spec.DatabaseURL]; ok {
			out = append(out, servedPool{spec: s.spec, pool: db.pool})
		}
	}
	return out
}

func (r *fleetReader) round(ctx context.Context) {
	targets := r.fr.servedPools()
	served := namesOf(targets)
	r.mu.Lock()
	maps.DeleteFunc(r.last, func(name string, _ targetRead) bool { return !served[name] }) // no longer served
	r.mu.Unlock()
	cfg := inspect.Config{Lanes: r.lanes, StatementTimeout: targetReadTimeout / 2, Logger: r.log}
	onTargets(ctx, len(targets), r.limit, func(i int) {
		t := targets[i]
		tctx, cancel := context.WithTimeout(ctx, targetReadTimeout)
		state, detail, snap := readTarget(tctx, schemaPool{pool: t.pool, schema: t.spec.Schema}, t.spec, cfg)
		cancel()
		if ctx.Err() != nil {
			return // shutting down: not the target's failure
		}
		r.mu.Lock()
		r.last[t.spec.Name] = targetRead{state: state, detail: detail, snap: trimSnapshot(snap)}
		r.mu.Unlock()
		if snap == nil {
			r.log.Debug("target's figures not read", "target", t.spec.Name, "schema", t.spec.Schema, "state", state, "detail", detail)
		}
	})
}

// trimSnapshot keeps what the metrics and the ranking read of a snapshot:
// the totals, lanes, instances (whether they are all dormant), inbox ages,
// dead letters and the horizon per kind, not the lists (parked rows,
// holders, the backlog per topic and lane), so that thousands of them stay
// small.
func trimSnapshot(s *inspect.Snapshot) *inspect.Snapshot {
	if s == nil {
		return nil
	}
	c := *s
	c.Topics, c.LaneAges, c.ParkedTopics, c.Parked = nil, nil, nil, nil
	c.Horizon.Holders = nil
	return &c
}

// FleetTargets makes fleetReader a pgboxprom.Fleet: every served target's
// relay counters and last read, the targets --target-metrics chooses
// marked for series of their own.
func (r *fleetReader) FleetTargets() []pgboxprom.FleetTarget {
	stats := map[string]outbox.RelayStats{}
	for _, s := range r.fr.f.Targets() {
		stats[s.Name] = s.Stats
	}
	targets := r.fr.servedPools()
	r.mu.Lock()
	reads := maps.Clone(r.last)
	r.mu.Unlock()
	out := make([]pgboxprom.FleetTarget, 0, len(targets))
	lines := make([]targetLine, 0, len(targets))
	index := map[string]int{}
	for _, t := range targets {
		ft := pgboxprom.FleetTarget{Name: t.spec.Name, Read: pgboxprom.ReadPending}
		if s, ok := stats[t.spec.Name]; ok {
			ft.Relay = &s
		}
		if rd, ok := reads[t.spec.Name]; ok {
			ft.Snapshot = rd.snap
			switch {
			case rd.state == stateUnreachable:
				ft.Read = pgboxprom.ReadUnreachable
			case rd.snap == nil:
				ft.Read = pgboxprom.ReadFailed
			default:
				ft.Read = pgboxprom.ReadOK
			}
			line := targetLine{Name: t.spec.Name, State: rd.state}
			if rd.snap != nil {
				line.TargetFigures = figuresOf(rd.snap)
			}
			lines = append(lines, line)
		}
		index[t.spec.Name] = len(out)
		out = append(out, ft)
	}
	for _, name := range r.series.choose(lines, targets) {
		out[index[name]].Series = true
	}
	return out
}

// choose returns the names of the targets that get series of their own:
// none, all, or the N worst read (as `relay status` orders them: failing
// first, then the oldest unpublished row, the larger backlog, parked rows,
// dead letters), then those not read yet, by name.
func (s targetSeries) choose(lines []targetLine, targets []servedPool) []string {
	switch {
	case s.all:
		names := make([]string, len(targets))
		for i, t := range targets {
			names[i] = t.spec.Name
		}
		return names
	case s.top == 0:
		return nil
	}
	sortLines(lines)
	var names []string
	read := map[string]bool{}
	for _, l := range lines {
		read[l.Name] = true
	}
	for _, l := range lines[:min(s.top, len(lines))] {
		names = append(names, l.Name)
	}
	for _, t := range targets { // by name: servedPools sorts them
		if len(names) >= s.top {
			break
		}
		if !read[t.spec.Name] {
			names = append(names, t.spec.Name)
		}
	}
	return names
}

// namesOf returns the names of targets as a set.
func namesOf(targets []servedPool) map[string]bool {
	names := make(map[string]bool, len(targets))
	for _, t := range targets {
		names[t.spec.Name] = true
	}
	return names
}

// fleetCleanup prunes every served target every --cleanup-interval, each
// under its own cleanup lease (cleanTarget, as `relay cleanup` over a
// list), over one Kafka client. A pass takes a pool of
// cleanupTargetConns connections: the budget keeps room for one pass, and
// lends more passes room (up to --targets-concurrency at once) while it
// has it.
type fleetCleanup struct {
	fr    *fleetRun
	kafka *lazyKafka
	every time.Duration
	limit int
	log   *logger

	// failing is each failing target's last error: a failure is logged
	// when it changes, a recovery once.
	failing map[string]string
}

func newFleetCleanup(fr *fleetRun, lk *lazyKafka) *fleetCleanup {
	o := fr.a.opts
	return &fleetCleanup{fr: fr, kafka: lk, every: o.CleanupInterval, limit: o.Targets.EachConcurrency,
		log: fr.a.log.With("component", "cleanup"), failing: map[string]string{}}
}

// Run runs a round at once, then every --cleanup-interval, until ctx ends.
func (c *fleetCleanup) Run(ctx context.Context) {
	for {
		c.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.every):
		}
	}
}

func (c *fleetCleanup) round(ctx context.Context) {
	targets := c.fr.servedPools()
	if len(targets) == 0 {
		return
	}
	start := time.Now()
	extra := c.fr.budget.borrow(cleanupTargetConns, min(c.limit, len(targets))-1)
	defer c.fr.budget.giveBack(extra * cleanupTargetConns)
	// A new client per round: one that failed to connect in the last round
	// does not fail this one.
	kafka := &onceKafka{lk: c.kafka}
	errs := make([]error, len(targets))
	results := make([]string, len(targets))
	// causes are the errors without how much a failed pass had deleted:
	// a target failing the same way is logged once.
	causes := make([]string, len(targets))
	onTargets(ctx, len(targets), 1+extra, func(i int) {
		t := targets[i].spec
		log := c.log.With("target", t.Name, "schema", t.Schema)
		res, err := cleanTarget(ctx, c.fr.a, t, kafka, log)
		if err != nil {
			cause := err
			if p := (*partialPass)(nil); errors.As(err, &p) {
				cause = p.err
			}
			causes[i] = oneLine(dbconf.RedactErr(cause, t.DatabaseURL))
			err = errors.New(oneLine(dbconf.RedactErr(err, t.DatabaseURL)))
		}
		errs[i], results[i] = err, res
	})
	if ctx.Err() != nil {
		return // shutting down: the passes cut short are not failures
	}
	failed := 0
	for i, t := range targets {
		name, err := t.spec.Name, errs[i]
		prev, wasFailing := c.failing[name]
		switch {
		case err != nil:
			failed++
			if !wasFailing || prev != causes[i] {
				c.log.Warn("cleanup: target failed; the others were pruned, it is tried again every --cleanup-interval",
					"target", name, "schema", t.spec.Schema, "err", err)
			}
			c.failing[name] = causes[i]
		case wasFailing:
			delete(c.failing, name)
			c.log.Info("cleanup: target pruned again", "target", name, "schema", t.spec.Schema, "result", results[i])
		default:
			c.log.Debug("cleanup: target done", "target", name, "schema", t.spec.Schema, "result", results[i])
		}
	}
	served := namesOf(targets)
	maps.DeleteFunc(c.failing, func(name, _ string) bool { return !served[name] }) // no longer served
	c.log.Info("cleanup: round done", "targets", len(targets), "failed", failed, "concurrency", 1+extra,
		"took", fmtDuration(time.Since(start).Round(time.Millisecond)))
}
