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
// free and any of the pool's otherwise, and a statement's connection
// becomes its home's when the home has none. A backend then serves the
// schemas of its home's targets.
//
// A pool keeps two connections outside the homes (one for the idle poll
// and the busy targets' watch, one for whichever target's home is taken),
// so a pool of fewer than four has none. While an acquire has waited
// more than homeWait for the pool, no home keeps a connection given back:
// the pool hands it to the one waiting. A target whose statements hang
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
)

// homes are one pool's home connections.
type homes struct {
	mu      sync.Mutex
	slots   []home
	next    int          // the next target's home
	closed  bool         // the connections go back to the pool from now on
	waiting atomic.Int32 // acquires that have waited homeWait for the pool
}

type home struct {
	c      *pgxpool.Conn // nil: none yet
	out    bool          // a statement runs on c
	since  time.Time     // c became this home's
	idleAt time.Time     // c came back
}

// newHomes are pool's homes: nil when the pool is too small for any.
func newHomes(pool *pgxpool.Pool) *homes {
	n := int(pool.Config().MaxConns) - 2
	if n < 2 {
		return nil
	}
	return &homes{slots: make([]home, n)}
}

// assign is the home of the pool's next target.
func (h *homes) assign() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := h.next % len(h.slots)
	h.next++
	return i
}

// take is home i's connection if it is free, else nil.
func (h *homes) take(i int) *pgxpool.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i < 0 {
		return nil
	}
	s := &h.slots[i]
	if s.c == nil || s.out {
		return nil
	}
	s.out = true
	return s.c
}

// acquire is a connection of pool: home i's when free (i >= 0), else the
// pool's; once it has waited homeWait, counted in waiting. A nil h has no
// homes.
func (h *homes) acquire(ctx context.Context, pool *pgxpool.Pool, i int) (*pgxpool.Conn, error) {
	if h == nil {
		return pool.Acquire(ctx)
	}
	if c := h.take(i); c != nil {
		return c, nil
	}
	actx, cancel := context.WithTimeout(ctx, homeWait)
	c, err := pool.Acquire(actx)
	cancel()
	if err == nil || ctx.Err() != nil || actx.Err() == nil {
		return c, err
	}
	h.waiting.Add(1)
	defer h.waiting.Add(-1)
	return pool.Acquire(ctx)
}

// keep takes c back for home i, or reports false: c goes back to the pool.
func (h *homes) keep(i int, c *pgxpool.Conn) bool {
	usable := !c.Conn().IsClosed() && c.Conn().PgConn().TxStatus() == 'I' && !c.Conn().PgConn().IsBusy() &&
		h.waiting.Load() == 0 // else the pool hands it to the one waiting
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &h.slots[i]
	switch {
	case s.c == c:
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
	for i := range h.slots {
		s := &h.slots[i]
		if s.c != nil && !s.out && (h.closed || now.Sub(s.idleAt) >= homeIdle) {
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
