package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A Fleet's targets each keep to a home connection of their pool.
//
// A backend keeps, per schema it served, the compiled claim function, its
// statements' plans, the relay's prepared statements and the catalog
// entries of that schema's tables. A pool hands out whichever connection
// is free, so a busy target's statements went to every connection of the
// pool in turn, and each backend built all of that for every busy schema:
// with a hundred busy targets on a pool of ten connections a thousand
// (backend, schema) pairs each planned, and a thousand schemas made it
// ten thousand, each claim in a cold pair taking tens of milliseconds
// (make tenants at 1,000 schemas: 71 ms a claim). So the Fleet spreads
// its targets over homes, connections it keeps out of the pool between a
// target's statements: a target takes its home's connection when it is
// free, waits for it (homeTurn at most) when a home-mate's statement has
// had it for less than homeTurn, and takes any of the pool's otherwise; a statement's
// connection becomes its home's when the home has none. A backend then
// serves the schemas of its home's targets.
//
// (Going to the pool as soon as the home's connection was out made the
// busy targets' latency at 1,000 schemas: the pool keeps only two
// connections besides the homes, the idle poll's and the watch's, so a
// target whose home-mate was claiming waited for the pool, up to
// homeWait, while the other homes' connections sat idle: half of the
// acquires waited more than 300 ms in some seconds. A home-mate's claim
// takes a millisecond or two.)
//
// A pool keeps two connections outside the homes (one for the idle poll
// and, in a pool of fewer than six, the busy targets' watch; one for
// whichever target's home is taken), so a pool of fewer than four has
// none; a pool of six or more keeps one more, the watch's (watchHome).
// While an acquire has waited
// more than homeWait for the pool (a lease statement: half of its
// bound, if less; waitBefore), no home keeps a connection given back,
// and one resting in its home goes back to the pool when it starts
// counting (giveBackIdle): the pool hands it to the one waiting. A target whose statements hang
// holds its home's connection and others, and what is left may be
// another home's, which that home's busy targets would keep using (the
// first version starved the hung target's home-mates so, 1 run in 3).
// Giving every connection back while anything waited at all, or after
// 100 ms, or taking another home's as soon as the pool had none free,
// undid the homes at 1,000 targets, where the pool is often short (p99
// 13 s to 83 s, against 0.57-0.69 s with a second, or without the rule).
//
// A home gives its connection back to the pool after homeIdle unused (a
// quiet target holds nothing) and after homeFor in all (so the pool's
// MaxConnLifetime and health checks apply to it as to the others), and
// when the Fleet no longer serves the pool's targets.

const (
	homeIdle = time.Second
	homeFor  = time.Minute
	homeWait = time.Second
	homeTurn = 250 * time.Millisecond
)

// homes are one pool's home connections.
type homes struct {
	mu      sync.Mutex
	slots   []home
	watch   *home        // the busy targets' watch's (watchHome); nil: none
	next    int          // the next target's home
	closed  bool         // the connections go back to the pool from now on
	waiting atomic.Int32 // acquires that have waited homeWait for the pool
}

type home struct {
	c      *pgxpool.Conn // nil: none yet
	out    bool          // a statement runs on c
	outAt  time.Time     // when it went out
	back   chan struct{} // closed when c comes back or leaves the home (made by a waiter)
	since  time.Time     // c became this home's
	idleAt time.Time     // c came back
}

// free ends home s's wait: those waiting for its connection try again.
func (s *home) free() {
	if s.back != nil {
		close(s.back)
		s.back = nil
	}
}

// newHomes are pool's homes: nil when the pool is too small for any.
func newHomes(pool *pgxpool.Pool) *homes {
	n := int(pool.Config().MaxConns) - 2
	if n < 2 {
		return nil
	}
	h := &homes{slots: make([]home, n)}
	if n >= watchHomeMin {
		h.slots, h.watch = h.slots[:n-1], &home{}
	}
	return h
}

// watchHome is the home index of the busy targets' watch (sharedwatch.go),
// which a pool of at least watchHomeMin+2 connections keeps for it, out
// of the targets' homes: the watch asks for all of its pool's busy
// targets, so it must not wait for the pool. (With the pool's two spare
// connections held by the idle poll and the figures' reader, which takes
// up to two of a pool's connections in `relay run --targets`, the watch
// waited homeWait for one, and every busy target's rows with it: rounds
// of 0.5-2 s, make tenants at 1,000 schemas.) -1 is no home: the pool's.
const watchHome = -2

// watchHomeMin: see watchHome.
const watchHomeMin = 4

// slot is home i (watchHome: the watch's), or nil: none. h.mu is held.
func (h *homes) slot(i int) *home {
	switch {
	case i == watchHome:
		return h.watch
	case i < 0 || i >= len(h.slots):
		return nil
	}
	return &h.slots[i]
}

// assign is the home of the pool's next target.
func (h *homes) assign() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := h.next % len(h.slots)
	h.next++
	return i
}

// take is home i's connection if it is free. Else, when a statement has
// had it for less than homeTurn, back is closed when it comes back, and
// left tells how long it is worth waiting: otherwise neither.
func (h *homes) take(i int, now time.Time) (c *pgxpool.Conn, back <-chan struct{}, left time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.slot(i)
	switch {
	case s == nil || s.c == nil:
		return nil, nil, 0
	case !s.out:
		s.out, s.outAt = true, now
		return s.c, nil, 0
	case now.Sub(s.outAt) >= homeTurn:
		return nil, nil, 0 // a long statement: the pool's
	}
	if s.back == nil {
		s.back = make(chan struct{})
	}
	return nil, s.back, homeTurn - now.Sub(s.outAt)
}

// acquire is a connection of pool: home i's when free (i >= 0), or once
// the statement on it ends if that is within homeTurn of its start and of
// the acquire's, else the pool's; once it has waited for the pool
// homeWait (a lease statement: half of what ctx leaves it, if less;
// waitBefore), counted in waiting. A nil h has no homes.
func (h *homes) acquire(ctx context.Context, pool *pgxpool.Pool, i int) (*pgxpool.Conn, error) {
	if h == nil {
		return pool.Acquire(ctx)
	}
	var until time.Time // the end of this acquire's wait for its home
	for {
		now := time.Now()
		c, back, left := h.take(i, now)
		if c != nil {
			return c, nil
		}
		if back == nil {
			break
		}
		// homeTurn bounds the whole wait, not each statement's: woken, a
		// waiter may find the connection out again (a home-mate that asks
		// again at once, or another waiter), with a fresh outAt each time,
		// and waited so for as long as those statements went on (30 s
		// behind one of 150 ms after another, TestHomesTurnWaitIsBounded).
		if until.IsZero() {
			until = now.Add(homeTurn)
		}
		if left = min(left, until.Sub(now)); left <= 0 {
			break
		}
		t := time.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-back:
		case <-t.C:
		}
		t.Stop()
	}
	actx, cancel := context.WithTimeout(ctx, waitBefore(ctx, time.Now()))
	c, err := pool.Acquire(actx)
	cancel()
	if err == nil || ctx.Err() != nil || actx.Err() == nil {
		return c, err
	}
	h.waiting.Add(1)
	defer h.waiting.Add(-1)
	h.giveBackIdle()
	return pool.Acquire(ctx)
}

// giveBackIdle gives the pool one home connection not out, for an
// acquire that counts in waiting: the pool hands it to the one waiting.
// (Only the connections given back after it counted went to the pool; one
// resting in a quiet home stayed there until tidy found it idle for
// homeIdle, up to two seconds more, TestHomesGiveAQuietHomesConnectionToAWaiter.)
// One: the targets' home that has rested longest, the watch's only when
// none rests. Giving every one back moved most homes to other backends
// for one acquire (the targets take them from the pool in any order;
// TestHomesGiveBackOneWaiterMovesOneHome), the watch's first, whose
// questions for every busy target are prepared on its backend
// (TestHomesGiveBackSparesTheWatch).
func (h *homes) giveBackIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s *home // the targets' home resting longest; else the watch's
	for i := range h.slots {
		if o := &h.slots[i]; o.c != nil && !o.out && (s == nil || o.idleAt.Before(s.idleAt)) {
			s = o
		}
	}
	if s == nil && h.watch != nil && h.watch.c != nil && !h.watch.out {
		s = h.watch
	}
	if s != nil {
		s.c.Release()
		*s = home{}
	}
}

// waitBefore is how long an acquire waits for the pool before it counts
// in waiting: homeWait; for a lease statement (leaseStatement: a
// heartbeat, a dormant target's renewal), bounded by LeaseTTL/2, half of
// what is left of its bound when that is less. Such a statement bounded
// more tightly than homeWait (0.5 s at a LeaseTTL of 1 s) never counted,
// so the homes kept their connections while it timed out again and again,
// and a hung target's home-mate lost its lease for good (1 run in 15 of
// TestHomesAttackLockedTargetStarvesHomeMates on a loaded machine;
// TestHomesGiveWayToABoundedAcquire). Other statements keep homeWait
// whatever their bound: giving way sooner undoes the homes (above), and
// one of them timing out costs a retry, not the lease (helper-43's review:
// the backlog count, bounded by HeartbeatInterval, counted after 50 ms at
// 100 ms, TestHomesWaitShortBoundGivesWayBeforeTheRejected100ms).
func waitBefore(ctx context.Context, now time.Time) time.Duration {
	if dl, ok := ctx.Deadline(); ok && ctx.Value(leaseKey{}) != nil {
		return min(homeWait, dl.Sub(now)/2)
	}
	return homeWait
}

// leaseKey marks a lease statement's context (leaseStatement).
type leaseKey struct{}

// leaseStatement is ctx for a statement that keeps the instance's lease:
// the homes give way to it sooner (waitBefore).
func leaseStatement(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaseKey{}, true)
}

// keep takes c back for home i, or reports false: c goes back to the pool.
func (h *homes) keep(i int, c *pgxpool.Conn) bool {
	usable := !c.Conn().IsClosed() && c.Conn().PgConn().TxStatus() == 'I' && !c.Conn().PgConn().IsBusy() &&
		h.waiting.Load() == 0 // else the pool hands it to the one waiting
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.slot(i)
	switch {
	case s == nil:
	case s.c == c:
		s.free()
		if !usable || h.closed || now.Sub(s.since) > homeFor {
			*s = home{}
			return false
		}
		s.out, s.idleAt = false, now
		return true
	case s.c == nil && usable && !h.closed:
		*s = home{c: c, since: now, idleAt: now}
		return true
	}
	return false
}

// tidy gives back the connections unused for homeIdle, or all that are
// not out when closing. A nil h has none.
func (h *homes) tidy(now time.Time, closing bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = h.closed || closing
	for i := watchHome; i < len(h.slots); i++ {
		s := h.slot(i)
		if s != nil && s.c != nil && !s.out && (h.closed || now.Sub(s.idleAt) >= homeIdle) {
			s.c.Release()
			*s = home{}
		}
	}
}

// acquire is a connection for d's statement: its home's when free.
func (d *db) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	return d.homes.acquire(ctx, d.pool, d.home)
}

// release gives c to d's home, or back to the pool.
func (d *db) release(c *pgxpool.Conn) {
	if d.homes == nil || !d.homes.keep(d.home, c) {
		c.Release()
	}
}

// homesLoop gives back the homes' unused connections every homeIdle, and
// all of them when ctx ends or the Fleet no longer serves their pool.
func (f *Fleet) homesLoop(ctx context.Context) {
	t := time.NewTicker(homeIdle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			f.tidyHomes(time.Now(), true)
			return
		case now := <-t.C:
			f.tidyHomes(now, false)
		}
	}
}

// tidyHomes tidies every pool's homes, and closes (and forgets) those of
// the pools the Fleet no longer serves, or all of them when stopping.
func (f *Fleet) tidyHomes(now time.Time, stopping bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	served := map[*pgxpool.Pool]bool{}
	for _, ft := range f.targets {
		served[ft.t.Pool] = true
	}
	for p, h := range f.homes {
		gone := stopping || !served[p]
		h.tidy(now, gone)
		if gone {
			delete(f.homes, p)
		}
	}
}

// homesOf is pool's homes, made if need be (nil: too small). f.mu is held.
func (f *Fleet) homesOf(pool *pgxpool.Pool) *homes {
	h, ok := f.homes[pool]
	if !ok {
		h = newHomes(pool)
		f.homes[pool] = h
	}
	return h
}
