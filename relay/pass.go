package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/internal/slot"
)

// A pass, step by step: workLoop (this file) runs passes; a pass claims a
// batch (claim.go), sends it (send.go, over producer.go; errors are
// classified by kafkaerrors.go) and records the outcome (finish.go).

// workLoop runs passes until ctx ends, or a pass fails in a way retrying
// cannot fix (then it stops Run through stop).
func (r *Relay) workLoop(ctx context.Context, p *producer, stop context.CancelCauseFunc) {
	var (
		b         = backoff.Backoff{Base: backoffMin, Limit: r.cfg.MaxBackoff}
		busyUntil time.Time
		full      = true // probe every owned slot, not just the ones named
		carry     slotSet
		w         watcher
	)
	defer r.waitFinish()
	r.startWatch(ctx, &w)
	defer r.countWatching(&w, false)
	defer r.stopShared()
	if r.idleState.wanted.Load() && (r.idleState.dormant.Load() || r.setSleeping(ctx, true)) {
		// A Fleet's target starts dormant (Run; unless it starts awake:
		// startrows.go), its sleeping flag set
		// (dormantSQL, or here) so that writers notify it; without its
		// instance row yet, it starts as any relay does.
		w.asleep, w.asleepAt = true, time.Now()
		full = r.waitForWork(ctx, &w, busyUntil)
	}
	for {
		if ctx.Err() != nil {
			return
		}
		// A pass probes every owned slot, except right after a notification,
		// a watch that found rows or a non-full batch: then only the slots
		// named plus the slots the last batch found rows in. Every poll
		// probes them all, and so does any pass once an owned slot has gone
		// unprobed for probeAllEvery, so rows nobody named are found within
		// PollInterval (a Fleet's target: ten of them) however busy other
		// slots keep the relay.
		var only *slotSet
		dirty, all := r.takeDirty()
		if !full && !all && !r.floors.stale(time.Now(), r.probeAllEvery()) {
			dirty.union(&carry)
			only = &dirty
		}
		res := r.pass(ctx, p, only)
		w.saw(res.maxID)
		switch {
		case res.published > 0:
			r.kafkaUp(ctx)
		case res.kafkaFailed:
			r.kafkaDown()
		}
		full, carry = true, slotSet{}
		var wait time.Duration
		switch {
		case res.err != nil || (res.failed > 0 && res.published == 0):
			if res.err != nil && r.stopOn("pass", res.err, stop) {
				return
			}
			wait = b.Next()
			if res.err != nil && ctx.Err() == nil {
				r.log.WarnContext(ctx, "pass failed", "error", res.err, "backoff", wait)
			}
		case res.failed > 0:
			b.Reset()
			wait = backoffMin // some rows went out: retry the rest soon
		case res.claimed > 0:
			b.Reset()
			busyUntil = time.Now().Add(busyWindow)
			r.awake(ctx, &w)
			if res.claimed < r.cfg.BatchSize {
				if r.watchers != nil && !res.capped {
					// A Fleet's relay: the batch emptied what it could
					// claim (no slot gave its per-slot cap: a capped
					// slot's rest may lie below the watch's floor), and a
					// claim that finds nothing costs its database far
					// more than the watch (a range scan over
					// the newest ids), which finds what came since. A
					// hundred busy targets of one database each claiming
					// again after every batch spent a third of their
					// claims on nothing (make tenants).
					full = r.waitForWork(ctx, &w, busyUntil)
					continue
				}
				full, carry = false, res.slots
			}
			continue // drain again at once
		default:
			full = r.waitForWork(ctx, &w, busyUntil)
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
			full = false
		case <-t.C:
		}
		t.Stop()
	}
}

// probeAllEvery is how long an owned slot may go unprobed while the relay
// is busy (the watch names the slots with new rows; rows committed later
// than watchLag after their insert are below its floor): PollInterval, a
// Fleet's busy targets included. (A Fleet's busy target waited 10
// PollIntervals for a while, as a claim that probes all 256 slots is its
// costliest; at 1,000 schemas with 100 busy ones that made the commit→Kafka
// p99 4.0 s against 0.4 s with PollInterval, measured in one sitting, for
// about the same claim time on the server: rows committed late under load
// waited up to 10 s.)
func (r *Relay) probeAllEvery() time.Duration { return r.cfg.PollInterval }

type passResult struct {
	claimed, published, failed int
	kafkaFailed                bool    // every send failed for a reason retrying may fix
	maxID                      int64   // the newest row claimed
	slots                      slotSet // slots the batch had rows in
	err                        error
	// capped: a slot gave the claim all it takes from one (claimPerSlot),
	// so it may hold more, below the watch's floor (a backlog from before
	// the relay started): a partial batch did not empty it.
	capped bool
}

// pass claims one batch, sends it and records the outcome.
func (r *Relay) pass(ctx context.Context, p *producer, only *slotSet) passResult {
	start := time.Now()
	c, gen, err := r.takeBatch(ctx, only)
	if err != nil {
		return passResult{err: fmt.Errorf("claim: %w", err)}
	}
	rows := c.rows
	if len(rows) == 0 {
		r.floors.moved(&c, nil) // nothing to record: the probed slots' floors rise now
		return passResult{}
	}

	claimed := time.Now()
	end := r.startPublish(ctx, rows)
	outcome, _ := r.sendBatch(ctx, p, rows, gen)
	t := r.tally(rows, outcome)
	t.res.capped = slotCapped(rows, r.claimPerSlot())
	end(len(t.okIDs), t.publishErr(len(rows)))
	r.waitFinish() // one finish at a time
	if len(t.okIDs)+len(t.badIDs) == 0 {
		return t.res
	}
	b := finishedBatch{tally: t, rows: len(rows), start: start, claimed: claimed, sent: time.Now()}
	// Record the outcome even when stopping: these records are in Kafka.
	if t.res.failed > 0 || ctx.Err() != nil {
		if xid, err := r.finish(ctx, &b); err != nil {
			t.res.err = err
		} else {
			r.floors.recorded(&c, xid, t.okSet())
		}
		return t.res
	}
	// All went out: delete in the background; the next claim waits for it
	// and then moves the floors (waitFinish). If the delete fails the rows
	// are found again and sent again (same event ids, after their key's
	// earlier records, so a deduping consumer sees the same order).
	job := &finishJob{done: make(chan struct{}), claim: &c}
	go func() {
		defer close(job.done)
		xid, err := r.finish(ctx, &b)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("recording a batch failed; its rows will be sent again", "error", err)
			}
			return
		}
		job.published, job.xid = t.okSet(), xid
	}()
	r.fin = job
	return t.res
}

const backoffMin = 100 * time.Millisecond

// slotCapped reports whether some slot has perSlot rows in rows.
func slotCapped(rows []row, perSlot int) bool {
	var n [slot.Count]int
	for _, x := range rows {
		if n[x.slot]++; n[x.slot] >= perSlot {
			return true
		}
	}
	return false
}
