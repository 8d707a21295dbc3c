package relay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/backoff"
)

// The busy targets' watch, shared per pool.
//
// A relay alone watches its table every BusyPollInterval while rows come
// (wake.go): one statement on one of its pool's connections. A hundred busy
// targets of one database each watching on its own took the pool's
// connections from their claims and deletes: with the Kafka sends no
// longer in the way, a claim waited 155 ms at the median for a connection
// (make tenants, 101 schemas). So a Fleet's relay, while it watches, only
// publishes its floor (sharedWatch) and waits: one goroutine per pool asks
// every watching target of the pool its watchSQL question in one pipeline
// on one connection, up to 32 to a transaction (as the idle poll asks the
// idle ones: questions.go), and
// wakes those that have rows above their floor, with their slots marked.
// The watches a second stay those WatchRate allows, but a round trip and a
// connection serve them all. What the watch finds, and when, only shortens
// the wait: every row is still found by the claims and polls, as without it.

// sharedWatch is a Fleet relay's side of its pool's watch.
type sharedWatch struct {
	kick  chan struct{} // the pool's watch loop: a relay started watching
	on    atomic.Bool   // the relay waits for the pool's watch
	floor atomic.Int64  // watchSQL's $1 while on
	top   atomic.Int64  // the newest id the pool's watch found (0: none since taken)
}

// watchQuestion is watchSQL for the pool's watch: the schema is named, as
// the question travels without the set_config of the relay's statements.
// It also returns the microseconds the server spent on it, which size the
// groups it is asked in (questions.go).
func watchQuestion(schema string) string {
	return `SELECT coalesce(max(id), 0)::bigint, coalesce(array_agg(DISTINCT slot), '{}')::int[],
	(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000000)::bigint
FROM (SELECT id, slot FROM ` + pgx.Identifier{schema, "pgbox_outbox"}.Sanitize() + ` WHERE id > $1 AND parked_at IS NULL ORDER BY id LIMIT $2) w`
}

// watchPreparedKey is a watch question's key in idlePreparedOn (the idle
// questions' keys are the schemas themselves).
func watchPreparedKey(schema string) string { return "\x00watch\x00" + schema }

// waitShared is waitForWork's wait while the relay watches through its
// pool's watch: it publishes the floor, then waits for a wake-up (true),
// the floor's next move or until (false), or ctx.
func (r *Relay) waitShared(ctx context.Context, w *watcher, until time.Time) bool {
	s := r.shared
	if !s.on.Load() {
		// The last batch's delete first (the next claim waits for it
		// anyway): the watch would find its rows still there.
		r.waitFinish()
	}
	w.moveFloor(time.Now())
	s.floor.Store(w.floor)
	if !s.on.Swap(true) {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	t := time.NewTimer(min(watchLag, time.Until(until)))
	defer t.Stop()
	woke := false
	select {
	case <-ctx.Done():
	case <-r.wake:
		woke = true
	case <-t.C:
	}
	if woke || !time.Now().Before(until) {
		s.on.Store(false)
	}
	if top := s.top.Swap(0); top > 0 {
		w.saw(top)
	}
	return woke
}

// stopShared takes the relay out of its pool's watch.
func (r *Relay) stopShared() {
	if r.shared != nil {
		r.shared.on.Store(false)
	}
}

// watchLoop runs the pool's watch until ctx ends: while some of pool's
// targets watch, it asks them all every BusyPollInterval, or every
// (watching targets of the Fleet / WatchRate) when that is longer.
func (f *Fleet) watchLoop(ctx context.Context, pool *pgxpool.Pool, kick <-chan struct{}) {
	b := backoff.Backoff{Base: backoffMin, Limit: f.cfg.Relay.MaxBackoff}
	for {
		f.mu.Lock()
		var rs []*Relay
		for _, r := range f.relays(pool, "") {
			if r.shared != nil && r.shared.on.Load() {
				rs = append(rs, r)
			}
		}
		f.mu.Unlock()
		if len(rs) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-kick:
				continue
			}
		}
		start := time.Now()
		if err := f.watchAll(ctx, pool, rs); err != nil && ctx.Err() == nil {
			// Each relay claims on its own, and reports the failure as its own.
			for _, r := range rs {
				r.markAllDirty()
				r.wakeUp()
			}
			d := b.Next()
			f.log.WarnContext(ctx, "the busy targets' watch failed; they claim on their own meanwhile", "database", pool.Config().ConnConfig.Database,
				"error", err, "backoff", d)
			if !backoff.Sleep(ctx, d) {
				return
			}
			continue
		}
		b.Reset()
		every := max(f.cfg.Relay.BusyPollInterval, time.Duration(f.watchers.Load())*time.Second/time.Duration(f.cfg.WatchRate))
		if !backoff.Sleep(ctx, every-time.Since(start)) {
			return
		}
	}
}

// watchAll asks each of rs its watch question, in pipelines of pollChunk
// questions on one connection, and wakes those with rows above their
// floor (their slots marked) or whose question failed (every slot).
func (f *Fleet) watchAll(ctx context.Context, pool *pgxpool.Pool, rs []*Relay) error {
	return f.askOn(ctx, pool, watchHome, rs, watchPipeline)
}

// watchPipeline asks each relay its watch question (askGrouped), and
// wakes the relays as watchAll says. A connection error is returned.
func watchPipeline(ctx context.Context, pc *pgconn.PgConn, prepared map[string]string, rs []*Relay) error {
	type answer struct {
		top   int64
		slots []int32
	}
	preparing := make([]string, len(rs))
	answers := make([]answer, len(rs))
	errs, err := askGrouped(ctx, pc, rs, func(p *pgconn.Pipeline, i int) {
		r := rs[i]
		params := [][]byte{strconv.AppendInt(nil, r.shared.floor.Load(), 10), strconv.AppendInt(nil, watchLimit, 10)}
		preparing[i] = sendQuestion(p, prepared, watchPreparedKey(r.cfg.Schema), "pgbox_watch_", watchQuestion(r.cfg.Schema),
			params, []uint32{pgtype.Int8OID, pgtype.Int4OID})
	}, func(p *pgconn.Pipeline, i int) error {
		return readQuestion(p, prepared, watchPreparedKey(rs[i].cfg.Schema), preparing[i], func() (err error) {
			var took time.Duration
			answers[i].top, answers[i].slots, took, err = watchResult(p)
			if err == nil {
				rs[i].answeredIn(took)
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	for i, r := range rs {
		switch a := answers[i]; {
		case errs[i] != nil:
			r.markAllDirty()
			r.wakeUp()
		case len(a.slots) > 0 && r.shared.on.Load():
			// (A relay no longer waiting for the watch is claiming: it
			// finds the rows itself, and a wake-up left for later would
			// make it claim again for nothing.)
			for top := r.shared.top.Load(); top < a.top && !r.shared.top.CompareAndSwap(top, a.top); top = r.shared.top.Load() {
			}
			r.markSlots(a.slots)
			r.wakeUp()
		}
	}
	return nil
}

// watchResult reads a watch question's row: the newest id, the slots and
// the server's time on the question.
func watchResult(p *pgconn.Pipeline) (top int64, slots []int32, took time.Duration, err error) {
	res, err := p.GetResults()
	if err != nil {
		return 0, nil, 0, err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return 0, nil, 0, fmt.Errorf("relay: busy targets' watch: unexpected pipeline result %T", res)
	}
	for rr.NextRow() {
		v := rr.Values()
		if len(v) != 3 {
			continue
		}
		if top, err = strconv.ParseInt(string(v[0]), 10, 64); err == nil {
			slots, err = parseIntArray(v[1])
		}
		us, _ := strconv.ParseInt(string(v[2]), 10, 64)
		took = time.Duration(us) * time.Microsecond
	}
	if _, cerr := rr.Close(); cerr != nil {
		return 0, nil, 0, cerr
	}
	if err != nil {
		return 0, nil, 0, fmt.Errorf("relay: busy targets' watch: %w", err)
	}
	return top, slots, took, nil
}

// parseIntArray reads an int[] in text form ({1,2,3}).
func parseIntArray(b []byte) ([]int32, error) {
	t := strings.TrimSuffix(strings.TrimPrefix(string(b), "{"), "}")
	if t == "" {
		return nil, nil
	}
	parts := strings.Split(t, ",")
	out := make([]int32, len(parts))
	for i, x := range parts {
		n, err := strconv.ParseInt(x, 10, 32)
		if err != nil {
			return nil, err
		}
		out[i] = int32(n)
	}
	return out, nil
}
