package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbox/pgbox/internal/slot"
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

// claimMeta is the first part of pgbox_outbox_claim2's result: the owned
// slots among those asked for, in the order probed, with the epoch and floor
// each was probed under, and what the claim says of the sequence, the
// server and the snapshot its rows were read with (claimSQL; the first
// slot row carries these, migration 00140).
type claimMeta struct {
	slots      []int16
	epochs     []int64
	floors     []int64
	seqLast    *int64 // nil: the floor is off (seqOff says why)
	seqHW      int64  // pgbox_relay_marker.seq_hw: floors stay at or below it + 1
	seqOff     string // "cache", "privilege", "marker" or ""
	ident      string
	reset      bool // floors were reset to 0 before the rows were read
	rewindSeen int64
	rwSlots    []int32
	rwFrom     []int64
	rescan     bool // a long writer ended: slots started at rescanFrom, the settled bound + 1
	rescanFrom int64
	snap       string // the rows' snapshot, pg_snapshot's text form
	sweep      bool   // every slot was read from its start
}

// takeBatch claims from every owned slot, or from only the ones in only,
// stalest first (floorState.order).
func (r *Relay) takeBatch(ctx context.Context, only *slotSet) (claimed, int64, error) {
	gen := r.leaseGen.Load()
	if (only != nil && only.empty()) || !r.leaseHeld(gen) {
		// Without a lease confirmed since the last gap (before the first
		// heartbeat, after one that came too late, while a dormant Fleet
		// target wakes) nothing claimed could be sent: it would be held
		// back (sendBatch), its rows claimed for nothing. The heartbeat
		// that confirms the lease wakes the loop.
		return claimed{}, gen, nil
	}
	// The claim sees every row, late commits too, once the previous batch's
	// rows are gone and its floors moved (waitFinish).
	r.waitFinish()
	start := time.Now()
	if !r.floors.lastClaim.IsZero() && start.Sub(r.floors.lastClaim) > rewindGap {
		r.floors.forget() // a rewind this relay never read may have been deleted since
	}
	sweep := only == nil && r.sweepWanted.Swap(false)
	a := r.floors.args(r.floors.order(only), sweep)
	c, err := r.claim(ctx, &a)
	if err != nil {
		// Forget every floor: the next claims start at the slots' first rows.
		r.floors.forget()
		return claimed{}, gen, err
	}
	if !r.caughtUp.Load() && only == nil && len(c.meta.slots) > 0 && len(c.rows) < r.cfg.BatchSize && !slotCapped(c.rows, r.claimPerSlot()) {
		// Every slot it holds probed, less than a batch found
		// (TestCaughtUpOnlyOverHeldLanes).
		r.caughtUp.Store(true)
	}
	wasOff := r.floors.off
	r.floors.claimed(&c, r.claimPerSlot(), r.cfg.BatchSize, start, only == nil)
	if only == nil {
		r.offerLook(start)
	}
	if len(c.meta.slots) > 0 {
		r.sayFloor(ctx, wasOff, start)
		if off := r.floors.off; off != wasOff || r.floorOff.Load() == nil {
			r.floorOff.Store(&off) // for Stats, read by other goroutines
		}
	}
	if below := c.belowFloor(); len(below) > 0 {
		r.rowsBelowFloor.Add(uint64(len(below)))
		ids := make([]int64, 0, min(len(below), 10))
		for _, x := range below[:min(len(below), 10)] {
			ids = append(ids, x.id)
		}
		r.log.ErrorContext(ctx, "the sweep found committed rows below their slot's floor: the floor's rule let them pass; "+
			"they are published now, in order (please report this: docs/relay.md, The floor)",
			"rows", len(below), "first_ids", ids)
	}
	r.checkSlots(ctx, c.rows, start)
	return c, gen, nil
}

// checkSlots logs, at most once a minute, a keyed row whose slot is not the
// one its key hashes to (internal/slot): a writer that gave the slot itself
// and got it wrong. Its rows and the key's other rows may then sit in two
// lanes, owned by two instances, and overtake each other. The row is
// published all the same; the fix is in the writer (leave slot out: the
// outbox's trigger fills it in, docs/outbox-sql.md).
func (r *Relay) checkSlots(ctx context.Context, rows []row, now time.Time) {
	if now.Sub(r.floors.slotSaid) < time.Minute {
		return
	}
	for _, x := range rows {
		if x.key == nil {
			continue
		}
		if want := slot.Of(x.key, x.eventID); want != int(x.slot) {
			r.floors.slotSaid = now
			r.log.ErrorContext(ctx, "an outbox row's slot is not its key's: its writer set slot itself, and rows of one key in two slots may overtake each other; "+
				"leave slot out of the INSERT (docs/outbox-sql.md)", "row_id", x.id, "topic", x.topic, "slot", x.slot, "key_slot", want)
			return
		}
	}
}

// claim runs pgbox_outbox_claim2 with a's arguments.
//
// Its result is read with scan targets declared once per claim, not per
// row, and without pointers to pointers: a row costs the allocations of
// what it keeps (its topic, key, value and headers), not one per column.
// Each row decodes only the columns its kind fills (claimCols): the
// claim-wide columns (the sequence, ident, the rewinds, the snapshot...)
// are computed once per claim and sent on the first slot row only
// (migration 00140; 00120 repeated them, the same, on every slot row).
func (r *Relay) claim(ctx context.Context, a *claimArgs) (claimed, error) {
	a.instance, a.lanes, a.perSlot, a.batch = r.id, r.cfg.Lanes, r.claimPerSlot(), r.cfg.BatchSize
	c := claimed{meta: claimMeta{sweep: a.sweep, rescanFrom: a.settled + 1}}
	if err := r.db.query(ctx, claimSQL, a.sql(), c.read); err != nil {
		return claimed{}, err
	}
	return c, nil
}

// read decodes claimSQL's result into c.
func (c *claimed) read(rows pgx.Rows) error {
	var (
		x                          row
		id, floor, seq, hw, rwSeen pgtype.Int8
		eventID                    pgtype.UUID
		topic, off, ident, snap    pgtype.Text
		createdAt                  pgtype.Timestamptz
		attempts                   pgtype.Int4
		reset, rescan              pgtype.Bool
		rwSlots                    []int32
		rwFrom                     []int64
	)
	// The columns, as claimSQL returns them; nil skips a column. A row
	// fills its own ten; the first slot row the slot's (slot, epoch,
	// floor) and the claim-wide ones; the other slot rows only the
	// slot's.
	all := [claimCols]any{&id, &eventID, &x.slot, &topic, &x.key, &x.value, &x.headers, &createdAt, &attempts, &x.epoch,
		&floor, &seq, &hw, &off, &ident, &reset, &rwSeen, &rwSlots, &rwFrom, &rescan, &snap}
	var rowDest, firstSlotDest, slotDest [claimCols]any
	copy(rowDest[:10], all[:10])
	firstSlotDest[0], firstSlotDest[2] = all[0], all[2]
	copy(firstSlotDest[9:], all[9:])
	slotDest[2], slotDest[9], slotDest[10] = all[2], all[9], all[10]
	firstSlot := true
	for rows.Next() {
		// Nothing carries over from the previous row (pgx zeroes what it
		// scans into, too). A row has an id; a slot row has none.
		x = row{}
		if rows.RawValues()[0] != nil {
			if err := rows.Scan(rowDest[:]...); err != nil {
				return err
			}
			x.id, x.eventID, x.topic, x.createdAt, x.attempts = id.Int64, eventID.Bytes, topic.String, createdAt.Time, attempts.Int32
			c.rows = append(c.rows, x)
			continue
		}
		// A probed slot.
		dest := &slotDest
		if firstSlot {
			dest = &firstSlotDest
		}
		if err := rows.Scan(dest[:]...); err != nil {
			return err
		}
		m := &c.meta
		m.slots, m.epochs, m.floors = append(m.slots, x.slot), append(m.epochs, x.epoch), append(m.floors, floor.Int64)
		if firstSlot {
			firstSlot = false
			if seq.Valid {
				v := seq.Int64
				m.seqLast = &v
			}
			m.seqHW, m.seqOff, m.ident, m.reset = hw.Int64, off.String, ident.String, reset.Bool
			m.rewindSeen, m.rwSlots, m.rwFrom, m.rescan, m.snap = rwSeen.Int64, rwSlots, rwFrom, rescan.Bool, snap.String
		}
	}
	return rows.Err()
}

// claimCols is how many columns claimSQL returns.
const claimCols = 21

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// floorOffSayEvery is how often the relay repeats, while floors are off,
// why they are.
const floorOffSayEvery = 15 * time.Minute

// sayFloor logs when the floor turns off or on, and every floorOffSayEvery
// while it stays off, naming the cause and the fix.
func (r *Relay) sayFloor(ctx context.Context, wasOff string, now time.Time) {
	off := r.floors.off
	switch {
	case off == "" && wasOff != "":
		r.log.InfoContext(ctx, "claims start at each slot's floor again", "was_off", wasOff)
		return
	case off == "":
		return
	case off == wasOff && now.Sub(r.floors.offSaid) < floorOffSayEvery:
		return
	}
	r.floors.offSaid = now
	r.log.WarnContext(ctx, floorOffText(off)+": claims start at each slot's first row, so a held xmin horizon slows them "+
		"(docs/relay.md, The floor)", "floor_off", off)
}

// floorOffText names why the floor is off, and the fix.
func floorOffText(off string) string {
	switch off {
	case "cache":
		return "the outbox id sequence (pgbox_outbox_id_seq) caches values per session, so ids are not handed out in order; " +
			"ALTER SEQUENCE pgbox_outbox_id_seq CACHE 1"
	case "privilege":
		return "the relay's role may not read the outbox id sequence; GRANT SELECT ON SEQUENCE pgbox_outbox_id_seq TO <the relay's role>"
	case "marker":
		return "the relay's role may not write pgbox_relay_marker; GRANT SELECT, INSERT, UPDATE ON pgbox_relay_marker TO <the relay's role>"
	case "trigger":
		return "the outbox's trigger that takes each writer's transaction id first is not enabled always (ALTER TABLE ... DISABLE TRIGGER, pg_restore --disable-triggers); " +
			"ALTER TABLE pgbox_outbox ENABLE ALWAYS TRIGGER pgbox_outbox_xid_first"
	}
	return "the floor is off (" + off + ")"
}
