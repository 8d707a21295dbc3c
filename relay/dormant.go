package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/backoff"
)

// What an idle target of a Fleet costs its database.
//
// A relay alone, asleep, asks its outbox every PollInterval whether it
// holds a row and renews its leases every HeartbeatInterval: two small
// transactions a second or so, nothing for one relay and a saturated pool
// for a thousand schemas of one database (measured: heartbeats timed out
// behind the polls, and relays that cannot confirm their leases hold their
// batches back, as they must). So a Fleet's idle targets cost it less:
//
//   - The idle poll is the Fleet's. Every PollInterval one goroutine per
//     pool asks every idle target of that pool the same question
//     (idleQuestion) in one pipeline on one connection, up to 32
//     questions to a read-only implicit transaction (one target's dropped
//     schema fails its own question only: questions.go), and wakes the
//     targets that hold rows, failed or answered slowly. A thousand idle
//     schemas cost one round trip and some 32 transactions a second,
//     which write no WAL.
//   - A target starts dormant (unless the statistics show rows in its
//     outbox: startrows.go), and goes dormant again once idle for
//     DormantAfter: its heartbeat gives up
//     its lanes and stops renewing them; its instance row stays, marked
//     dormant (dormantSQL), renewed every dormantBeat or so
//     (nextDormantBeat). Writers with
//     outbox.Config.Notify still notify it (it is a live, sleeping
//     instance to them); the Fleet's poll finds everybody else's rows. On
//     waking it heartbeats at once, takes its lanes back and claims.
//
// A dormant instance is not a lane holder to anyone: it leaves the
// ranking (kafka_ready false, which every relay version reads as "takes
// no lanes"), so another live instance of the target takes its lanes when
// they expire, and its own lanes keep their owner only until they expire.
// Going dormant is a hand-over like any other: the generation moves first
// (leaseHeld), nothing claimed before is sent after, and the lanes stay
// unclaimable by others for one heartbeat interval, so a batch already on
// its way finishes under the lease it was claimed under.

// DormantAfterDefault is FleetConfig.DormantAfter's default.
const DormantAfterDefault = time.Minute

// dormantBeat is how often, on average, a dormant instance renews its
// row; dormantTTL how long the row counts as live without a renewal.
//
// Each renewal comes a random wait after the last, between two thirds
// and four thirds of dormantBeat (nextDormantBeat), never at a fixed
// period: a Fleet's idle targets go dormant together (DormantAfter after
// the same start or the same burst), and at a fixed period they stayed in
// step, a thousand renewals in the same second every 30 s, each on its
// target's home connection beside the busy targets' statements. (No
// effect on latency was measured: the half-minute stalls of make tenants
// were autovacuum's, docs/tenants-scale.md.) The row lives dormantTTL,
// more than twice the longest wait.
//
// (A variable for the tests.)
var dormantBeat = 30 * time.Second

func dormantTTL() time.Duration { return 3 * dormantBeat }

// nextDormantBeat draws the wait before a dormant row's next renewal:
// uniform in [2/3, 4/3) of dormantBeat, dormantBeat on average.
func nextDormantBeat() time.Duration {
	return dormantBeat*2/3 + rand.N(max(dormantBeat*2/3, 1))
}

// dormantSQL makes the instance dormant, or renews a dormant one: its
// lanes expire within the grace ($3) and are not renewed, its row stays
// live for $2 with kafka_ready false (out of the lane ranking: see
// heartbeatSQL) and sleeping true (writers with Notify wake it). The
// combination sleeping and not kafka_ready marks a dormant instance (an
// instance that has not reached Kafka never sleeps); the next heartbeat
// sets kafka_ready again.
//
// It also writes the console's history sample for the target (historySQL
// writes it while the target is awake, at every backlog count): a sample
// with no topic's rows, which the chart draws as zero backlog and nothing
// published, rather than no data for as long as the target sleeps. A
// dormant target's outbox held no unparked row at its last poll, and rows
// wake it within a PollInterval. The samples of the last two hours are
// kept, as historySQL keeps them.
//
// $1 instance, $2 dormant row TTL, $3 release grace.
const dormantSQL = `WITH rel AS (
	UPDATE pgbox_relay_lanes SET expires_at = least(expires_at, now() + $3::interval) WHERE owner = $1
), hist AS (
	INSERT INTO pgbox_relay_history (topic, backlog, published) VALUES ('', 0, 0)
), old AS (
	DELETE FROM pgbox_relay_history WHERE at < now() - interval '2 hours'
)
INSERT INTO pgbox_relay_instances (instance, expires_at, kafka_ready, sleeping) VALUES ($1, now() + $2::interval, false, true)
ON CONFLICT (instance) DO UPDATE SET heartbeat_at = now(), expires_at = EXCLUDED.expires_at,
	kafka_ready = false, kafka_down_since = NULL, sleeping = true`

// fleetIdle is a Fleet relay's idle state, shared by its work loop, its
// heartbeat loop and its Fleet's poll.
type fleetIdle struct {
	polled bool          // the Fleet polls for this relay while it is idle
	after  time.Duration // DormantAfter; negative: never dormant
	awake  bool          // it starts awake: its outbox holds rows (startrows.go)
	// kick asks the pool's poll to ask soon (a target started: its rows
	// must not wait a PollInterval); fresh is set until that poll asked.
	kick  chan struct{}
	fresh atomic.Bool

	idle atomic.Bool // waiting for the Fleet's poll or a notification
	slow atomic.Bool // the Fleet's question was slow at slowPolls polls in a row
	// slowRun counts the Fleet's polls in a row whose question was slow
	// (the poll goroutine of the relay's pool writes it).
	slowRun atomic.Int32
	wanted  atomic.Bool   // the work loop wants the relay dormant
	dormant atomic.Bool   // the heartbeat made it dormant (the lanes are given up)
	beatAt  time.Time     // the last dormantSQL; the heartbeat goroutine's
	beatIn  time.Duration // the wait after beatAt before the next one (nextDormantBeat); the heartbeat goroutine's
	// pollErr is the failure the Fleet's poll reported as the relay's own
	// (pollFailed), until a round answers (pollAnswered).
	pollErr atomic.Pointer[error]
}

// Dormant reports whether the relay has given up its lanes while idle
// (Fleet targets only: FleetConfig.DormantAfter).
func (r *Relay) Dormant() bool { return r.idleState.dormant.Load() }

// dormantBeat makes the instance dormant, or renews its dormant row
// (every dormantBeat or so: nextDormantBeat). It runs on the heartbeat
// goroutine, the only one that touches the lease state.
func (r *Relay) dormantBeat(ctx context.Context) {
	s := &r.idleState
	if s.dormant.Load() && time.Since(s.beatAt) < s.beatIn {
		return
	}
	if !s.dormant.Load() {
		// Before the lanes go: nothing claimed from here on is sent.
		r.leaseGen.Add(1)
		r.leaseUntil.Store(0)
	}
	// It takes no lanes however long Kafka takes to answer: the row reads
	// dormant, not "connecting to Kafka" (alertOutage still reports an
	// outage that lasts).
	hctx, cancel := r.beatContext(ctx)
	defer cancel()
	if _, err := r.db.exec(hctx, dormantSQL, r.id, dormantTTL(), r.cfg.HeartbeatInterval); err != nil {
		if ctx.Err() == nil {
			r.failed.Store(&err)
			r.log.WarnContext(ctx, "going dormant failed, retrying", "error", err)
		}
		return
	}
	r.failed.Store(nil)
	s.beatAt, s.beatIn = time.Now(), nextDormantBeat()
	if !s.dormant.Swap(true) {
		r.lanes.Store(0)
		r.log.DebugContext(ctx, "dormant: no rows for a while, lanes given up until rows come", "after", s.after)
	}
}

// idleWait is waitForWork's wait while the Fleet polls for the relay: it
// blocks until the Fleet's poll or a notification wakes it (true), the
// relay is due to go dormant (false: the caller waits again), or ctx ends.
func (r *Relay) idleWait(ctx context.Context, w *watcher) bool {
	s := &r.idleState
	var due <-chan time.Time
	if s.after >= 0 && !s.wanted.Load() {
		left := s.after - time.Since(w.asleepAt)
		if left <= 0 {
			r.waitFinish() // the last batch's rows are deleted under the lease
			s.wanted.Store(true)
			r.beatNow()
		} else {
			t := time.NewTimer(left)
			defer t.Stop()
			due = t.C
		}
	}
	s.idle.Store(true)
	defer s.idle.Store(false)
	if s.fresh.Load() {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	select {
	case <-ctx.Done():
		return true
	case <-due:
		return false
	case <-r.wake:
	}
	if s.wanted.Swap(false) {
		w.asleepAt = time.Now()
		r.beatNow() // take the lanes back at once
	}
	if s.slow.Swap(false) {
		r.emptyPausedUntil = time.Now().Add(emptyPause)
	}
	return true
}

// mayIdle reports whether the Fleet may poll for the relay: it is a
// Fleet's relay and its own idle poll would only ask emptySQL.
func (r *Relay) mayIdle() bool {
	return r.idleState.polled && !r.sweepWanted.Load() && !time.Now().Before(r.emptyPausedUntil)
}

// idleQuestion is emptySQL for the Fleet's poll: the schema is named, as
// the question travels without the set_config of the relay's statements.
// It also returns the microseconds the server spent on it (since it read
// the question's Bind message): a loaded client reads answers late, which
// must not make a question look slow.
//
// A row a parked row holds back (its key's earlier row, parked) does not
// count: the claim would not take it either (pgbox_outbox_claim2 tests
// the same condition), and counting it would wake a dormant target at
// every poll for as long as the row stays parked, to claim nothing. The
// condition must be the claim's exactly, or looser: a row the question
// calls held while the claim would take it would never wake a dormant
// target.
func idleQuestion(schema string) string {
	t := pgx.Identifier{schema, "pgbox_outbox"}.Sanitize()
	return "SELECT EXISTS (SELECT 1 FROM " + t + " c WHERE c.parked_at IS NULL AND (c.key IS NULL OR NOT EXISTS (" +
		"SELECT 1 FROM " + t + " p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL " +
		"AND p.topic = c.topic AND sha256(p.key) = sha256(c.key) AND p.key = c.key AND p.id < c.id))), " +
		"(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000000)::bigint"
}

// slowPolls is how many polls in a row must find a target's question
// slow before it polls for itself (emptyPause).
const slowPolls = 3

// questionSetSQL is what the idle poll's and the watch's questions run
// under when asked alone (questions.go: a group of more than one runs
// under questionGroupSetSQL, tighter).
//
// It bounds how long a question waits for a lock on its
// outbox (ACCESS EXCLUSIVE: a VACUUM FULL, an ALTER, a TRUNCATE of one
// target): the questions of a pipeline are answered one after the other,
// so one target's lock would hold up every idle target of the pool until
// the poll's timeout, and then wake them all. A question that times out
// fails alone: its target is woken and claims for itself. It is LOCAL: it
// ends with the question's implicit transaction (its Sync), so a pooler's
// server connection keeps no setting.
//
// It also turns sequential and bitmap scans off for the question, as the
// claim does: an outbox's deleted rows stay until autovacuum comes
// (migration 00150: after 5,000 of them), and an outbox that went idle
// with fewer stays so. A sequential scan reads every page of them at every
// poll (10,000 deleted rows of 1 KB: 1,429 pages, 120-180 us a question);
// the claim index, whose entries for deleted rows the first scan marks
// dead, reads a few dozen (16-31 us: TestIdleQuestionUsesClaimIndex).
const questionSetSQL = `SELECT set_config('lock_timeout', '100ms', true), set_config('enable_seqscan', 'off', true),
	set_config('enable_bitmapscan', 'off', true)`

// pollChunk bounds the questions one pipeline sends.
const pollChunk = 256

// freshDelay is how long the poll waits after a kick before it asks the
// targets that started meanwhile: targets starting together (a process
// start, a list re-read) are asked in one pipeline.
const freshDelay = 20 * time.Millisecond

// pollLoop runs the Fleet's idle poll of pool's targets every
// PollInterval until ctx ends, and asks targets that just started at
// once (kick): a target starts dormant, and a backlog waiting for it must
// not wait for the next tick.
func (f *Fleet) pollLoop(ctx context.Context, pool *pgxpool.Pool, kick <-chan struct{}) {
	b := backoff.Backoff{Base: backoffMin, Limit: f.cfg.Relay.MaxBackoff}
	t := time.NewTicker(f.cfg.Relay.PollInterval)
	defer t.Stop()
	failed := 0 // the poll's failures in a row
	for {
		freshOnly := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
			freshOnly = true
			if !backoff.Sleep(ctx, freshDelay) {
				return
			}
		}
		f.mu.Lock()
		var idle []*Relay
		for _, r := range f.relays(pool, "") {
			if r.idleState.idle.Load() && (!freshOnly || r.idleState.fresh.Load()) {
				r.idleState.fresh.Store(false)
				idle = append(idle, r)
			}
		}
		f.mu.Unlock()
		var err error
		if f.pollErr != nil && len(idle) > 0 { // (a round with no question does no I/O)
			err = f.pollErr()
		}
		if err == nil {
			err = f.poll(ctx, pool, idle)
		}
		if err != nil && ctx.Err() == nil {
			for _, r := range idle {
				r.pollFailed(err)
			}
			failed++
			d := b.Next()
			msg := "the idle targets' poll failed; asking again"
			if failed >= pollFailWake {
				// Each relay polls itself, and reports the failure as its own.
				for _, r := range idle {
					r.markAllDirty()
					r.wakeUp()
				}
				msg = "the idle targets' poll failed; they poll themselves"
			}
			f.log.WarnContext(ctx, msg, "database", pool.Config().ConnConfig.Database, "error", err, "failures", failed, "backoff", d)
			backoff.Sleep(ctx, d)
			continue
		}
		for _, r := range idle {
			r.pollAnswered()
		}
		if !freshOnly && len(idle) > 0 {
			// Only a full round that answered ends a run of failures: a
			// kick's round asks only the targets that just started, and
			// must not keep the others from ever being woken (the review).
			failed = 0
		}
		b.Reset()
	}
}

// pollFailed reports a failed round of the Fleet's idle poll as a dormant
// relay's own failure (Fleet.Targets, the target's state and metrics): its
// dormant row is renewed, and a failure of its own seen, only every
// dormantBeat or so, so a database outage showed up to 30 s late (the
// review of the idle poll's failures).
func (r *Relay) pollFailed(err error) {
	if !r.idleState.dormant.Load() {
		return // awake: its heartbeat reports its database's failures
	}
	p := &err
	r.failed.Store(p)
	r.idleState.pollErr.Store(p)
}

// pollAnswered clears what pollFailed reported, unless the relay's own
// statements have reported since (their failure stays theirs to clear).
func (r *Relay) pollAnswered() {
	if p := r.idleState.pollErr.Swap(nil); p != nil {
		r.failed.CompareAndSwap(p, nil)
	}
}

// pollFailWake is how many times in a row the idle poll fails before its
// targets are woken to poll for themselves. Waking them at the first
// failure turned one slow round into a collapse: with 100 targets busy on
// two saturated cores, a round of 1,000 idle questions overran its
// timeout, the 1,000 idle targets woke, took their lanes, heartbeated and
// claimed, and commit→Kafka went to a minute (make tenants). A database
// that is down fails every round, so its targets still wake within a few
// backoffs, and report the failure as their own.
const pollFailWake = 3

// poll asks each of rs whether its outbox holds a row to claim, in
// pipelines of pollChunk questions on one connection, and wakes those that
// do, whose question failed, or took longer than emptySlow.
func (f *Fleet) poll(ctx context.Context, pool *pgxpool.Pool, rs []*Relay) error {
	return f.ask(ctx, pool, rs, pollPipeline)
}

// ask sends each of rs a question through pipeline, pollChunk questions
// a pipeline, on one connection of pool, with the questions prepared on
// it so far (nil: unnamed questions, for a pooler in transaction mode:
// keepsPrepared). The idle poll and the busy targets' watch ask so.
func (f *Fleet) ask(ctx context.Context, pool *pgxpool.Pool, rs []*Relay,
	pipeline func(context.Context, *pgconn.PgConn, map[string]string, []*Relay) error) error {
	return f.askOn(ctx, pool, -1, rs, pipeline)
}

// askOn is ask on home's connection (watchHome, or -1: the pool's).
func (f *Fleet) askOn(ctx context.Context, pool *pgxpool.Pool, home int, rs []*Relay,
	pipeline func(context.Context, *pgconn.PgConn, map[string]string, []*Relay) error) error {
	if len(rs) == 0 {
		return nil
	}
	// Each step has its own timeout: a slow round that goes on answering
	// is not a failed one.
	wait := max(f.cfg.Relay.LeaseTTL, 5*time.Second)
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	f.mu.Lock()
	h := f.homes[pool]
	f.mu.Unlock()
	c, err := h.acquire(actx, pool, home) // counted as waiting after homeWait for the pool (homes.go)
	if err != nil {
		return err
	}
	defer func() {
		if h == nil || !h.keep(home, c) {
			c.Release()
		}
	}()
	var prepared map[string]string
	if keepsPrepared(pool) {
		prepared = connSet[string](&idlePreparedOn, c.Conn().PgConn())
	}
	for len(rs) > 0 {
		n := min(len(rs), pollChunk)
		pctx, cancel := context.WithTimeout(ctx, wait)
		err := pipeline(pctx, c.Conn().PgConn(), prepared, rs[:n])
		cancel()
		if err != nil {
			return err
		}
		rs = rs[n:]
	}
	return nil
}

// The idle questions are prepared, one statement per schema on each
// connection that polls: an unnamed statement is parsed and planned at
// every poll, and the plan of a question costs the server far more than
// its answer (measured at 1,200 targets: about 0.9 ms of planning for
// 0.02-0.06 ms of execution, for every idle target every second).
// PostgreSQL keeps a parameterless statement's plan, and plans it again
// when a table it reads changes (a schema dropped and recreated). A name
// carries a number of its own, so a name forgotten here (forgetAll) and
// still prepared on the server is never prepared twice; a connection
// holds at most idlePreparedMax of them (past that: unnamed questions).
var (
	idlePreparedOn sync.Map // *pgconn.PgConn -> map[string]string: schema -> statement name; the poll holding the connection touches it
	idleNames      atomic.Int64
)

const idlePreparedMax = 2000

// pollPipeline asks each relay its idle question (askGrouped), and wakes
// the relays whose answer is not a quick "no rows". prepared names the
// questions already prepared on pc; those it prepares are added; nil:
// every question is unnamed. A connection error is returned (the
// connection is closed by then).
func pollPipeline(ctx context.Context, pc *pgconn.PgConn, prepared map[string]string, rs []*Relay) error {
	type answer struct {
		rows bool
		took time.Duration
	}
	preparing := make([]string, len(rs)) // the name prepared in this pipeline, if any
	answers := make([]answer, len(rs))
	errs, err := askGrouped(ctx, pc, rs, func(p *pgconn.Pipeline, i int) {
		s := rs[i].cfg.Schema
		preparing[i] = sendQuestion(p, prepared, s, "pgbox_idle_", idleQuestion(s), nil, nil)
	}, func(p *pgconn.Pipeline, i int) error {
		return readQuestion(p, prepared, rs[i].cfg.Schema, preparing[i], func() (err error) {
			answers[i].rows, answers[i].took, err = pollResult(p)
			if err == nil {
				rs[i].answeredIn(answers[i].took)
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	took := make([]time.Duration, len(answers))
	for i, a := range answers {
		took[i] = a.took
	}
	slices.Sort(took)
	median := took[len(took)/2]
	for i, r := range rs {
		a, failed := answers[i], errs[i] != nil
		// Slow: reading dead rows a held horizon keeps (the relay then
		// claims at its own polls for a while: nothingToClaim), not a
		// loaded server, which slows every answer alike. Only an answer
		// slow at slowPolls polls in a row counts: a transient lock
		// (autovacuum truncating the emptied table, an ALTER) slows one,
		// and a slow verdict keeps the target out of this poll and of
		// dormancy for emptyPause; a held horizon slows every answer
		// until it ends.
		slow := false
		if a.took > max(cmp.Or(r.emptySlow, emptySlow), 4*median) {
			slow = r.idleState.slowRun.Add(1) >= slowPolls
		} else if !failed {
			r.idleState.slowRun.Store(0)
		}
		if slow {
			r.idleState.slowRun.Store(0)
			r.idleState.slow.Store(true)
		}
		if a.rows || failed || slow {
			r.markAllDirty()
			r.wakeUp()
		}
	}
	return nil
}

// pollPrepared reads a prepare's result.
func pollPrepared(p *pgconn.Pipeline) error {
	res, err := p.GetResults()
	if err != nil {
		return err
	}
	if _, ok := res.(*pgconn.StatementDescription); !ok {
		return fmt.Errorf("relay: idle poll: expected a statement description, got %T", res)
	}
	return nil
}

// pollResult reads one statement's result: its first value is true, its
// second the microseconds the server spent (idleQuestion), or its error.
func pollResult(p *pgconn.Pipeline) (rows bool, took time.Duration, err error) {
	res, err := p.GetResults()
	if err != nil {
		return false, 0, err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return false, 0, fmt.Errorf("relay: idle poll: unexpected pipeline result %T", res)
	}
	for rr.NextRow() {
		v := rr.Values()
		rows = len(v) > 0 && string(v[0]) == "t"
		if len(v) == 2 {
			us, _ := strconv.ParseInt(string(v[1]), 10, 64)
			took = time.Duration(us) * time.Microsecond
		}
	}
	_, err = rr.Close()
	return rows, took, err
}

func isPgError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe)
}
