package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/outbox"
)

// NeedsOperatorRetryDefault is FleetConfig.NeedsOperatorRetry's default.
const NeedsOperatorRetryDefault = 30 * time.Second

// Target is one set of pgbox tables a Fleet serves: a schema in a database.
type Target struct {
	// Name names the target in logs and in Fleet.Targets; unique within a
	// Fleet. Defaults to Schema.
	Name string
	// Pool connects to the target's database. Give targets of one database
	// the same pool: they share its connections (its MaxConns is their
	// budget) and one LISTEN connection. Required.
	Pool *pgxpool.Pool
	// Schema is the schema holding the target's pgbox tables (see
	// Config.Schema: every statement carries it, so no target can reach
	// another's tables through a shared pool). Required.
	Schema string
}

// FleetConfig configures a Fleet.
type FleetConfig struct {
	// Relay configures every target's relay, as Config configures one
	// Relay. Pool and Schema must be unset: each target brings its own.
	// Instance names the process: each target's instance is Instance plus
	// "#" and a random suffix in that target's lease tables. Brokers and
	// Kafka are shared: one Kafka client (its broker connections and
	// metadata) serves every target, each with a producer id of its own.
	Relay Config
	// Targets are the targets served from the start; SetTargets changes
	// them while the Fleet runs.
	Targets []Target
	// NeedsOperatorRetry is how long a target whose database needs an
	// operator (pgbox's tables missing, a revoked grant, a lane count
	// other instances disagree with) waits before it is tried again; the
	// other targets run meanwhile. Defaults to [NeedsOperatorRetryDefault]
	// (30s).
	NeedsOperatorRetry time.Duration
	// MaxConnsPerTarget is the most connections of its pool one target's
	// relay holds at once, so a target whose statements hang (a lock held
	// on its tables, a slow disk) leaves the pool's other connections to
	// the other targets: never more than the pool's MaxConns minus one.
	// Give a pool MaxConns of at least MaxConnsPerTarget times the targets
	// that may hang at once, plus room for the rest. Defaults to
	// [MaxConnsPerTargetDefault] (2).
	MaxConnsPerTarget int
	// WatchRate is the most watches a second (one index range scan over a
	// target's newest ids) the Fleet's busy targets send together: each
	// watches every BusyPollInterval, or every (busy targets / WatchRate)
	// when that is longer. It bounds what steady traffic on many targets
	// costs the databases, at the price of latency when many are busy.
	// Defaults to [WatchRateDefault] (5000).
	WatchRate int
	// DormantAfter is how long a target finds no rows before it goes
	// dormant: it gives up its lanes and stops renewing leases until rows
	// come (a notification, or the Fleet's idle poll, which asks every
	// idle target of a database in one round trip each PollInterval). A
	// dormant target costs its database one question a second in a shared
	// pipeline and one write every 30 seconds or so; waking costs it a
	// heartbeat. Defaults to [DormantAfterDefault] (1 minute); negative:
	// targets never go dormant.
	DormantAfter time.Duration
}

// WatchRateDefault is FleetConfig.WatchRate's default.
const WatchRateDefault = 5000

// MaxConnsPerTargetDefault is FleetConfig.MaxConnsPerTarget's default.
const MaxConnsPerTargetDefault = 2

// TargetState is what Fleet.Targets reports of one target.
type TargetState struct {
	Name   string
	Schema string
	// State is "starting", "running" (the relay runs; Stats.Lanes says
	// whether it holds lanes yet), "needs operator" (Err names the fix;
	// tried again every NeedsOperatorRetry) or "stopped" (the Fleet stopped).
	State string
	// Err is why the target does not run, or the last failure of a running
	// one that has not succeeded since (a database down, a heartbeat
	// failing); nil when all is well.
	Err error
	// Since is when State last changed.
	Since time.Time
	// Dormant is set while the running relay, idle for DormantAfter, has
	// given up its lanes until rows come.
	Dormant bool
	// CaughtUp is set once the running relay's claim over every slot of
	// the lanes it holds has found less than a full batch: the rows its
	// outbox held when it started are claimed. A relay that holds no lane
	// (other instances hold them all) is never caught up.
	CaughtUp bool
	Stats    outbox.RelayStats
}

// Fleet runs one relay per target in one process: many schemas in one
// database, and many databases, served by one deployment with the same
// guarantees as a Relay each. Targets of one pool share its connections
// and one LISTEN connection; all targets share one Kafka client. A
// target that fails (its database down or slow, its tables missing) is
// reported and retried on its own; the others go on.
//
// A relay watches its table every BusyPollInterval while rows come
// (writers notify nobody then: a notifying commit serializes with every
// other notifying commit of the cluster, its WAL flush included); a
// hundred busy targets watching every 2 ms would swamp the database. A
// Fleet's relays watch together at most WatchRate times a second: with
// few busy targets each watches every BusyPollInterval, with many each
// less often. A target asleep (nothing found for two seconds) watches
// nothing: writers with outbox.Config.Notify wake it through the Fleet's
// LISTEN connection, others' rows are found by the Fleet's idle poll,
// which asks every idle target of a pool whether it holds rows in one
// round trip every PollInterval. A target idle for DormantAfter also
// gives up its lanes and stops renewing leases until rows come, so a
// thousand idle schemas of one database cost it about one round trip a
// second (dormant.go).
type Fleet struct {
	cfg FleetConfig
	log *slog.Logger
	kc  *kafkaClient
	// watchers counts the relays watching their tables (Relay.watchEvery).
	watchers atomic.Int64

	mu      sync.Mutex
	ctx     context.Context // Run's; nil while not running
	targets map[string]*fleetTarget
	leaving map[*fleetTarget]bool       // removed, still stopping: Stats counts them
	gone    outbox.RelayStats           // the counters of targets removed
	pools   map[*pgxpool.Pool]poolLoops // each pool's LISTEN connection, idle poll and busy targets' watch
	homes   map[*pgxpool.Pool]*homes    // each pool's home connections (homes.go); nil: the pool has none
	wg      sync.WaitGroup

	emptySlow time.Duration // tests: each relay's emptySlow (0: emptySlow)
	pollErr   func() error  // tests: fails the idle poll's rounds that ask something when it returns an error
}

// poolLoops are a pool's LISTEN connection, idle poll and busy targets'
// watch (listenPools).
type poolLoops struct {
	cancel context.CancelFunc
	kick   chan struct{} // a target started: ask it now (fleetIdle.kick)
	watch  chan struct{} // a target started watching (sharedWatch.kick)
	rows   *startRows    // which targets start awake (startrows.go)
	starts startGate     // the targets preparing their lanes at start (startrows.go)
}

type fleetTarget struct {
	t      Target
	cancel context.CancelFunc
	done   chan struct{}

	// Guarded by the Fleet's mu.
	r       *Relay
	retired outbox.RelayStats // the counters of its relays that stopped
	state   string
	err     error
	since   time.Time
}

// NewFleet validates cfg and returns a Fleet. It does no I/O.
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if cfg.Relay.Pool != nil || cfg.Relay.Schema != "" {
		return nil, errors.New("relay: FleetConfig.Relay.Pool and .Schema must be unset: each Target brings its pool and schema")
	}
	if cfg.NeedsOperatorRetry < 0 {
		return nil, fmt.Errorf("relay: FleetConfig.NeedsOperatorRetry is %s: use a positive duration, or 0 for the default", cfg.NeedsOperatorRetry)
	}
	cfg.NeedsOperatorRetry = cmp.Or(cfg.NeedsOperatorRetry, NeedsOperatorRetryDefault)
	if cfg.MaxConnsPerTarget < 0 {
		return nil, fmt.Errorf("relay: FleetConfig.MaxConnsPerTarget is %d: use a positive number, or 0 for the default (%d)", cfg.MaxConnsPerTarget, MaxConnsPerTargetDefault)
	}
	cfg.MaxConnsPerTarget = cmp.Or(cfg.MaxConnsPerTarget, MaxConnsPerTargetDefault)
	if cfg.WatchRate < 0 {
		return nil, fmt.Errorf("relay: FleetConfig.WatchRate is %d: use a positive number of watches a second, or 0 for the default (%d)", cfg.WatchRate, WatchRateDefault)
	}
	cfg.WatchRate = cmp.Or(cfg.WatchRate, WatchRateDefault)
	cfg.DormantAfter = cmp.Or(cfg.DormantAfter, DormantAfterDefault)
	// The template passes New's checks with any pool; New copies the Kafka
	// config and sets its partitioner, which the shared client then uses.
	probe := cfg.Relay
	probe.Pool = &pgxpool.Pool{}
	r, err := New(probe)
	if err != nil {
		return nil, err
	}
	cfg.Relay = r.cfg
	cfg.Relay.Pool = nil
	f := &Fleet{cfg: cfg, log: cfg.Relay.Logger, targets: map[string]*fleetTarget{}, leaving: map[*fleetTarget]bool{},
		pools: map[*pgxpool.Pool]poolLoops{}, homes: map[*pgxpool.Pool]*homes{}}
	f.kc = &kafkaClient{brokers: cfg.Relay.Brokers, conf: cfg.Relay.Kafka}
	ts, err := checkTargets(cfg.Targets)
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		f.targets[t.Name] = &fleetTarget{t: t, state: "starting", since: time.Now()}
	}
	return f, nil
}

// checkTargets fills in default names and refuses a target without a pool
// or schema, a bad schema, or a name used twice; the error names the
// target.
func checkTargets(ts []Target) ([]Target, error) {
	out := make([]Target, 0, len(ts))
	seen := map[string]bool{}
	for i, t := range ts {
		t.Name = cmp.Or(t.Name, t.Schema)
		switch {
		case t.Schema == "":
			return nil, fmt.Errorf("relay: target %d (%q): Schema is empty: name the schema holding its pgbox tables", i, t.Name)
		case t.Pool == nil:
			return nil, fmt.Errorf("relay: target %q: Pool is nil", t.Name)
		case seen[t.Name]:
			return nil, fmt.Errorf("relay: target name %q is used twice: names must be unique", t.Name)
		}
		if err := validSchema(t.Schema); err != nil {
			return nil, fmt.Errorf("target %q: %w", t.Name, err)
		}
		seen[t.Name] = true
		out = append(out, t)
	}
	return out, nil
}

// SetTargets makes ts the targets served. A new target starts; a target
// no longer listed (or listed with another pool or schema) stops as a
// Relay stops: its in-flight batch is finished or released, its lanes are
// given up, and its unsent rows stay for whoever serves it next. SetTargets
// returns once the stopped targets have stopped. Invalid targets are
// refused with an error naming the target, and nothing changes.
func (f *Fleet) SetTargets(ts []Target) error {
	ts, err := checkTargets(ts)
	if err != nil {
		return err
	}
	f.mu.Lock()
	want := map[string]Target{}
	for _, t := range ts {
		want[t.Name] = t
	}
	var stopping []*fleetTarget
	for name, ft := range f.targets {
		if t, ok := want[name]; !ok || t != ft.t {
			delete(f.targets, name)
			f.leaving[ft] = true
			stopping = append(stopping, ft)
		}
	}
	for _, t := range ts {
		if _, ok := f.targets[t.Name]; ok {
			continue
		}
		ft := &fleetTarget{t: t, state: "starting", since: time.Now()}
		f.targets[t.Name] = ft
		if f.ctx != nil {
			f.start(ft)
		}
	}
	if f.ctx != nil {
		f.listenPools()
	}
	f.mu.Unlock()
	for _, ft := range stopping {
		if ft.cancel != nil { // started
			ft.cancel()
			<-ft.done
		}
		f.mu.Lock()
		delete(f.leaving, ft)
		addCounters(&f.gone, ft.retired)
		f.mu.Unlock()
	}
	return nil
}

// Targets reports every target's state, sorted by name.
func (f *Fleet) Targets() []TargetState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.targetStates()
}

// targetStates is Targets with f.mu held.
func (f *Fleet) targetStates() []TargetState {
	out := make([]TargetState, 0, len(f.targets))
	for _, ft := range f.targets {
		out = append(out, ft.report())
	}
	slices.SortFunc(out, func(a, b TargetState) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// TargetCounts returns how many targets are in each State ("starting",
// "running", "needs operator", "stopped"); a state no target is in is
// absent. pgboxprom.Config.Targets reads it: a gauge per state, not per
// target.
func (f *Fleet) TargetCounts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := map[string]int{}
	for _, ft := range f.targets {
		n[ft.state]++
	}
	return n
}

// Stats returns the counters summed over the targets. The counters
// (Published, Retried, Parked, Batches, BatchLatencyTotal, RowsBelowFloor)
// include those of targets removed or restarted since Run began, so they
// never go back; the gauges (Backlog, Lanes, Instances) are the current
// targets' sums, BatchLatencyMax the largest, BatchLatencyLast and
// FloorOff one target's that has one.
func (f *Fleet) Stats() outbox.RelayStats {
	f.mu.Lock()
	defer f.mu.Unlock() // counters move (relay to target, target to gone) under f.mu: none counted twice or missed
	sum := f.gone
	states := f.targetStates()
	for ft := range f.leaving {
		states = append(states, ft.report())
	}
	for _, s := range states {
		addCounters(&sum, s.Stats)
		st := s.Stats
		sum.BatchLatencyLast = cmp.Or(st.BatchLatencyLast, sum.BatchLatencyLast)
		sum.Backlog += st.Backlog
		sum.Lanes += st.Lanes
		sum.Instances += st.Instances
		sum.FloorOff = cmp.Or(st.FloorOff, sum.FloorOff)
	}
	return sum
}

// addCounters adds st's counters (the values that only grow) to sum.
func addCounters(sum *outbox.RelayStats, st outbox.RelayStats) {
	sum.Published += st.Published
	sum.Retried += st.Retried
	sum.Parked += st.Parked
	sum.Batches += st.Batches
	sum.BatchLatencyTotal += st.BatchLatencyTotal
	sum.BatchLatencyMax = max(sum.BatchLatencyMax, st.BatchLatencyMax)
	sum.RowsBelowFloor += st.RowsBelowFloor
}

// Run serves the targets until ctx is canceled, then stops every target as
// Relay.Run stops and returns nil. A target's failure is never returned:
// it is logged, reported by Targets and retried.
func (f *Fleet) Run(ctx context.Context) error {
	f.mu.Lock()
	if f.ctx != nil {
		f.mu.Unlock()
		return ErrRunning
	}
	f.ctx = ctx
	for _, ft := range f.targets {
		f.start(ft)
	}
	f.listenPools()
	f.mu.Unlock()
	f.wg.Go(func() { f.homesLoop(ctx) })
	f.log.InfoContext(ctx, "relay fleet started", "targets", len(f.Targets()), "brokers", f.cfg.Relay.Brokers)

	<-ctx.Done()
	f.mu.Lock()
	f.ctx = nil // SetTargets from now on starts nothing
	fts := make([]*fleetTarget, 0, len(f.targets))
	for _, ft := range f.targets {
		fts = append(fts, ft)
		ft.cancel()
	}
	for _, l := range f.pools {
		l.cancel()
	}
	clear(f.pools)
	f.mu.Unlock()
	for _, ft := range fts {
		<-ft.done
	}
	f.wg.Wait()
	// Close the shared client in the background, as a relay closes its
	// own: sarama's Close waits for its metadata refresh, which a broker
	// that answers nothing holds up to Net.ReadTimeout (30 s), and Run
	// returns within StopTimeout whatever the broker does.
	go f.kc.close()
	f.log.InfoContext(context.WithoutCancel(ctx), "relay fleet stopped")
	return nil
}

// start runs ft until its cancel is called. f.mu is held.
func (f *Fleet) start(ft *fleetTarget) {
	ctx, cancel := context.WithCancel(f.ctx)
	ft.cancel, ft.done = cancel, make(chan struct{})
	go func() {
		defer close(ft.done)
		f.serve(ctx, ft)
	}()
}

// serve runs ft's relay, again after NeedsOperatorRetry when it stops
// because its database needs an operator, until ctx ends.
func (f *Fleet) serve(ctx context.Context, ft *fleetTarget) {
	cfg := f.cfg.Relay
	cfg.Pool, cfg.Schema = ft.t.Pool, ft.t.Schema
	cfg.Logger = f.log.With("target", ft.t.Name)
	var said string // the last needs-operator error logged
	for ctx.Err() == nil {
		r, err := New(cfg)
		if err != nil { // checked by NewFleet and SetTargets; not expected
			f.set(ft, "needs operator", err, nil)
			return
		}
		r.kc, r.fleetListens, r.fleetLogs = f.kc, !cfg.NoListen, true
		r.watchers, r.watchRate = &f.watchers, f.cfg.WatchRate
		r.idleState.polled, r.idleState.after = r.fleetListens, f.cfg.DormantAfter
		// listenPools started the pool's poll under the f.mu that started ft,
		// or stopped it (the target is leaving): nil then, never sent.
		f.mu.Lock()
		loops := f.pools[ft.t.Pool]
		r.idleState.kick = loops.kick
		if r.db.homes = f.homesOf(ft.t.Pool); r.db.homes != nil {
			r.db.home = r.db.homes.assign()
		}
		if loops.watch != nil {
			r.shared = &sharedWatch{kick: loops.watch}
		}
		f.mu.Unlock()
		r.idleState.awake = r.idleState.polled && loops.rows.awake(ctx, ft.t.Pool, ft.t.Schema)
		r.idleState.fresh.Store(true)
		r.emptySlow = f.emptySlow
		r.db.slots = make(chan struct{}, max(1, min(f.cfg.MaxConnsPerTarget, int(ft.t.Pool.Config().MaxConns)-1)))
		f.set(ft, "running", nil, r)
		if !r.idleState.awake {
			r.laned = loops.starts.enter(ctx)
		}
		started := time.Now()
		err = r.Run(ctx)
		if time.Since(started) > time.Minute {
			said = "" // it ran: a failure now is a new one
		}
		state := "stopped"
		if err != nil {
			state = "needs operator"
		}
		f.set(ft, state, err, nil) // its counters move to the target's in the same step
		if err == nil || ctx.Err() != nil {
			return
		}
		if err.Error() != said { // once per change, not every retry
			said = err.Error()
			cfg.Logger.ErrorContext(ctx, "target stopped: its database needs an operator; the other targets go on", "fix", pgerr.Fix(err),
				"retry_every", f.cfg.NeedsOperatorRetry, "error", err)
		}
		if !backoff.Sleep(ctx, f.cfg.NeedsOperatorRetry) {
			return
		}
	}
}

// report is ft's state: its counters are its stopped relays' plus the
// running one's. f.mu is held.
func (ft *fleetTarget) report() TargetState {
	s := TargetState{Name: ft.t.Name, Schema: ft.t.Schema, State: ft.state, Err: ft.err, Since: ft.since}
	if ft.r != nil {
		s.Stats, s.Dormant, s.CaughtUp = ft.r.Stats(), ft.r.Dormant(), ft.r.caughtUp.Load()
		if s.Err == nil && s.State == "running" {
			s.Err = ft.r.lastErr()
		}
	}
	addCounters(&s.Stats, ft.retired)
	return s
}

// set records ft's state and its running relay; the counters of the relay
// it replaces move to ft.retired at once, so Stats counts them once.
func (f *Fleet) set(ft *fleetTarget, state string, err error, r *Relay) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ft.r != nil && ft.r != r {
		addCounters(&ft.retired, ft.r.Stats())
	}
	if state != ft.state {
		ft.since = time.Now()
	}
	ft.state, ft.err, ft.r = state, err, r
}

// relays returns the running relays of pool's targets, all of them when
// schema is "", else those of that schema. f.mu is held.
func (f *Fleet) relays(pool *pgxpool.Pool, schema string) []*Relay {
	var out []*Relay
	for _, ft := range f.targets {
		if ft.t.Pool != pool || (schema != "" && ft.t.Schema != schema) {
			continue
		}
		if ft.r != nil {
			out = append(out, ft.r)
		}
	}
	return out
}

// listenPools starts a LISTEN connection and the idle poll (pollLoop) for
// every pool that has targets and none yet, and stops those of pools that
// have none left. f.mu is held.
func (f *Fleet) listenPools() {
	if f.cfg.Relay.NoListen {
		return
	}
	pools := map[*pgxpool.Pool]bool{}
	for _, ft := range f.targets {
		pools[ft.t.Pool] = true
	}
	for p, l := range f.pools {
		if !pools[p] {
			l.cancel()
			delete(f.pools, p)
		}
	}
	for p := range pools {
		if _, ok := f.pools[p]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(f.ctx)
		l := poolLoops{cancel: cancel, kick: make(chan struct{}, 1), watch: make(chan struct{}, 1), rows: &startRows{},
			starts: make(startGate, max(1, p.Config().MaxConns/4))}
		f.pools[p] = l
		f.wg.Go(func() { f.listenLoop(ctx, p) })
		f.wg.Go(func() { f.pollLoop(ctx, p, l.kick) })
		f.wg.Go(func() { f.watchLoop(ctx, p, l.watch) })
	}
}

// listenLoop holds one connection to pool's database LISTENing on Channel
// and wakes the target each notification names (the writer's schema), or
// every target of the pool when it names none (a writer from before the
// payload named its schema, a SQL writer's pg_notify with an empty payload).
func (f *Fleet) listenLoop(ctx context.Context, pool *pgxpool.Pool) {
	b := backoff.Backoff{Base: backoffMin, Limit: f.cfg.Relay.MaxBackoff}
	for ctx.Err() == nil {
		err := f.listen(ctx, pool)
		if ctx.Err() != nil {
			return
		}
		d := b.Next()
		f.log.WarnContext(ctx, "listen failed, polling meanwhile", "database", pool.Config().ConnConfig.Database, "error", err, "backoff", d)
		backoff.Sleep(ctx, d)
	}
}

func (f *Fleet) listen(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{f.cfg.Relay.Channel}.Sanitize()); err != nil {
		return err
	}
	f.wake(pool, "", "") // notifications sent while nobody listened are lost (the idle poll asks the idle targets)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		schema, _ := splitPayload(n.Payload)
		f.wake(pool, schema, n.Payload)
	}
}

// wake passes a notification to the relays it names (all slots when
// payload is "").
func (f *Fleet) wake(pool *pgxpool.Pool, schema, payload string) {
	f.mu.Lock()
	// A schema no target has wakes none: another process may serve it (a
	// list split over processes), or the writer's current_schema() is not
	// where its rows went; the idle poll finds such rows within
	// PollInterval. A notification naming no schema wakes the targets
	// that are not idle: the idle ones (a thousand, dormant, or starting
	// dormant) are asked by the idle poll within PollInterval, which wakes
	// those with rows. The LISTEN connection's start is such a wake: a
	// thousand targets starting at once must not all take their lanes.
	rs := f.relays(pool, schema)
	f.mu.Unlock()
	for _, r := range rs {
		if schema == "" && (r.idleState.idle.Load() || r.idleState.wanted.Load()) {
			continue
		}
		if payload == "" {
			r.markAllDirty()
		} else {
			r.markDirty(payload)
		}
		r.wakeUp()
	}
}
