package relay

import (
	"context"
	"time"

	"github.com/pgbox/pgbox/outbox"
)

// Step 1 of a pass: claim the next batch of rows from the owned slots.

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

// takeBatch claims from the slots in rotation from nextSlot (only the ones in
// only, if given).
func (r *Relay) takeBatch(ctx context.Context, nextSlot int, only *slotSet) ([]row, int64, error) {
	gen := r.leaseGen.Load()
	slots := allSlots(nextSlot)
	if only != nil {
		if only.empty() {
			return nil, gen, nil
		}
		slots = only.list(nextSlot)
	}
	// The claim sees every row, late commits too, once the previous batch's
	// rows are gone: no claim skips rows by id (see claimSQL).
	r.waitFinish()
	rows, err := r.claim(ctx, slots)
	return rows, gen, err
}

// claim reads the next batch from slots, in slot order, skipping in each
// slot the rows a parked row holds back (claimSQL).
func (r *Relay) claim(ctx context.Context, slots []int32) ([]row, error) {
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.id, r.cfg.BatchSize, r.cfg.Lanes, slots, r.claimPerSlot())
	if err != nil {
		return nil, err
	}
	out := make([]row, 0, 64)
	for rows.Next() {
		var x row
		if err := rows.Scan(&x.id, &x.eventID, &x.slot, &x.topic, &x.key, &x.value, &x.headers, &x.createdAt, &x.attempts, &x.epoch); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, x)
	}
	return out, rows.Err()
}
