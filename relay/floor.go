package relay

import (
	"slices"
	"time"

	"github.com/pgbox/pgbox/internal/slot"
)

// The floor: where each slot's claim starts.
//
// The relay deletes every row it publishes, and a held xmin horizon (a
// pg_dump, a long report, a replica's hot_standby_feedback) keeps the index
// entries of all of them. A claim that started at a slot's first entry
// walked every one of them, so its cost grew for as long as the hold
// lasted. Each slot's claim starts at its floor instead: every row of the
// slot below the floor is published, parked, or held back by a parked row,
// and no row below it can still appear.
//
// That last part is the sequence-gap race: ids are taken at insert, rows
// appear at commit, so a row with a low id can appear after rows with
// higher ids were published. The floor passes an id only once every
// transaction that could hold such an id has ended:
//
//   - outbox.Write takes its transaction id before the row takes its id
//     from the sequence;
//   - each claim reads the sequence's last value V; the statement that then
//     records the claim's batch (finishSQL) gets its transaction id F after
//     that read, so every transaction holding an id up to V has a
//     transaction id below F (transaction ids are handed out in order);
//   - F has committed, so any of them still running would be listed in a
//     later claim's snapshot; once that snapshot's xmin is above F, all of
//     them have ended and their rows are visible to that claim: V is
//     settled, and that claim may raise floors up to V+1 (seqSample, bound).
//
// (A snapshot's xmax will not do for F: it is the newest completed
// transaction id plus one, and a transaction that took its id later and
// still runs is in no snapshot's list below it.)
//
// A server restart (or a failover) may hand out sequence values again
// (the sequence's last WAL record may not have been flushed), and a floor
// could then pass a new row: the claim reports when the server started, and
// a change forgets every floor and every sample.
//
// Read-only snapshot holders (pg_dump) have no transaction id and do not
// hold xmin back here: the floor moves on while VACUUM is held. A long
// writing transaction does hold it: floors stop at the ids taken when it
// began, and claims walk the rows deleted since, until it ends.
//
// A floor may pass rows a parked row holds back. Retrying or discarding a
// parked row (inspect) writes a rewind record; the claim function lowers
// that slot's floor to the parked row's id. A floor established under
// another lane epoch counts as 0 (the function checks), and every floor is
// forgotten when a claim's answer is lost (it may have consumed a rewind).

// maxSamples bounds the sequence reads waiting to settle (a long writing
// transaction stops them settling); while it is full new reads are dropped,
// which only delays floors.
const maxSamples = 64

// seqSample is one claim's sequence read and the transaction id of the
// statement that recorded its batch.
type seqSample struct{ last, xid int64 }

// floorState is the work loop's memory of the slots; only the work loop
// goroutine touches it (finish's results are applied by waitFinish).
type floorState struct {
	floor   [slot.Count]int64
	epoch   [slot.Count]int64 // the lane epoch floor was established under; 0: none
	probed  [slot.Count]time.Time
	owned   slotSet // the owned slots among those the last claim asked for
	pending []seqSample
	bound   int64 // the newest settled sequence value
	started int64 // the server's start time the floors were established under
	warned  bool  // warnNoFloor said its piece
}

// args returns the remembered floor and its epoch for each slot.
func (f *floorState) args(slots []int32) (floors, epochs []int64) {
	floors, epochs = make([]int64, len(slots)), make([]int64, len(slots))
	for i, s := range slots {
		floors[i], epochs[i] = f.floor[s], f.epoch[s]
	}
	return floors, epochs
}

// forget drops every floor, and with everything a restarted server may
// have invalidated, every sample.
func (f *floorState) forget() {
	f.epoch, f.pending, f.bound = [slot.Count]int64{}, nil, 0
}

// order lists the slots to probe (all, or only's), least recently probed
// first, so that every slot with rows is visited however busy the others
// are.
func (f *floorState) order(only *slotSet) []int32 {
	out := make([]int32, 0, slot.Count)
	for s := range slot.Count {
		if only == nil || only.has(s) {
			out = append(out, int32(s))
		}
	}
	slices.SortStableFunc(out, func(a, b int32) int { return f.probed[a].Compare(f.probed[b]) })
	return out
}

// stale reports whether an owned slot went unprobed for longer than d.
func (f *floorState) stale(now time.Time, d time.Duration) bool {
	for s := range slot.Count {
		if f.owned.has(s) && now.Sub(f.probed[s]) > d {
			return true
		}
	}
	return false
}

// claimed records a claim: the floors and epochs it used, which slots it
// probed, and the sequence read that may settle later. It leaves in c what
// moving the floors after the batch is recorded needs (floorMove).
func (f *floorState) claimed(c *claimed, perSlot, batch int, at time.Time) {
	m := &c.meta
	if len(m.slots) == 0 {
		f.owned = slotSet{}
		return
	}
	if m.dbStarted != f.started {
		// A new server, or the first claim: nothing remembered holds.
		f.forget()
		f.started = m.dbStarted
		for i := range m.floors {
			m.floors[i] = 0
		}
	}
	// Settle what this snapshot's xmin allows.
	kept := f.pending[:0]
	for _, p := range f.pending {
		if p.xid < m.xmin {
			f.bound = max(f.bound, p.last)
		} else {
			kept = append(kept, p)
		}
	}
	f.pending = kept

	// A slot was probed unless the batch filled up before the claim reached
	// it: after the last row's slot, nothing was read.
	full := len(c.rows) >= batch
	var lastSlot int16 = -1
	if full {
		lastSlot = c.rows[len(c.rows)-1].slot
	}
	f.owned = slotSet{}
	var probed slotSet
	reached := true
	for i, s := range m.slots {
		f.owned.add(int(s))
		f.floor[s], f.epoch[s] = m.floors[i], m.epochs[i]
		if reached {
			f.probed[s] = at
			probed.add(int(s))
		}
		if s == lastSlot {
			reached = false
		}
	}
	c.move = floorMove{bound: f.bound, perSlot: perSlot, truncated: lastSlot, probed: probed}
}

// floorMove is what a claim lets the floors rise to once its batch is
// recorded: for each probed slot, the first row not published, or past the
// last row claimed (or to the settled bound when the slot gave fewer rows
// than it could), never past bound+1.
type floorMove struct {
	bound     int64
	perSlot   int
	truncated int16   // the slot the full batch ended in (its rows may go on); -1: none
	probed    slotSet // the slots the claim read
}

// recorded notes that the statement recording c's batch ran as
// transaction xid (after c's sequence read), and raises the floors.
func (f *floorState) recorded(c *claimed, xid int64, published map[int64]bool) {
	if c.meta.seqLast != nil && c.meta.dbStarted == f.started && len(f.pending) < maxSamples {
		f.pending = append(f.pending, seqSample{last: *c.meta.seqLast, xid: xid})
	}
	f.moved(c, published)
}

// moved raises the floors of the slots a claim probed, once its batch is
// recorded; published is the set of ids now gone.
func (f *floorState) moved(c *claimed, published map[int64]bool) {
	if len(c.meta.slots) == 0 {
		return
	}
	type slotRows struct {
		n        int
		last     int64
		firstBad int64
	}
	per := map[int16]*slotRows{}
	for _, x := range c.rows {
		s := per[x.slot]
		if s == nil {
			s = &slotRows{}
			per[x.slot] = s
		}
		s.n++
		s.last = x.id
		if !published[x.id] && s.firstBad == 0 {
			s.firstBad = x.id
		}
	}
	for i, slot := range c.meta.slots {
		if f.epoch[slot] != c.meta.epochs[i] || f.floor[slot] != c.meta.floors[i] {
			continue // a later claim (or forget) has been here
		}
		if !c.move.probed.has(int(slot)) {
			continue
		}
		to := c.move.bound + 1
		s := per[slot]
		switch {
		case s == nil:
		case s.firstBad != 0:
			to = min(to, s.firstBad)
		case s.n >= c.move.perSlot || slot == c.move.truncated:
			to = min(to, s.last+1)
		}
		f.floor[slot] = max(f.floor[slot], to)
	}
}
