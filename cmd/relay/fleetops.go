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
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/console"
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
// hundred series (up to 17 per target, and its detail: one per lane, per
// topic and lane with a backlog, per topic with parked rows, a few per
// consumer and topic) and shows whom an alert on the fleet's totals is
// about; a list of ten or fewer gets every target's.
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
		"with --targets or --targets-query, which targets /metrics gives series of their own (labelled target: their figures, and their detail per topic, lane and consumer): none, all, or top:N, the N worst as `relay status` orders them, beside the fleet's totals; off reads no target's database for /metrics (no totals either)",
		fmt.Sprintf(`"none", "all", "top:N" with N from 1 to %d, or "off"`, targetMetricsTopMax), parseTargetSeries)
}

// targetReadTimeout bounds one target's read, the wait for a connection
// of its database's pool included.
const targetReadTimeout = 5 * time.Second

// targetRead is one target's last read.
type targetRead struct {
	state, detail string
	snap          *inspect.Snapshot
	at            time.Time
	sig           string    // its tables' statistics when read (tableSignaturesSQL; "": unknown)
	full          time.Time // when it was last read in full (carried over since, when before at)
}

// fleetReader reads every listed target's figures in rounds, at most
// --targets-concurrency at a time, one round every --targets-refresh (and
// never more than half the time: after a round that took longer than the
// refresh, it waits as long as the round took), each through its targetDB
// (at most readerConns of its pool's connections, the console's pages
// included); a clean target whose tables have not changed is carried over
// rather than read again (carryOver). /metrics (FleetTargets: the served targets) and the console's
// fleet overview (summaries: every target, a refused one's figures saying
// why) show what the last rounds read: a scrape or a page load costs the
// databases nothing.
type fleetReader struct {
	fr      *fleetRun
	dbs     *targetDBs
	cleaner *fleetCleanup // nil: not pruned in this process
	series  targetSeries
	every   time.Duration
	limit   int
	lanes   int
	log     *logger

	// fullReads and carried count the targets read in full and carried
	// over (carryOver), for the log and the tests.
	fullReads, carried atomic.Int64

	mu   sync.Mutex
	last map[string]targetRead // by target name
	// chosen is the targets the last scrape gave series of their own:
	// their next reads keep the detail per topic and lane (keepsDetail).
	chosen map[string]bool
}

func newFleetReader(fr *fleetRun, cleaner *fleetCleanup) *fleetReader {
	o := fr.a.opts
	return &fleetReader{fr: fr, dbs: newTargetDBs(fr), cleaner: cleaner, series: o.TargetMetrics, every: cmp.Or(o.Targets.Refresh, targetsRefreshDefault),
		limit: o.Targets.EachConcurrency, lanes: o.Relay.Lanes, log: fr.a.log.With("component", "reader"), last: map[string]targetRead{}}
}

// Run reads the targets until ctx ends, from the end of the first round
// of checks: before, a target whose database's pool was not open yet read
// as unreachable until the next round (--targets-refresh).
func (r *fleetReader) Run(ctx context.Context) {
	if r.fr.checked != nil {
		select {
		case <-r.fr.checked:
		case <-ctx.Done():
			return
		}
	}
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

// servedPools returns the served targets, by name, with their pools.
func (fr *fleetRun) servedPools() []targetPool {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	specs := make([]targetSpec, 0, len(fr.served))
	for _, name := range slices.Sorted(maps.Keys(fr.served)) {
		specs = append(specs, fr.served[name].spec)
	}
	return fr.withPools(specs, false)
}

func (r *fleetReader) round(ctx context.Context) {
	targets := r.fr.listedPools()
	listed := namesOf(targets)
	r.mu.Lock()
	maps.DeleteFunc(r.last, func(name string, _ targetRead) bool { return !listed[name] }) // no longer listed
	r.mu.Unlock()
	cfg := inspect.Config{Lanes: r.lanes, StatementTimeout: targetReadTimeout / 2, Logger: r.log}
	hz := &horizons{by: map[*pgxpool.Pool]*horizonRead{}}
	sigs := r.signatures(ctx, targets)
	full0, carried0 := r.fullReads.Load(), r.carried.Load()
	onTargets(ctx, len(targets), r.limit, func(i int) {
		t := targets[i]
		detail := r.keepsDetail(t.spec.Name, len(targets))
		rd, ok := r.carryOver(ctx, t, sigs[t.spec.Name], cfg, hz, detail)
		if !ok {
			rd = r.read(ctx, t, cfg, hz, detail)
			rd.sig, rd.full = sigs[t.spec.Name], rd.at
			r.fullReads.Add(1)
		}
		if ctx.Err() != nil {
			return // shutting down: not the target's failure
		}
		r.mu.Lock()
		r.last[t.spec.Name] = rd
		r.mu.Unlock()
		if rd.snap == nil {
			r.log.Debug("target's figures not read", "target", t.spec.Name, "schema", t.spec.Schema, "state", rd.state, "detail", rd.detail)
		}
	})
	r.log.Debug("figures' round", "targets", len(targets), "read", r.fullReads.Load()-full0, "carried over", r.carried.Load()-carried0)
}

// A round reads a target again only when something may have changed:
// at 5,000 targets a round of `relay status` snapshots took minutes, and
// most of them were idle tenants whose figures had not moved. A target is
// carried over, its last read kept with its ages moved on (aged) and its
// database's horizon the round's, when all of these hold:
//
//   - its last read was in full less than carryMax rounds ago;
//   - its tables' statistics (tableSignatures: rows inserted, updated and
//     deleted, live rows, the tables themselves) are what they were at
//     that read, the relay's heartbeat tables aside;
//   - that read found it clean: state ok, no unpublished or parked row,
//     no dead letter, no lane held (an awake target's heartbeat writes
//     its lanes anyway);
//   - /metrics does not export its detail (keepsDetail).
//
// PostgreSQL's statistics lag a write by up to a few seconds (a backend
// sends them at most once a second, and after 10 s idle): a row written
// just before a round may be carried over once, and is read at the next
// round. With track_counts off the statistics never move, so every target
// is read in full.
const carryMax = 10

// tableSignaturesSQL is, per schema of $1, what the statistics say of its
// pgbox tables but the heartbeat's (pgbox_relay_instances and
// pgbox_relay_history, written by a dormant target every 30 s or so, and
// not in the figures). No row when track_counts is off.
const tableSignaturesSQL = `SELECT s.schemaname, concat_ws(':', count(*), sum(s.n_tup_ins), sum(s.n_tup_upd), sum(s.n_tup_del),
	sum(s.n_live_tup), sum(s.relid::oid::int8))
FROM pg_stat_user_tables s
WHERE current_setting('track_counts')::bool AND s.schemaname = ANY ($1::text[])
  AND s.relname LIKE 'pgbox\_%' AND s.relname NOT IN ('pgbox_relay_instances', 'pgbox_relay_history')
GROUP BY s.schemaname`

// signatures reads tableSignaturesSQL once per database for targets: the
// signature of each target by name (none for a database that failed).
func (r *fleetReader) signatures(ctx context.Context, targets []targetPool) map[string]string {
	byPool := map[*pgxpool.Pool][]targetPool{}
	for _, t := range targets {
		if t.pool != nil && t.spec.Schema != "" {
			byPool[t.pool] = append(byPool[t.pool], t)
		}
	}
	out := map[string]string{}
	for pool, ts := range byPool {
		sig, err := r.readSignatures(ctx, pool, ts)
		if err != nil {
			r.log.Debug("statistics not read: every target of the database is read in full", "database", pool.Config().ConnConfig.Database, "error", err)
			continue
		}
		for _, t := range ts {
			if v, ok := sig[t.spec.Schema]; ok {
				out[t.spec.Name] = v
			}
		}
	}
	return out
}

func (r *fleetReader) readSignatures(ctx context.Context, pool *pgxpool.Pool, ts []targetPool) (map[string]string, error) {
	db, err := r.dbs.get(ts[0].spec, pool)
	if err != nil {
		return nil, err
	}
	schemas := make([]string, len(ts))
	for i, t := range ts {
		schemas[i] = t.spec.Schema
	}
	tctx, cancel := context.WithTimeout(ctx, targetReadTimeout)
	defer cancel()
	tx, err := db.Begin(tctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(tctx, tableSignaturesSQL, schemas)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for rows.Next() {
		var schema, sig string
		if err := rows.Scan(&schema, &sig); err != nil {
			return nil, err
		}
		out[schema] = sig
	}
	return out, rows.Err()
}

// carryOver is the target's last read carried over to now, when it may be
// (see carryMax): false means read it.
func (r *fleetReader) carryOver(ctx context.Context, t targetPool, sig string, cfg inspect.Config, hz *horizons, detail bool) (targetRead, bool) {
	r.mu.Lock()
	last, ok := r.last[t.spec.Name]
	r.mu.Unlock()
	now := time.Now()
	if !ok || detail || sig == "" || last.sig != sig || last.state != stateOK || last.snap == nil || !clean(last.snap) ||
		now.Sub(last.full) >= carryMax*r.every {
		return targetRead{}, false
	}
	db, err := r.dbs.get(t.spec, t.pool)
	if err != nil {
		return targetRead{}, false
	}
	tctx, cancel := context.WithTimeout(ctx, targetReadTimeout)
	defer cancel()
	snap := aged(last.snap, now.Sub(last.at))
	if h := hz.get(tctx, t.pool, db, cfg); h != nil {
		snap.Horizon = *h
		snap.Horizon.Kinds = slices.Clone(h.Kinds)
		snap.Horizon.Holders = nil
	} else {
		return targetRead{}, false // the horizon must be this round's: read in full, which reports why not
	}
	r.carried.Add(1)
	last.snap, last.at = snap, now
	return last, true
}

// clean reports whether a read found nothing waiting and no lane held.
func clean(s *inspect.Snapshot) bool {
	if s.Outbox.Unpublished != 0 || s.Outbox.Parked != 0 {
		return false
	}
	for _, d := range s.Dead {
		if d.Count != 0 {
			return false
		}
	}
	for _, l := range s.Lanes {
		if l.Held {
			return false
		}
	}
	return true
}

// aged is s as read d later, its tables unchanged: its time and every
// age (the inbox's oldest keys, their cutoffs and margins) move on by d.
// A clean snapshot has no outbox age.
func aged(s *inspect.Snapshot, d time.Duration) *inspect.Snapshot {
	c := *s
	c.Time = s.Time.Add(d)
	c.Inbox = slices.Clone(s.Inbox)
	for i := range c.Inbox {
		in := &c.Inbox[i]
		in.OldestAge += d.Seconds()
		if in.Cutoff != nil {
			cut := in.Cutoff.Add(d)
			in.Cutoff = &cut
		}
		if in.Margin != nil {
			m := *in.Margin - d.Seconds()
			in.Margin = &m
		}
	}
	return &c
}

// read reads one target's state and figures, within targetReadTimeout;
// its database's horizon comes from hz. detail keeps the snapshot's
// detail per topic and lane (trimSnapshot).
func (r *fleetReader) read(ctx context.Context, t targetPool, cfg inspect.Config, hz *horizons, detail bool) targetRead {
	db, err := r.dbs.get(t.spec, t.pool)
	if err != nil {
		return targetRead{state: stateUnreachable, detail: err.Error(), at: time.Now()}
	}
	tctx, cancel := context.WithTimeout(ctx, targetReadTimeout)
	defer cancel()
	cfg.Horizon = hz.get(tctx, t.pool, db, cfg)
	state, msg, snap := readTarget(tctx, db, t.spec, cfg)
	return targetRead{state: state, detail: msg, snap: trimSnapshot(snap, detail), at: time.Now()}
}

// keepsDetail reports whether a read of the target keeps its detail per
// topic and lane, which /metrics exports for the targets chosen for series
// of their own (pgboxprom's pgbox_target_outbox_topic_unpublished_rows…):
// with --target-metrics all, with top:N over N targets or fewer, and for
// the targets the last scrape chose. A target chosen anew gets its detail
// from its next read; the others' reads stay small.
func (r *fleetReader) keepsDetail(name string, listed int) bool {
	switch {
	case r.series.all:
		return true
	case r.series.top == 0:
		return false
	case listed <= r.series.top:
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chosen[name]
}

// horizonShare is how long a round of the reader shares one read of a
// database's xmin horizon among its targets' snapshots. The horizon is
// the database's, and its query (pg_stat_activity and the replication
// views) is planned anew at every read under another schema: read for
// each of 1,000 schemas of one database, it took about a sixth of a core
// of two (make tenants, pg_stat_statements: 17 reads a second, 9 ms each).
const horizonShare = 5 * time.Second

// horizonReadTimeout bounds one shared read of a horizon (the query takes
// milliseconds): a slow one must leave the target that ran it most of its
// targetReadTimeout, and its database's other targets their own.
const horizonReadTimeout = time.Second

// horizons is one round's reads of each database's horizon.
type horizons struct {
	mu    sync.Mutex
	by    map[*pgxpool.Pool]*horizonRead
	reads atomic.Int64 // for the tests
}

type horizonRead struct {
	turn chan struct{}    // one read at a time; a waiter gives up at its own deadline
	h    *inspect.Horizon // nil after a failed read
	at   time.Time        // of the last read; zero: none yet
}

// get returns pool's horizon, read through db unless read (or failed)
// less than horizonShare ago; nil when it could not be read, or not
// before ctx ended: the target's snapshot then reads it itself, as
// without sharing, and reports a failure as its own. A failed read is
// kept as failed for horizonShare, so the other targets do not each
// wait for it and try again (the review).
func (hz *horizons) get(ctx context.Context, pool *pgxpool.Pool, db inspect.DB, cfg inspect.Config) *inspect.Horizon {
	hz.mu.Lock()
	hr := hz.by[pool]
	if hr == nil {
		hr = &horizonRead{turn: make(chan struct{}, 1)}
		hz.by[pool] = hr
	}
	hz.mu.Unlock()
	select {
	case hr.turn <- struct{}{}:
	case <-ctx.Done():
		return nil
	}
	defer func() { <-hr.turn }()
	if !hr.at.IsZero() && time.Since(hr.at) < horizonShare {
		return hr.h
	}
	hz.reads.Add(1)
	rctx, cancel := context.WithTimeout(ctx, horizonReadTimeout)
	defer cancel()
	if cfg.StatementTimeout == 0 || cfg.StatementTimeout > horizonReadTimeout {
		cfg.StatementTimeout = horizonReadTimeout
	}
	h, err := inspect.ReadHorizon(rctx, db, cfg)
	hr.h, hr.at = nil, time.Now()
	if err == nil {
		hr.h = &h
	}
	return hr.h
}

// summaries is the last read of every listed target, for the console's
// fleet overview.
func (r *fleetReader) summaries() map[string]console.FleetSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]console.FleetSummary, len(r.last))
	for name, rd := range r.last {
		s := console.FleetSummary{State: rd.state, Detail: rd.detail, At: rd.at}
		if rd.snap != nil {
			s.Figures = figuresOf(rd.snap).console()
		}
		out[name] = s
	}
	return out
}

// trimSnapshot keeps what the metrics and the ranking read of a snapshot:
// the totals, lanes, instances (whether they are all dormant), inbox ages,
// dead letters and the horizon per kind, not the lists (parked rows,
// holders and, unless detail, the backlog per topic and lane, each lane's
// oldest row and the parked rows per topic), so that thousands of them
// stay small.
func trimSnapshot(s *inspect.Snapshot, detail bool) *inspect.Snapshot {
	if s == nil {
		return nil
	}
	c := *s
	if !detail {
		c.Topics, c.LaneAges, c.ParkedTopics = nil, nil, nil
	}
	c.Parked = nil
	c.Horizon.Holders = nil
	return &c
}

// FleetTargets makes fleetReader a pgboxprom.Fleet: every served target's
// relay counters, cleanup counters and last read, the targets --target-metrics chooses
// marked for series of their own.
func (r *fleetReader) FleetTargets() []pgboxprom.FleetTarget {
	stats := map[string]outbox.RelayStats{}
	for _, s := range r.fr.f.Targets() {
		stats[s.Name] = s.Stats
	}
	var cleanups map[string]*cleanup.Stats
	if r.cleaner != nil {
		cleanups = r.cleaner.targetStats()
	}
	targets := r.fr.servedPools()
	r.mu.Lock()
	reads := maps.Clone(r.last)
	r.mu.Unlock()
	out := make([]pgboxprom.FleetTarget, 0, len(targets))
	lines := make([]targetLine, 0, len(targets))
	index := map[string]int{}
	for _, t := range targets {
		ft := pgboxprom.FleetTarget{Name: t.spec.Name, Read: pgboxprom.ReadPending, Cleanup: cleanups[t.spec.Name]}
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
	chosen := map[string]bool{}
	for _, name := range r.series.choose(lines, targets) {
		out[index[name]].Series = true
		chosen[name] = true
	}
	r.mu.Lock()
	r.chosen = chosen
	r.mu.Unlock()
	return out
}

// choose returns the names of the targets that get series of their own:
// none, all, or the N worst read (as `relay status` orders them: failing
// first, then the oldest unpublished row, the larger backlog, parked rows,
// dead letters), then those not read yet, by name.
func (s targetSeries) choose(lines []targetLine, targets []targetPool) []string {
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
	for _, t := range targets { // by name: listedPools sorts them
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
func namesOf(targets []targetPool) map[string]bool {
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
// has it. It counts the passes as a Cleaner does, per target and in all
// (/metrics: pgboxprom's FleetCleaner and FleetTarget.Cleanup).
type fleetCleanup struct {
	fr    *fleetRun
	kafka *lazyKafka
	every time.Duration
	limit int
	log   *logger

	// failing is each failing target's last error: a failure is logged
	// when it changes, a recovery once.
	failing map[string]string

	mu      sync.Mutex
	total   cleanup.Stats            // every pass of this process, targets no longer served included
	targets map[string]cleanup.Stats // each served target's passes
}

func newFleetCleanup(fr *fleetRun, lk *lazyKafka) *fleetCleanup {
	o := fr.a.opts
	return &fleetCleanup{fr: fr, kafka: lk, every: o.CleanupInterval, limit: o.Targets.EachConcurrency,
		log: fr.a.log.With("component", "cleanup"), failing: map[string]string{}, targets: map[string]cleanup.Stats{}}
}

// record counts the passes of a round; errs are the passes' errors.
func (c *fleetCleanup) record(targets []targetPool, reps []cleanup.Report, errs []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, t := range targets {
		c.total.Add(reps[i], errs[i])
		s := c.targets[t.spec.Name]
		s.Topics = maps.Clone(s.Topics)
		s.Add(reps[i], errs[i])
		c.targets[t.spec.Name] = s
	}
	served := namesOf(targets)
	maps.DeleteFunc(c.targets, func(name string, _ cleanup.Stats) bool { return !served[name] })
}

// Stats makes fleetCleanup a pgboxprom.CleanerStats: the counters of every
// pass, and each topic's window and margin from the served target whose
// last pass left it the least margin (the worst), none when no served
// target's last pass knew the topic's window.
func (c *fleetCleanup) Stats() cleanup.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	worst := map[string]cleanup.TopicStats{}
	for _, s := range c.targets {
		for topic, ts := range s.Topics {
			if w, ok := worst[topic]; ts.Reason == "" && ts.Window > 0 && (!ok || ts.Margin < w.Margin) {
				worst[topic] = ts
			}
		}
	}
	s := c.total
	s.Topics = make(map[string]cleanup.TopicStats, len(c.total.Topics))
	for topic, ts := range c.total.Topics {
		if w, ok := worst[topic]; ok {
			ts.Reason, ts.Skipped, ts.Last, ts.Window, ts.OldestAge, ts.Margin = "", false, w.Last, w.Window, w.OldestAge, w.Margin
		} else {
			ts.Window, ts.Margin = 0, 0
		}
		s.Topics[topic] = ts
	}
	return s
}

// targetStats is each served target's passes.
func (c *fleetCleanup) targetStats() map[string]*cleanup.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]*cleanup.Stats, len(c.targets))
	for name, s := range c.targets {
		out[name] = &s
	}
	return out
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
	errs, passErrs := make([]error, len(targets)), make([]error, len(targets))
	reps, results := make([]cleanup.Report, len(targets)), make([]string, len(targets))
	// causes are the errors without how much a failed pass had deleted:
	// a target failing the same way is logged once.
	causes := make([]string, len(targets))
	onTargets(ctx, len(targets), 1+extra, func(i int) {
		t := targets[i].spec
		log := c.log.With("target", t.Name, "schema", t.Schema)
		passStart := time.Now()
		rep, res, err := cleanTarget(ctx, c.fr.a, t, kafka, log)
		if rep.Start.IsZero() { // failed before the pass: a pass that failed all the same
			rep.Start, rep.Duration = passStart, time.Since(passStart)
		}
		reps[i], passErrs[i] = rep, err
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
	c.record(targets, reps, passErrs)
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
