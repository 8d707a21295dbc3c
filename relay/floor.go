package relay

import (
	"slices"
	"strconv"
	"strings"
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
// and no row below it can still appear, except rows of the long writers
// the floors passed (below).
//
// That last part is the sequence-gap race: ids are taken at insert, rows
// appear at commit, so a row with a low id can appear after rows with
// higher ids were published. The floor passes an id only once every
// transaction that could hold such an id has ended or is watched:
//
//   - every writer takes its transaction id before its rows take ids from
//     the sequence: a statement-level trigger does it before any row of an
//     INSERT, INSERT ... SELECT or COPY is computed (migration 00120), so
//     no writer has to know;
//   - each claim reads the sequence's last value V; the statement that then
//     records the claim's batch (finishSQL) gets its transaction id F after
//     that read, so every transaction holding an id up to V has a
//     transaction id below F (transaction ids are handed out in order);
//   - F has committed, so a later claim's snapshot lists every one of them
//     still running (F is below that snapshot's xmax). If it lists none, V
//     is settled: every row up to V is visible or never will be.
//   - If it lists some, and all of them were already running at the oldest
//     unsettled sample (long writers: an idle-in-transaction session, a
//     batch job), V is settled but for them: the floors may pass V
//     provisionally, and the claim is told those writers (p_writers). The
//     first claim whose rows' snapshot sees any of them ended starts every
//     slot at the settled bound again, in the same statement that reads
//     the ended writer's rows: one rescan per long writer, and its rows go
//     out in id order with the rows after them. A long writer costs a
//     rescan when it ends, not a walk per claim while it runs.
//
// A sequence set back (setval, RESTART, TRUNCATE ... RESTART IDENTITY)
// hands ids out again. The writers' triggers move it forward to at least
// pgbox_relay_marker.seq_hw (migrations 00120, 00170; read outside any
// snapshot, at any isolation level), which claims raise to what they read
// (trailing by up to 64), and a sample counts only up to the seq_hw its
// claim left (recorded): so what the floors settle is never handed out
// again.
//
// The claim function checks, before it reads any row, that nothing under
// the relay changed (claimSQL): the crash marker (crash recovery and a
// promotion empty it; they may hand out sequence values and transaction
// ids again), the database, the sequence's file node, the server's start,
// and a sequence read lower than one already seen (setval, RESTART,
// TRUNCATE ... RESTART IDENTITY, a restore). Any of them resets every floor
// to 0 in that very claim, and the relay forgets its samples.
//
// Read-only snapshot holders (pg_dump) have no transaction id and do not
// hold xmin back here: the floor moves on while VACUUM is held.
//
// A floor may pass rows a parked row holds back. Retrying or discarding a
// parked row (inspect) writes a rewind record in the same statement; the
// claim takes a lock that statement conflicts with, so the two never
// interleave, and lowers the slot's floor to the parked row's id. A floor
// established under another lane epoch counts as 0 (the function checks),
// and every floor is forgotten when a claim's answer is lost.
//
// The second line of defence (sweep.go): every SweepInterval a look on its
// own connection checks every owned slot below its floor; when it finds a
// row, one claim reads every owned slot from its start. A row that claim
// finds below where the floor would have started is a hole in the rule
// above: it is published like any other (in id order, so in key order)
// and counted, and the relay logs an ERROR
// (pgbox_relay_rows_below_floor_total).

// maxSamples bounds the sequence reads waiting to settle; samples whose
// writers are the same are merged, so it is only reached with that many
// distinct long writers, and new reads are then dropped (floors wait).
const maxSamples = 64

// rewindGap: a relay that has not claimed for this long forgets its floors:
// operator actions delete rewinds older than an hour (inspect), and a relay
// must not miss one.
const rewindGap = 10 * time.Minute

// seqSample is one claim's sequence read and the transaction id of the
// statement that recorded its batch.
type seqSample struct{ last, xid int64 }

// floorState is the work loop's memory of the slots; only the work loop
// goroutine touches it (finish's results are applied by waitFinish).
type floorState struct {
	floor  [slot.Count]int64
	epoch  [slot.Count]int64 // the lane epoch floor was established under; 0: none
	probed [slot.Count]time.Time
	owned  slotSet // the owned slots, as the last claim of every slot found them

	pending []seqSample
	settled int64   // no row with an id up to settled can still appear
	prov    int64   // nor up to prov, except rows of writers
	writers []int64 // the long writers prov passes

	ident      string // what the floors were established under (claimSQL)
	seqSeen    int64  // the highest sequence value read since ident
	rewindSeen int64  // the newest rewind applied
	lastClaim  time.Time
	off        string    // why floors are off ("": they are on), as the last claim said
	offSaid    time.Time // when off was last logged

	sweepAt  time.Time // the last look offered (sweep.go)
	slotSaid time.Time // when checkSlots last logged
	// hook, when set (tests), runs after the floors moved: a test that
	// breaks the floor's rule on purpose shows the sweep catches it.
	hook func(*floorState)
}

// claimArgs are pgbox_outbox_claim2's arguments beyond the instance and
// lanes: see claimSQL.
type claimArgs struct {
	slots            []int32
	floors, epochs   []int64
	ident            string
	seqSeen, rewinds int64
	settled          int64
	writers          []int64
	sweep            bool
	perSlot, batch   int
	instance         string
	lanes            int
}

func (a *claimArgs) sql() []any {
	return []any{a.instance, a.lanes, a.slots, a.floors, a.epochs, a.ident, a.seqSeen, a.rewinds,
		a.settled + 1, a.writers, a.sweep, a.perSlot, a.batch}
}

// args returns the claim's arguments for slots.
func (f *floorState) args(slots []int32, sweep bool) claimArgs {
	a := claimArgs{slots: slots, floors: make([]int64, len(slots)), epochs: make([]int64, len(slots)),
		ident: f.ident, seqSeen: f.seqSeen, rewinds: f.rewindSeen, settled: f.settled,
		writers: f.writers, sweep: sweep}
	if a.writers == nil {
		a.writers = []int64{}
	}
	for i, s := range slots {
		a.floors[i], a.epochs[i] = f.floor[s], f.epoch[s]
	}
	return a
}

// forget drops every floor and every sample.
func (f *floorState) forget() {
	f.epoch, f.pending, f.settled, f.prov, f.writers = [slot.Count]int64{}, nil, 0, 0, nil
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
// owned is what the last claim that asked for every slot found, so a
// slot no recent pass named still counts.
func (f *floorState) stale(now time.Time, d time.Duration) bool {
	for s := range slot.Count {
		if f.owned.has(s) && now.Sub(f.probed[s]) > d {
			return true
		}
	}
	return false
}

// sweepDue reports whether the sweep's look is due.
func (f *floorState) sweepDue(now time.Time, every time.Duration) bool {
	return every > 0 && now.Sub(f.sweepAt) >= every
}

// snapshot is a pg_snapshot: xmin, xmax and the running transaction ids.
type snapshot struct {
	xmin, xmax int64
	xip        []int64 // sorted
}

// parseSnapshot reads pg_snapshot's text form, "xmin:xmax:xip,xip,...".
func parseSnapshot(s string) (snapshot, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshot{}, false
	}
	var sn snapshot
	var err error
	if sn.xmin, err = strconv.ParseInt(parts[0], 10, 64); err != nil {
		return snapshot{}, false
	}
	if sn.xmax, err = strconv.ParseInt(parts[1], 10, 64); err != nil {
		return snapshot{}, false
	}
	if parts[2] != "" {
		for x := range strings.SplitSeq(parts[2], ",") {
			v, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return snapshot{}, false
			}
			sn.xip = append(sn.xip, v)
		}
	}
	slices.Sort(sn.xip)
	return sn, true
}

// runningBelow is how many transactions the snapshot lists as running
// with an id below xid (the first that many of xip).
func (s *snapshot) runningBelow(xid int64) int {
	n, _ := slices.BinarySearch(s.xip, xid)
	return n
}

// settle moves settled and prov as far as snapshot sn allows (see the
// package comment above): a sample no running transaction is below is
// settled; the newest sample whose running transactions are exactly the
// oldest sample's (the long writers) is settled but for them.
func (f *floorState) settle(sn snapshot) {
	kept := f.pending[:0]
	for _, p := range f.pending {
		if p.xid >= sn.xmax { // not possible for a committed F; keep it safe
			kept = append(kept, p)
			continue
		}
		if sn.runningBelow(p.xid) == 0 {
			f.settled = max(f.settled, p.last)
			continue
		}
		kept = append(kept, p)
	}
	f.pending = kept
	f.prov, f.writers = f.settled, nil
	if len(f.pending) == 0 {
		return
	}
	long := sn.runningBelow(f.pending[0].xid)
	f.writers = slices.Clone(sn.xip[:long])
	// Samples whose writers are the same settle together: keep the newest.
	merged := f.pending[:0]
	for i, p := range f.pending {
		n := sn.runningBelow(p.xid)
		if n == long {
			f.prov = max(f.prov, p.last)
		}
		if i+1 < len(f.pending) && sn.runningBelow(f.pending[i+1].xid) == n {
			continue
		}
		merged = append(merged, p)
	}
	f.pending = merged
}

// claimed records a claim: the floors and epochs it used, which slots it
// probed, and what it says of the server and the sequence. It leaves in c
// what moving the floors after the batch is recorded needs (floorMove).
func (f *floorState) claimed(c *claimed, perSlot, batch int, at time.Time, full bool) {
	m := &c.meta
	f.lastClaim = at
	if full {
		f.owned = slotSet{}
		for _, s := range m.slots {
			f.owned.add(int(s))
		}
	}
	if len(m.slots) == 0 {
		return
	}
	f.off = m.seqOff
	if m.reset || m.ident != f.ident {
		f.forget()
		f.ident, f.seqSeen = m.ident, 0
	}
	if m.seqLast != nil {
		f.seqSeen = max(f.seqSeen, *m.seqLast)
	}
	f.rewindSeen = max(f.rewindSeen, m.rewindSeen)
	for i, s := range m.rwSlots {
		if s >= 0 && s < slot.Count {
			f.floor[s] = min(f.floor[s], m.rwFrom[i])
		}
	}
	if m.rescan {
		// A long writer ended: its rows may lie below the floors of slots
		// this claim did not probe too (the probed ones started at
		// rescanFrom already). Once it leaves writers, nothing else
		// would bring those slots back to its rows.
		for s := range slot.Count {
			f.floor[s] = min(f.floor[s], m.rescanFrom)
		}
	}
	if sn, ok := parseSnapshot(m.snap); ok {
		f.settle(sn)
	}
	// The writers' trigger never lets the sequence hand out an id at or
	// below seq_hw again (a sequence reset, migration 00120): floors stay
	// at or below it + 1, so ids a reset hands out again are never below one.
	f.prov = min(f.prov, m.seqHW)

	// A slot was probed unless the batch filled up before the claim reached
	// it: after the last row's slot, nothing was read.
	var lastSlot int16 = -1
	if len(c.rows) >= batch {
		lastSlot = c.rows[len(c.rows)-1].slot
	}
	var probed slotSet
	reached := true
	for i, s := range m.slots {
		start := m.floors[i]
		if m.sweep {
			start = 0
		}
		f.floor[s], f.epoch[s] = start, m.epochs[i]
		if reached {
			f.probed[s] = at
			probed.add(int(s))
		}
		if s == lastSlot {
			reached = false
		}
	}
	c.move = floorMove{bound: f.prov, perSlot: perSlot, truncated: lastSlot, probed: probed}
	if m.seqLast == nil {
		c.move.bound = 0 // floors are off: nothing to move
	}
}

// belowFloor counts the rows of a sweep that lie below where their slot's
// claim would have started: each one a row the floor's rule let pass.
func (c *claimed) belowFloor() []row {
	if !c.meta.sweep {
		return nil
	}
	start := make(map[int16]int64, len(c.meta.slots))
	for i, s := range c.meta.slots {
		start[s] = c.meta.floors[i]
	}
	var out []row
	for _, x := range c.rows {
		if x.id < start[x.slot] {
			out = append(out, x)
		}
	}
	return out
}

// floorMove is what a claim lets the floors rise to once its batch is
// recorded: for each probed slot, the first row not published, or past the
// last row claimed (or to the bound when the slot gave fewer rows than it
// could), never past bound+1.
type floorMove struct {
	bound     int64
	perSlot   int
	truncated int16   // the slot the full batch ended in (its rows may go on); -1: none
	probed    slotSet // the slots the claim read
}

// recorded notes that the statement recording c's batch ran as
// transaction xid (after c's sequence read), and raises the floors.
func (f *floorState) recorded(c *claimed, xid int64, published map[int64]bool) {
	if c.meta.seqLast != nil && c.meta.ident == f.ident && len(f.pending) < maxSamples &&
		(len(f.pending) == 0 || f.pending[len(f.pending)-1].xid < xid) {
		// Never above the seq_hw the claim left: the writers' triggers
		// never hand out an id at or below it again (they move a reset
		// sequence forward to at least the seq_hw they read, outside any
		// snapshot, after taking their transaction id: a writer that read
		// an older one took its transaction id before this claim raised
		// it, so below xid; migration 00170). Ids above it may be handed out
		// again (a reset to at or above seq_hw, a writer that read seq_hw
		// just before a claim that had read the sequence before the reset
		// raised it), and a settled bound above it let the floors pass
		// them once seq_hw rose (migration 00170's header,
		// TestSequenceResetUnderALateClaimKeepsFirstRows,
		// TestAttack170ResetAtOrAboveSeqHWIsNotCounted). The floors are
		// capped at seq_hw anyway: this costs nothing.
		f.pending = append(f.pending, seqSample{last: min(*c.meta.seqLast, c.meta.seqHW), xid: xid})
	}
	f.moved(c, published)
}

// moved raises the floors of the slots a claim probed, once its batch is
// recorded; published is the set of ids now gone.
func (f *floorState) moved(c *claimed, published map[int64]bool) {
	defer func() {
		if f.hook != nil {
			f.hook(f)
		}
	}()
	if len(c.meta.slots) == 0 || c.meta.ident != f.ident {
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
	for i, sl := range c.meta.slots {
		start := c.meta.floors[i]
		if c.meta.sweep {
			start = 0
		}
		if f.epoch[sl] != c.meta.epochs[i] || f.floor[sl] != start {
			continue // a later claim (or forget, or a rewind) has been here
		}
		if !c.move.probed.has(int(sl)) {
			continue
		}
		to := c.move.bound + 1
		s := per[sl]
		switch {
		case s == nil:
		case s.firstBad != 0:
			to = min(to, s.firstBad)
		case s.n >= c.move.perSlot || sl == c.move.truncated:
			to = min(to, s.last+1)
		}
		f.floor[sl] = max(f.floor[sl], to)
	}
}
