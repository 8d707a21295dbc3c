package relay

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/outbox"
)

var (
	// ErrLaneCountMismatch is returned by Run when live relay instances use a
	// different Config.Lanes than this one.
	ErrLaneCountMismatch = errors.New("relay: lane count differs from the running instances'")
	// ErrRunning is returned by Run when the Relay is already running.
	ErrRunning = errors.New("relay: Run called while already running")
	// ErrNeedsOperator is in the error Run returns when the database needs
	// a person: pgbox's tables missing (migrations not run), a revoked
	// grant, failed authentication. The error names the fix. It is the same
	// value as inbox.ErrNeedsOperator and cleanup.ErrNeedsOperator.
	ErrNeedsOperator = pgerr.ErrNeedsOperator
)

// Relay publishes committed outbox rows to Kafka. Make one with New and call
// Run; several instances (processes) may run against one database.
type Relay struct {
	cfg Config
	db  *db
	// Set by a Fleet: kc is the Kafka client its relays share (nil: the
	// relay connects its own), fleetListens that the Fleet's one LISTEN
	// connection per pool wakes this relay, watchers counts the Fleet's
	// relays watching their tables (watchEvery), watchRate is
	// FleetConfig.WatchRate.
	kc           *kafkaClient
	fleetListens bool
	fleetLogs    bool // the Fleet logs why the relay stopped, once per change
	watchers     *atomic.Int64
	watchRate    int
	shared       *sharedWatch // the pool's watch asks for it (nil: it watches itself)
	askAlone     atomic.Bool  // its last question of the Fleet's failed, was late or slow: asked in a group of its own (questions.go)
	askTook      atomic.Int64 // the server's time on its last answered question of the Fleet's, in ns (0: none yet)
	laned        func()       // called once its lanes are prepared at start (nil: nothing to call)
	// emptyPausedUntil: nothingToClaim does not ask until then; owned by
	// the work loop.
	emptyPausedUntil time.Time
	emptySlow        time.Duration // tests: emptySlow when 0
	idleState        fleetIdle     // a Fleet's idle poll and dormancy (dormant.go)
	// failed is the last database failure a retry or heartbeat met, until
	// a heartbeat succeeds (Fleet.Targets reports it).
	failed  atomic.Pointer[error]
	id      string // Config.Instance + "#" + random: the owner name in the lease tables
	log     *slog.Logger
	running atomic.Bool
	// caughtUp is set once a claim over every slot of the lanes the relay
	// holds (at least one) has found less than a full batch (no slot
	// capped): the rows the outbox held when the relay started are
	// claimed (Fleet.Targets reports it).
	caughtUp atomic.Bool
	wake     chan struct{}
	beat     chan struct{} // an early heartbeat (Kafka reached)
	count    chan struct{} // a backlog count is due (countLoop)
	fin      *finishJob    // background delete; owned by the worker goroutine
	floors   floorState    // where each slot's claim starts; owned by the worker goroutine
	beats    int           // heartbeats; owned by the heartbeat goroutine

	// leaseUntil is when this instance's leases run out unless renewed: the
	// start of the last successful heartbeat plus LeaseTTL, as a duration
	// since t0 (monotonic clock, so a paused process sees the time pass).
	t0         time.Time
	leaseUntil atomic.Int64
	// leaseGen counts lease gaps (heartbeats that came after leaseUntil had
	// passed) and hand-overs (heartbeats that released lanes). Rows claimed in
	// an earlier generation may belong to another instance by now and are
	// not sent.
	leaseGen atomic.Int64

	dirtyMu  sync.Mutex
	dirty    slotSet // slots notifications named since the last pass
	dirtyAll bool    // a notification named no slots (or listening restarted)

	// Kafka's state as the heartbeat records it: kafkaReady once the
	// producer connected (only then does the instance take lanes),
	// kafkaDownAt the start of the current outage (since t0; 0: none),
	// kafkaAlerted once the outage was logged at ERROR.
	kafkaReady   atomic.Bool
	kafkaDownAt  atomic.Int64
	kafkaAlerted atomic.Bool

	published, retried, parked, batches atomic.Uint64
	failures                            atomic.Uint64          // permanent send failures since the last summary
	rowsBelowFloor                      atomic.Uint64          // rows sweeps found below their slot's floor
	floorOff                            atomic.Pointer[string] // why floors are off (floorState.off), for Stats
	looks                               chan lookRequest       // the work loop's floors for the sweep's look (sweep.go)
	sweepWanted                         atomic.Bool            // a look found rows below a floor: the next full claim sweeps
	pubMu                               sync.Mutex
	pubByTopic                          map[string]uint64 // published per topic since the last history sample
	hist                                historyState      // where the next history sample counts from; countLoop's
	summaryAt                           time.Time         // the last summary; owned by the heartbeat goroutine
	summaryParked                       uint64            // parked at the last summary; likewise
	latLast, latMax, latTotal           atomic.Int64
	backlog                             atomic.Int64
	lanes, instances                    atomic.Int64
}

// New validates cfg, fills in defaults and returns a Relay. It does no I/O.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	k := *cfg.Kafka // shallow copy: the caller's config stays untouched
	k.Producer.Partitioner = cfg.Partitioner
	cfg.Kafka = &k
	// The lease tables know this Relay by its name plus a random suffix, so two
	// processes configured with the same name (a copy-pasted setting, a pod
	// restarted before its old lease expired) are still two instances and
	// never share a lane.
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	id := cfg.Instance + "#" + hex.EncodeToString(b)
	return &Relay{cfg: cfg, db: newDB(cfg.Pool, cfg.Schema), id: id, log: cfg.Logger.With("instance", id), wake: make(chan struct{}, 1),
		beat: make(chan struct{}, 1), count: make(chan struct{}, 1), looks: make(chan lookRequest, 1), t0: time.Now(), summaryAt: time.Now()}, nil
}

// lastErr is the last database failure since the last good heartbeat.
func (r *Relay) lastErr() error {
	if p := r.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Instance returns the name this relay registers under in the lease tables:
// Config.Instance plus "#" and a random suffix unique to this Relay.
func (r *Relay) Instance() string { return r.id }

// Stats returns a snapshot of the counters (a metrics exporter reads them:
// pgboxprom.Config.Relay).
func (r *Relay) Stats() outbox.RelayStats {
	return outbox.RelayStats{
		Published:         r.published.Load(),
		Retried:           r.retried.Load(),
		Parked:            r.parked.Load(),
		Batches:           r.batches.Load(),
		BatchLatencyLast:  time.Duration(r.latLast.Load()),
		BatchLatencyMax:   time.Duration(r.latMax.Load()),
		BatchLatencyTotal: time.Duration(r.latTotal.Load()),
		Backlog:           r.backlog.Load(),
		Lanes:             int(r.lanes.Load()),
		Instances:         int(r.instances.Load()),
		RowsBelowFloor:    r.rowsBelowFloor.Load(),
		FloorOff:          deref(r.floorOff.Load()),
	}
}

// Run publishes until ctx is canceled, then finishes or releases the
// in-flight batch (waiting at most StopTimeout for a send), gives up its
// lanes and returns nil. It returns an error when it cannot start
// (ErrLaneCountMismatch, ErrRunning), when another relay reshaped the lanes
// to another count while it ran holding none (ErrLaneCountMismatch: a
// dormant Fleet target, an instance paused past its lease), and, at start
// or while running, when
// the database fails in a way retrying cannot fix: an error wrapping
// ErrNeedsOperator that names the fix (missing pgbox tables, a revoked grant),
// logged at ERROR. Other database and broker failures are logged and retried
// with backoff, never returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)

	err := retry(ctx, r, "prepare lanes", r.ensureLanes)
	if r.laned != nil {
		r.laned()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	// The instance registers (heartbeats) before Kafka answers, so status
	// shows it running; it takes no lanes until it has reached Kafka.
	r.kafkaReady.Store(false)
	r.kafkaDown()
	// A Fleet's target starts dormant: it registers as such and takes its
	// lanes when the Fleet's idle poll or a notification finds rows
	// (dormant.go), so a thousand targets starting at once do not all
	// heartbeat, count their backlogs and claim; unless the statistics
	// show rows in its outbox (startrows.go).
	r.idleState.wanted.Store(r.idleState.polled && r.idleState.after >= 0 && !r.idleState.awake)
	r.idleState.dormant.Store(false)
	runCtx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.heartbeatLoop(runCtx, cancel) })
	wg.Go(func() { r.countLoop(runCtx) })
	var prod *producer
	err = retry(runCtx, r, "connect to Kafka", func(ctx context.Context) error {
		p, err := newProducer(ctx, r.cfg.Brokers, r.cfg.Kafka, r.kc)
		prod = p
		return err
	})
	if err == nil { // else ctx ended the retries, or the heartbeat stopped Run
		r.kafkaUp(runCtx)
		r.kafkaReady.Store(true)
		r.beatNow()
		r.log.InfoContext(ctx, "relay started", "lanes", r.cfg.Lanes, "brokers", r.cfg.Brokers)
		if !r.cfg.NoListen && !r.fleetListens {
			wg.Go(func() { r.listenLoop(runCtx, cancel) })
		}
		wg.Go(func() { r.sweepLoop(runCtx) })
		r.workLoop(runCtx, prod, cancel)
	}
	fatal := context.Cause(runCtx)
	cancel(nil)
	wg.Wait()
	if !errors.Is(fatal, ErrNeedsOperator) && !errors.Is(fatal, ErrLaneCountMismatch) {
		fatal = nil
	}

	stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
	defer stopCancel()
	if _, err := r.db.exec(stopCtx, releaseSQL, r.id); err != nil {
		r.log.WarnContext(stopCtx, "release lanes", "error", err)
	}
	r.lanes.Store(0)
	if prod != nil {
		// Close the producer in the background: records given up on at
		// stop may still be retrying against an unreachable broker.
		go prod.close()
	}
	if fatal != nil {
		if !r.fleetLogs {
			r.log.ErrorContext(stopCtx, "relay stopped: the database needs an operator", "fix", pgerr.Fix(fatal), "error", fatal)
		}
		return fatal
	}
	r.log.InfoContext(stopCtx, "relay stopped")
	return nil
}

// kafkaDown records that Kafka is unreachable now (the outage starts at
// the first such call).
func (r *Relay) kafkaDown() {
	r.kafkaDownAt.CompareAndSwap(0, int64(time.Since(r.t0)))
}

// alertOutage logs at ERROR, once per outage, when Kafka has been
// unreachable for KafkaOutageAlert. The heartbeat calls it, so an outage is
// reported on time even while a connection attempt hangs.
func (r *Relay) alertOutage(ctx context.Context) {
	at := r.kafkaDownAt.Load()
	if at == 0 {
		return
	}
	since := time.Since(r.t0) - time.Duration(at)
	if since >= r.cfg.KafkaOutageAlert && !r.kafkaAlerted.Swap(true) {
		r.log.ErrorContext(ctx, "Kafka unreachable", "for", since.Round(time.Second), "brokers", r.cfg.Brokers,
			"alert_after", r.cfg.KafkaOutageAlert)
	}
}

// kafkaUp records that Kafka answers.
func (r *Relay) kafkaUp(ctx context.Context) {
	if at := r.kafkaDownAt.Swap(0); at != 0 && r.kafkaAlerted.Swap(false) {
		r.log.InfoContext(ctx, "Kafka reachable again", "after", (time.Since(r.t0) - time.Duration(at)).Round(time.Second))
	}
}

// beatNow asks the heartbeat loop for a heartbeat at once.
func (r *Relay) beatNow() {
	select {
	case r.beat <- struct{}{}:
	default:
	}
}

// stopOn ends Run with err when retrying cannot fix it, and reports whether
// it did.
func (r *Relay) stopOn(what string, err error, stop context.CancelCauseFunc) bool {
	switch {
	case errors.Is(err, ErrLaneCountMismatch): // the lanes reshaped under it (heartbeat)
		stop(fmt.Errorf("relay: %s: %w", what, err))
	case pgerr.NeedsOperator(err):
		stop(fmt.Errorf("relay: %s: %w", what, pgerr.WithFix(err)))
	default:
		return false
	}
	return true
}

// retry runs fn until it succeeds, returns ErrLaneCountMismatch, or ctx ends.
func retry(ctx context.Context, r *Relay, what string, fn func(context.Context) error) error {
	b := backoff.Backoff{Base: backoffMin, Limit: r.cfg.MaxBackoff}
	for {
		err := fn(ctx)
		if err == nil || errors.Is(err, ErrLaneCountMismatch) {
			return err
		}
		if pgerr.NeedsOperator(err) {
			err = fmt.Errorf("relay: %s: %w", what, pgerr.WithFix(err))
			if !r.fleetLogs {
				r.log.ErrorContext(ctx, "relay cannot start: the database needs an operator", "fix", pgerr.Fix(err), "error", err)
			}
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.failed.Store(&err)
		d := b.Next()
		r.log.WarnContext(ctx, what+" failed, retrying", "error", err, "backoff", d)
		if !backoff.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

// ensureLanes makes pgbox_relay_lanes hold exactly Lanes rows, reshaping it
// only when no other live instance holds a lane.
func (r *Relay) ensureLanes(ctx context.Context) error {
	return r.db.begin(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockLanesSQL); err != nil {
			return err
		}
		var count, minLanes, maxLanes, liveOthers int
		if err := tx.QueryRow(ctx, lanesStateSQL, r.id).Scan(&count, &minLanes, &maxLanes, &liveOthers); err != nil {
			return err
		}
		if count == r.cfg.Lanes && minLanes == r.cfg.Lanes && maxLanes == r.cfg.Lanes {
			return nil
		}
		if count > 0 && liveOthers > 0 {
			return fmt.Errorf("%w: live instances use %d lanes, Config.Lanes is %d: give every instance the same Lanes, or stop the others first",
				ErrLaneCountMismatch, maxLanes, r.cfg.Lanes)
		}
		if _, err := tx.Exec(ctx, resetLanesSQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, createLanesSQL, r.cfg.Lanes); err != nil {
			return err
		}
		if count > 0 {
			r.log.InfoContext(ctx, "lane count changed", "from", maxLanes, "to", r.cfg.Lanes)
		}
		return nil
	})
}

func (r *Relay) heartbeatLoop(ctx context.Context, stop context.CancelCauseFunc) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		if r.idleState.wanted.Load() {
			r.dormantBeat(ctx)
		} else {
			if err := r.heartbeat(ctx); err != nil && r.stopOn("heartbeat", err, stop) {
				return
			}
			r.summarize(ctx)
		}
		r.alertOutage(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.beat:
		}
	}
}

// beatContext bounds a lease statement (a heartbeat, dormantSQL): one
// slower than the lease is worthless, so it may not hang; nor is it cut
// off when Run stops, since the server could commit it after the release
// that follows (releaseSQL), leaving the instance row behind: Run waits
// for it instead (at most LeaseTTL/2). A Fleet's homes give way to it
// once it has waited half of what is left of that, or homeWait if less
// (leaseStatement, waitBefore).
func (r *Relay) beatContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(leaseStatement(context.WithoutCancel(ctx)), r.cfg.LeaseTTL/2)
}

func (r *Relay) heartbeat(ctx context.Context) error {
	hctx, cancel := r.beatContext(ctx)
	defer cancel()
	start := time.Now()
	var held, released, live, foreign, total int
	err := r.db.queryRow(hctx, heartbeatSQL, []any{r.id, r.cfg.LeaseTTL, r.cfg.Lanes, r.cfg.HeartbeatInterval,
		r.kafkaReady.Load(), r.kafkaDownAt.Load() != 0}, &held, &released, &live, &foreign, &total)
	if err != nil {
		if ctx.Err() == nil && !pgerr.NeedsOperator(err) {
			r.failed.Store(&err)
			r.log.WarnContext(ctx, "heartbeat failed", "error", err)
		}
		return err
	}
	if total == 0 { // recreated or truncated under the relay
		if err := r.ensureLanes(hctx); err != nil {
			return err
		}
		r.log.WarnContext(ctx, "pgbox_relay_lanes was empty (its schema recreated, or the table truncated): lanes created again", "lanes", r.cfg.Lanes)
		r.beatNow() // take them now
	}
	if foreign > 0 {
		return fmt.Errorf("%w: %d lanes of pgbox_relay_lanes have another lane count than Config.Lanes (%d): another relay reshaped them while this one held none; give every instance the same Lanes",
			ErrLaneCountMismatch, foreign, r.cfg.Lanes)
	}
	r.failed.Store(nil)
	r.idleState.dormant.Store(false)
	lapsed := time.Since(r.t0) >= time.Duration(r.leaseUntil.Load())
	if released > 0 || lapsed {
		// Lanes were handed over, or the leases may have lapsed before this
		// renewal: rows claimed so far are not sent any more (they stay for
		// whoever owns their lane; the in-flight ones finish).
		r.leaseGen.Add(1)
	}
	r.leaseUntil.Store(int64(start.Sub(r.t0) + r.cfg.LeaseTTL))
	prev := r.lanes.Swap(int64(held))
	if prev != int64(held) {
		r.log.InfoContext(ctx, "lanes changed", "lanes_held", held, "instances", live)
	}
	if int64(held) > prev || (lapsed && held > 0) {
		// New lanes, or lanes under a lease confirmed again (the work loop
		// claimed nothing without one: takeBatch): claim now.
		r.markAllDirty()
		r.wakeUp()
	}
	r.instances.Store(int64(live))
	if r.beats++; r.beats%backlogEvery == 1 {
		select {
		case r.count <- struct{}{}:
		default: // the previous count is still waiting to run
		}
	}
	return nil
}

// backlogEvery: the backlog is counted at the first heartbeat and every
// backlogEvery-th after it (every 10 s by default).
const backlogEvery = 5

// countLoop runs the backlog counts the heartbeat asks for until ctx ends,
// on a goroutine of its own: a count (up to backlogCap rows, and at start
// the search for where each slot's rows begin: history.go) takes far
// longer than a heartbeat, and neither a lease renewal nor the heartbeat
// that takes the lanes once Kafka answers waits for it.
func (r *Relay) countLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.count:
			r.countBacklog(ctx)
		}
	}
}

// countBacklog refreshes Stats.Backlog and writes the console's history
// sample (recordHistory).
func (r *Relay) countBacklog(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.HeartbeatInterval)
	defer cancel()
	published := r.takePublished()
	backlog, err := r.recordHistory(cctx, published)
	if err != nil {
		r.countPublished(published) // for the next sample
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "counting the backlog failed", "error", err)
		}
		return
	}
	r.backlog.Store(backlog)
}

// leaseHeld reports whether rows claimed in lease generation gen may still
// be sent: the leases have not lapsed since. A paused or cut-off instance
// stops sending before another may take its lanes over.
func (r *Relay) leaseHeld(gen int64) bool {
	return r.leaseGen.Load() == gen && time.Since(r.t0) < time.Duration(r.leaseUntil.Load())
}

func (r *Relay) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// listenLoop holds a dedicated connection LISTENing on Channel and turns
// any number of notifications into at most one pending wake-up.
func (r *Relay) listenLoop(ctx context.Context, stop context.CancelCauseFunc) {
	b := backoff.Backoff{Base: backoffMin, Limit: r.cfg.MaxBackoff}
	for ctx.Err() == nil {
		err := r.listen(ctx)
		if ctx.Err() != nil || r.stopOn("listen", err, stop) {
			return
		}
		d := b.Next()
		r.log.WarnContext(ctx, "listen failed, polling meanwhile", "error", err, "backoff", d)
		backoff.Sleep(ctx, d)
	}
}

func (r *Relay) listen(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, r.db.listenConfig())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.Channel}.Sanitize()); err != nil {
		return err
	}
	r.markAllDirty() // notifications sent while we were not listening are lost
	r.wakeUp()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		r.markDirty(n.Payload)
		r.wakeUp()
	}
}
