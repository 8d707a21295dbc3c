package relay

import (
	"context"
	"time"
)

// The sweep: the floor's second line of defence (floor.go).
//
// Every SweepInterval the work loop hands a copy of its owned slots' floors
// to the sweep goroutine, which asks the database, on a connection of its
// own and off the claim's path, whether any of those slots has a
// committed, unparked row below its floor that no parked row holds back
// (belowFloorSQL: one walk of the dead entries a held horizon keeps, per
// interval). Only when it names a slot, or cannot answer, does the next
// full claim read every slot from its start (a sweep claim): the rows it
// finds below where each slot's claim would have started are published in
// id order, counted and logged at ERROR (takeBatch).

// lookRequest is a copy of the floors the sweep's look checks.
type lookRequest struct {
	slots  []int32
	floors []int64
}

// belowFloorSQL returns the slots of $1 with a row below their floor $2:
// see pgbox_outbox_below_floor (migration 00120).
const belowFloorSQL = `SELECT pgbox_outbox_below_floor($1::int[], $2::bigint[])`

// offerLook hands the sweep goroutine the owned slots' floors, at most once
// per SweepInterval; the work loop calls it after a claim of every slot.
func (r *Relay) offerLook(now time.Time) {
	f := &r.floors
	if !f.sweepDue(now, r.cfg.SweepInterval) {
		return
	}
	f.sweepAt = now
	var req lookRequest
	for s := range f.floor {
		if f.owned.has(s) && f.epoch[s] != 0 && f.floor[s] > 0 {
			req.slots, req.floors = append(req.slots, int32(s)), append(req.floors, f.floor[s])
		}
	}
	if len(req.slots) == 0 {
		return
	}
	select {
	case r.looks <- req:
	default: // the previous look is still running
	}
}

// sweepLoop runs the looks the work loop offers until ctx ends.
func (r *Relay) sweepLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case req := <-r.looks:
			r.look(ctx, req)
		}
	}
}

// look runs one look; when it finds a slot with a row below its floor, or
// fails, the next full claim sweeps.
func (r *Relay) look(ctx context.Context, req lookRequest) {
	lctx, cancel := context.WithTimeout(ctx, max(r.cfg.SweepInterval, time.Minute))
	defer cancel()
	var slots []int32
	if err := r.db.queryRow(lctx, belowFloorSQL, []any{req.slots, req.floors}, &slots); err != nil {
		if ctx.Err() != nil {
			return
		}
		r.log.WarnContext(ctx, "the sweep's look below the floors failed; the next claim reads every slot from its start", "error", err)
		r.sweepWanted.Store(true)
		return
	}
	if len(slots) == 0 {
		r.log.DebugContext(ctx, "the sweep looked below the floors: nothing there", "slots", len(req.slots))
		return
	}
	r.log.DebugContext(ctx, "the sweep's look found rows below floors; the next claim reads every slot from its start", "slots", slots)
	r.sweepWanted.Store(true)
}
