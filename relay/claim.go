package relay

import (
	"context"
	"time"

	"github.com/pgbox/pgbox/outbox"
)

// Step 1 of a pass: claim the next batch of rows from the owned slots, each
// slot from its floor (floor.go).

type row struct {
	id        int64
	eventID   outbox.EventID
	slot      int16
	topic     string
	key       []byte
	value     []byte
	headers   []outbox.Header
	createdAt time.Time
	attempts  int32
	epoch     int64
}

// minRowsPerSlot is the least a claim takes from one slot.
const minRowsPerSlot = 16

// claimPerSlot is the most rows one claim takes from one slot, so that a
// batch spans several slots when a backlog is spread over many, while a few
// hot keys still fill a batch.
func (r *Relay) claimPerSlot() int { return max(minRowsPerSlot, r.cfg.BatchSize/4) }

// claimed is one claim's result: its rows, and what the claim function
// reported about the slots it probed (claimMeta).
type claimed struct {
	rows []row
	meta claimMeta
	move floorMove
}

// claimMeta is the first part of pgbox_outbox_claim's result: the owned
// slots among those asked for, in the order probed, with the epoch and floor
// each was probed under, and the sequence read and snapshot bounds the
// floor's rule needs.
type claimMeta struct {
	slots     []int16
	epochs    []int64
	floors    []int64
	seqLast   *int64 // NULL: the sequence caches values per session, or cannot be read
	xmin      int64  // the rows' snapshot's
	dbStarted int64  // when the server started, µs since the epoch
}

// takeBatch claims from every owned slot, or from only the ones in only,
// stalest first (floorState.order).
func (r *Relay) takeBatch(ctx context.Context, only *slotSet) (claimed, int64, error) {
	gen := r.leaseGen.Load()
	if only != nil && only.empty() {
		return claimed{}, gen, nil
	}
	// The claim sees every row, late commits too, once the previous batch's
	// rows are gone and its floors moved (waitFinish).
	r.waitFinish()
	slots := r.floors.order(only)
	start := time.Now()
	c, err := r.claim(ctx, slots)
	if err != nil {
		// A rewind the claim consumed may be lost with the answer: forget
		// every floor (the next claims start at the slots' first rows).
		r.floors.forget()
		return claimed{}, gen, err
	}
	r.floors.claimed(&c, r.claimPerSlot(), r.cfg.BatchSize, start)
	if c.meta.seqLast == nil && len(c.meta.slots) > 0 {
		r.warnNoFloor(ctx)
	}
	return c, gen, nil
}

// claim runs pgbox_outbox_claim over slots with their remembered floors.
func (r *Relay) claim(ctx context.Context, slots []int32) (claimed, error) {
	floors, epochs := r.floors.args(slots)
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.id, r.cfg.Lanes, slots, floors, epochs, r.claimPerSlot(), r.cfg.BatchSize)
	if err != nil {
		return claimed{}, err
	}
	defer rows.Close()
	var c claimed
	for rows.Next() {
		var (
			x                      row
			id, floor, seq, lo, hi *int64
			eventID                *outbox.EventID
			topic                  *string
			createdAt              *time.Time
			attempts               *int32
		)
		if err := rows.Scan(&id, &eventID, &x.slot, &topic, &x.key, &x.value, &x.headers, &createdAt, &attempts, &x.epoch,
			&floor, &seq, &lo, &hi); err != nil {
			return claimed{}, err
		}
		if id == nil { // a probed slot
			m := &c.meta
			m.slots, m.epochs, m.floors = append(m.slots, x.slot), append(m.epochs, x.epoch), append(m.floors, *floor)
			m.seqLast, m.xmin, m.dbStarted = seq, *lo, *hi
			continue
		}
		x.id, x.eventID, x.topic, x.createdAt, x.attempts = *id, *eventID, *topic, *createdAt, *attempts
		c.rows = append(c.rows, x)
	}
	return c, rows.Err()
}

// warnNoFloor says once why claims start at each slot's first row.
func (r *Relay) warnNoFloor(ctx context.Context) {
	if r.floors.warned {
		return
	}
	r.floors.warned = true
	r.log.WarnContext(ctx, "the outbox id sequence caches values per session (or the relay may not read it): "+
		"claims start at each slot's first row, so a held xmin horizon slows them; "+
		"ALTER SEQUENCE ... CACHE 1 (docs/relay.md, The floor)")
}
