package relay

import (
	"cmp"
	"context"
	"time"
)

// How a relay learns of new rows without taxing the writers.
//
// A pg_notify in every writer transaction serializes the commits of all
// notifying transactions in the cluster (NOTIFY takes a database-wide lock
// at commit). So the relay splits the work:
//
//   - Awake (rows found in the last busyWindow): every BusyPollInterval it
//     runs watchSQL, an index range scan over the ids above a floor, and
//     probes the slots of the rows it finds. Writers send nothing.
//   - Asleep (busyWindow without rows): it sets its instance row's sleeping
//     flag and waits for a notification, or for PollInterval. Writers with
//     outbox.Config.Notify notify only while some live instance sleeps.
//
// The floor lags the newest id the relay has seen by watchLag to
// 2*watchLag, so a row whose transaction took its id early but committed
// after later ids (ids are taken at insert, rows appear at commit) is still
// found when it commits, as long as that is within watchLag. Rows that
// commit later than that, and rows of a writer that read the flag just
// before it was set, are found by the next full poll (PollInterval:
// probeAllEvery), as rows written without Notify
// always were: the watch and the flag only shorten the wait, correctness
// never depends on them.

// watchLag is the least the watch floor lags the newest id seen.
const watchLag = 200 * time.Millisecond

// sleepGrace is how long the relay keeps watching after setting its
// sleeping flag: writers whose statement started before the flag committed
// did not notify.
const sleepGrace = 2 * watchLag

// watchLimit bounds the rows one watch reads (rows claimed and not yet
// deleted are in the window too).
const watchLimit = 1000

// watchSQL returns the newest id above $1 and the distinct slots of the
// unparked rows there, reading at most $2 rows in id order (primary key).
const watchSQL = `SELECT coalesce(max(id), 0)::bigint, coalesce(array_agg(DISTINCT slot), '{}')::int[]
FROM (SELECT id, slot FROM pgbox_outbox WHERE id > $1 AND parked_at IS NULL ORDER BY id LIMIT $2) w`

// watchStartSQL is where the watch starts: rows at or below the newest id
// at start are found by the first pass, which probes every slot.
const watchStartSQL = `SELECT coalesce(max(id), 0)::bigint FROM pgbox_outbox`

// setSleepingSQL sets the instance's sleeping flag; it reports false when
// the instance row does not exist yet (before the first heartbeat).
const setSleepingSQL = `UPDATE pgbox_relay_instances SET sleeping = $2 WHERE instance = $1`

// watcher is the work loop's wake-up state; only the work loop touches it.
type watcher struct {
	seen      int64     // the newest id claimed or watched
	floor     int64     // watchSQL's $1
	sample    int64     // seen at sampledAt: the next floor
	sampledAt time.Time //
	asleep    bool      // the sleeping flag is set in the database
	asleepAt  time.Time // when it was set, or the relay last woke from dormancy
	counted   bool      // counted in a Fleet's watchers (countWatching)
	// graceUntil: keep watching until then although the busy window is over
	// (after setting the flag, or when setting it failed).
	graceUntil time.Time
}

func (w *watcher) saw(id int64) { w.seen = max(w.seen, id) }

// moveFloor raises the floor to what was seen watchLag ago, at most once
// every watchLag.
func (w *watcher) moveFloor(now time.Time) {
	if now.Sub(w.sampledAt) >= watchLag {
		w.floor, w.sample, w.sampledAt = w.sample, w.seen, now
	}
}

// startWatch places the floor at the newest row: the first pass probes
// every slot anyway.
func (r *Relay) startWatch(ctx context.Context, w *watcher) {
	var top int64
	if err := r.db.queryRow(ctx, watchStartSQL, nil, &top); err != nil {
		top = 0 // the watch then starts from the bottom: slower, still right
	}
	w.seen, w.floor, w.sample, w.sampledAt = top, top, top, time.Now()
}

// waitForWork blocks until there may be rows to claim: a notification, a
// watch that found rows, or a poll. full reports whether the next pass must
// probe every owned slot (a poll, a new flag) rather than the slots named.
func (r *Relay) waitForWork(ctx context.Context, w *watcher, busyUntil time.Time) (full bool) {
	for {
		now := time.Now()
		watchUntil := later(busyUntil, w.graceUntil)
		if !now.Before(watchUntil) && !w.asleep && !r.cfg.NoListen {
			w.graceUntil = now.Add(sleepGrace)
			if r.setSleeping(ctx, true) {
				w.asleep, w.asleepAt = true, now
				// Probe everything once more: rows committed before the
				// flag was visible came with no notification.
				return true
			}
			// No flag (the instance row is not there yet, or the database
			// failed): no notifications either, so keep watching and try
			// again after the grace.
			watchUntil = w.graceUntil
		}
		watching := now.Before(watchUntil)
		r.countWatching(w, watching)
		if !watching && w.asleep && r.mayIdle() {
			// The Fleet polls for it (dormant.go).
			if r.idleWait(ctx, w) {
				return false
			}
			continue
		}
		wait := r.cfg.PollInterval
		if watching && r.shared != nil {
			// A Fleet's relay: its pool's watch asks for it (sharedwatch.go).
			if r.waitShared(ctx, w, watchUntil) || ctx.Err() != nil {
				return ctx.Err() != nil
			}
			continue
		}
		if watching {
			// Wake at the end of the watch at the latest, to set the flag.
			wait = min(r.watchEvery(), watchUntil.Sub(now))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return true
		case <-r.wake:
			t.Stop()
			return false
		case <-t.C:
		}
		if !watching {
			if r.fleetListens && r.nothingToClaim(ctx) {
				continue // the idle poll found the outbox empty: sleep on
			}
			return true // the idle poll
		}
		if r.watch(ctx, w) {
			return false
		}
	}
}

// emptySQL reports whether the outbox holds no row a claim could take (no
// unparked row, whoever's lane it is in, whatever its floor): a Fleet
// target's idle poll asks it first, for far less than a claim that probes
// every slot costs (a thousand idle targets polling every second). Rows
// not visible yet are no more visible to a claim. A relay alone claims at
// each idle poll: what the claim does besides (floor warnings, the sweep's
// look) then goes on while idle, as it always did.
const emptySQL = `SELECT NOT EXISTS (SELECT 1 FROM pgbox_outbox WHERE parked_at IS NULL)`

// nothingToClaim reports whether the idle poll may skip its pass: the
// outbox holds no unparked row and no sweep is due. An error says no: the
// pass then runs and reports it.
//
// The question has no lower bound (a row below a slot's floor counts: a
// retried parked row, a long writer's), so under a held xmin horizon it
// reads every deleted row the hold keeps, where a claim starts each slot
// at its floor. When it took longer than emptySlow, the relay claims at
// its idle polls for emptyPause instead of asking.
func (r *Relay) nothingToClaim(ctx context.Context) bool {
	if r.sweepWanted.Load() || time.Now().Before(r.emptyPausedUntil) {
		return false
	}
	var empty bool
	t0 := time.Now()
	err := r.db.queryRow(ctx, emptySQL, nil, &empty)
	if took := time.Since(t0); took > cmp.Or(r.emptySlow, emptySlow) {
		r.emptyPausedUntil = time.Now().Add(emptyPause)
		r.log.DebugContext(ctx, "the idle poll's question is slow (a held horizon?): claiming at idle polls for a while",
			"took", took, "for", emptyPause)
	}
	return err == nil && empty
}

// emptySlow and emptyPause: see nothingToClaim.
const (
	emptySlow  = 10 * time.Millisecond
	emptyPause = 5 * time.Minute
)

// countWatching keeps a Fleet's count of its relays watching (watchEvery)
// in step with whether this one is: in its busy window or its grace after
// setting the sleeping flag, whether it sleeps or, without LISTEN, only
// polls after.
func (r *Relay) countWatching(w *watcher, watching bool) {
	if r.watchers == nil || watching == w.counted {
		return
	}
	w.counted = watching
	if watching {
		r.watchers.Add(1)
	} else {
		r.watchers.Add(-1)
	}
}

// watchEvery is how often the relay watches its table while awake:
// BusyPollInterval, or, for a Fleet's relay, slower when many of the
// Fleet's relays are watching at once, so that together they send at most
// FleetConfig.WatchRate watches a second.
func (r *Relay) watchEvery() time.Duration {
	if r.watchers == nil {
		return r.cfg.BusyPollInterval
	}
	return max(r.cfg.BusyPollInterval, time.Duration(r.watchers.Load())*time.Second/time.Duration(r.watchRate))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// watch runs watchSQL once; true when it found rows (their slots are marked
// dirty).
func (r *Relay) watch(ctx context.Context, w *watcher) bool {
	w.moveFloor(time.Now())
	var top int64
	var slots []int32
	if err := r.db.queryRow(ctx, watchSQL, []any{w.floor, watchLimit}, &top, &slots); err != nil {
		if ctx.Err() == nil {
			r.log.DebugContext(ctx, "watch failed; probing every slot", "error", err)
		}
		r.markAllDirty()
		return true // a pass surfaces (and backs off on) a lasting failure
	}
	if len(slots) == 0 {
		return false
	}
	w.saw(top)
	r.markSlots(slots)
	return true
}

// awake clears the sleeping flag after a pass found rows.
func (r *Relay) awake(ctx context.Context, w *watcher) {
	if w.asleep {
		w.asleep = false
		r.setSleeping(ctx, false) // if it fails, writers notify a little longer
	}
}

// setSleeping sets the instance's sleeping flag; false when it could not.
func (r *Relay) setSleeping(ctx context.Context, sleeping bool) bool {
	tag, err := r.db.exec(ctx, setSleepingSQL, r.id, sleeping)
	if err != nil {
		if ctx.Err() == nil {
			r.log.DebugContext(ctx, "setting the sleeping flag failed", "sleeping", sleeping, "error", err)
		}
		return false
	}
	return tag.RowsAffected() == 1
}
