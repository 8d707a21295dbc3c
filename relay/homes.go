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
// so a pool of fewer than four has none. A target whose home is taken
// takes another home's free connection before it waits for the pool, and
// while anyone waits for the pool (a target, the idle poll, the watch) no
// home keeps a connection given back: it goes to the pool, so a target
// whose statements hang (holding its home's connection and others) never
// leaves the rest waiting on homes that keep theirs. A home gives its connection back
// to the pool after homeIdle unused (a quiet target holds nothing) and
// after homeFor in all (so the pool's MaxConnLifetime and health checks
// apply to it as to the others), and when the Fleet no longer serves the
// pool's targets.

const (
	homeIdle = time.Second
	homeFor  = time.Minute
)

// homes are one pool's home connections.
type homes struct {
	mu      sync.Mutex
	slots   []home
	next    int          // the next target's home
	closed  bool         // the connections go back to the pool from now on
	waiting atomic.Int32 // acquires waiting for the pool (acquire)
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

// take is home i's connection if it is free (i >= 0), else, if others,
// another home's free one, which leaves that home (it may become i's),
// else nil.
func (h *homes) take(i int, others bool) *pgxpool.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i >= 0 {
		if s := &h.slots[i]; s.c != nil && !s.out {
			s.out = true
			return s.c
		}
	}
	for j := range h.slots {
		if !others {
			break
		}
		if s := &h.slots[j]; s.c != nil && !s.out {
			c := s.c
			*s = home{}
			return c
		}
	}
	return nil
}

// acquire is a connection of pool: home i's when free (i >= 0), else the
// pool's, or another home's free one when the pool has none to give
// without waiting, else the pool's, counted as waiting meanwhile. A nil
// h has no homes.
func (h *homes) acquire(ctx context.Context, pool *pgxpool.Pool, i int) (*pgxpool.Conn, error) {
	if h == nil {
		return pool.Acquire(ctx)
	}
	if c := h.take(i, exhausted(pool)); c != nil {
		return c, nil
	}
	h.waiting.Add(1)
	defer h.waiting.Add(-1)
	return pool.Acquire(ctx)
}

// exhausted reports whether pool.Acquire would wait: no idle connection,
// and no room for a new one.
func exhausted(pool *pgxpool.Pool) bool {
	st := pool.Stat()
	return st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns()
}

// keep takes c back for home i, or reports false: c goes back to the pool.
func (h *homes) keep(i int, c *pgxpool.Conn) bool {
	usable := !c.Conn().IsClosed() && c.Conn().PgConn().TxStatus() == 'I' && !c.Conn().PgConn().IsBusy() &&
		h.waiting.Load() == 0 // else the pool hands it to one waiting
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
// not out when closing.
func (h *homes) tidy(now time.Time, closing bool) {
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
		case now := <-t.C:
			f.mu.Lock()
			served := map[*pgxpool.Pool]bool{}
			for _, ft := range f.targets {
				served[ft.t.Pool] = true
			}
			for p, h := range f.homes {
				if h != nil {
					h.tidy(now, !served[p])
				}
				if !served[p] {
					delete(f.homes, p)
				}
			}
			f.mu.Unlock()
			continue
		}
		f.mu.Lock()
		for p, h := range f.homes {
			if h != nil {
				h.tidy(time.Now(), true)
			}
			delete(f.homes, p)
		}
		f.mu.Unlock()
		return
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
