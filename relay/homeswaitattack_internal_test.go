package relay

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A review of f5f8a9e (waitBefore: an acquire bounded more tightly than
// homeWait counted in waiting after half of what its ctx left it), by
// helper-43. Attacks 2 and 4 failed on f5f8a9e; since, only a lease
// statement (leaseStatement: a heartbeat, a dormant renewal) counts
// sooner than homeWait, and the tests say so.

// waitAttackPool is a pool of 4 (two homes) with nothing free but home 1's
// connection, which a busy target keeps (statements of 5 ms back to back):
// home 0's connection out for good (a hung statement), two more held.
// refused counts home 1's connections given back (keep refused them).
func waitAttackPool(t *testing.T) (pool *pgxpool.Pool, h *homes, refused, rounds *atomic.Int64) {
	t.Helper()
	ctx, stopBusy := context.WithCancel(context.Background())
	pool = poolOf(t, 4)
	h = newHomes(pool)
	require.NotNil(t, h)
	t.Cleanup(func() { h.tidy(time.Now(), true) })
	hangHome(t, pool, h, 0)
	holdConns(t, pool, 2)
	refused, rounds = &atomic.Int64{}, &atomic.Int64{}
	done := spin(func() bool {
		c, err := h.acquire(ctx, pool, 1)
		if err != nil {
			if ctx.Err() == nil {
				t.Error(err)
			}
			return false
		}
		time.Sleep(5 * time.Millisecond)
		if !h.keep(1, c) {
			refused.Add(1)
			c.Release()
		}
		rounds.Add(1)
		return true
	})
	t.Cleanup(func() { stopBusy(); done() })
	time.Sleep(20 * time.Millisecond) // home 1 has its connection
	return pool, h, refused, rounds
}

// Attack 1: a lease statement whose ctx is already over (a deadline past, a
// WithTimeout of 0 or less) fails at once and never counts in waiting:
// waitBefore <= 0 makes no deadline later than ctx's (WithDeadline keeps
// the parent's), and ctx.Err() is set before the check. One whose
// deadline is only microseconds away may count, for at most that long,
// and always counts down again (the deferred Add(-1)).
func TestHomesWaitExpiredBoundNeverCounts(t *testing.T) {
	pool, h, refused, _ := waitAttackPool(t)
	var seen atomic.Int32
	done := spyWaiting(h, func() { seen.Add(1) })
	for _, d := range []time.Duration{-time.Second, -time.Nanosecond, 0} {
		ctx, cancel := context.WithTimeout(leaseStatement(context.Background()), d)
		require.LessOrEqual(t, waitBefore(ctx, time.Now()), time.Duration(0), "over: %s", d)
		start := time.Now()
		c, err := h.acquire(ctx, pool, 0)
		cancel()
		require.Error(t, err, "bounded to %s", d)
		require.Nil(t, c)
		require.Less(t, time.Since(start), 50*time.Millisecond, "bounded to %s: fails at once", d)
	}
	// A deadline in the past but ctx's timer not yet run cannot be made
	// by WithDeadline (it cancels at once); a parent of its own Deadline
	// can: pastDeadline reports a deadline gone while Err is nil.
	ctx, cancel := context.WithCancel(context.Background())
	past := pastDeadline{leaseStatement(ctx), time.Now().Add(-time.Second)}
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err := h.acquire(past, pool, 0)
	require.Error(t, err)
	done()
	require.Zero(t, seen.Load(), "an acquire already over never counts in waiting")
	require.Zero(t, h.waiting.Load())
	require.Zero(t, refused.Load(), "no home gave its connection back")

	// Microseconds left: may count, never for long, always counted down.
	for range 200 {
		ctx, cancel := context.WithTimeout(leaseStatement(context.Background()), time.Duration(rand.IntN(2000))*time.Microsecond)
		c, err := h.acquire(ctx, pool, 0)
		cancel()
		if err == nil {
			c.Release()
		}
		require.Zero(t, h.waiting.Load(), "counted down once the acquire returns")
	}
	t.Logf("home 1's connection given back %d times by 200 acquires bounded under 2 ms", refused.Load())
}

// spyWaiting calls counted each time it reads h.waiting other than 0,
// reading without pause until the returned func is called.
func spyWaiting(h *homes, counted func()) (done func()) {
	return spin(func() bool {
		if h.waiting.Load() != 0 {
			counted()
		}
		return true
	})
}

// spin runs body in a goroutine of its own again and again, until it
// returns false or done is called (which waits for it to end).
func spin(body func() bool) (done func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !body() {
				return
			}
		}
	})
	return func() { close(stop); wg.Wait() }
}

// pastDeadline is a ctx whose deadline has gone while it is not yet done
// (a timer that has not run yet).
type pastDeadline struct {
	context.Context
	dl time.Time
}

func (p pastDeadline) Deadline() (time.Time, bool) { return p.dl, true }

// Attack 3: acquires of every bound (past, 0, microseconds, milliseconds,
// none) racing with the busy home's keeps and tidy, under -race: waiting
// is back to 0 once they all return, and the home keeps its connection
// again.
func TestHomesWaitStormCountsDownUnderRace(t *testing.T) {
	pool, h, refused, rounds := waitAttackPool(t)
	stopTidy := make(chan struct{})
	var tw sync.WaitGroup
	tw.Go(func() {
		for {
			select {
			case <-stopTidy:
				return
			case <-time.After(3 * time.Millisecond):
				h.tidy(time.Now(), false)
			}
		}
	})
	var got, failed atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for j := range 40 {
				var ctx context.Context
				var cancel context.CancelFunc
				switch (g + j) % 5 {
				case 0:
					ctx, cancel = context.WithTimeout(context.Background(), -time.Millisecond)
				case 1:
					ctx, cancel = context.WithTimeout(context.Background(), 0)
				case 2:
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rand.IntN(500))*time.Microsecond)
				case 3:
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(1+rand.IntN(30))*time.Millisecond)
				default:
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(time.Duration(rand.IntN(20))*time.Millisecond, cancel)
				}
				if g%2 == 0 {
					ctx = leaseStatement(ctx)
				}
				c, err := h.acquire(ctx, pool, j%2)
				cancel()
				if err != nil {
					failed.Add(1)
					continue
				}
				got.Add(1)
				if !h.keep(j%2, c) {
					c.Release()
				}
			}
		})
	}
	wg.Wait()
	close(stopTidy)
	tw.Wait()
	t.Logf("storm: %d acquires got a connection, %d failed; home 1 gave its connection back %d times", got.Load(), failed.Load(), refused.Load())
	// A storm acquire may have left home 1 a connection (keep: the home
	// had none) while the busy target waited in the pool: homesLoop's
	// tidy gives it back after homeIdle (pre-existing; not waitBefore's).
	h.tidy(time.Now().Add(homeIdle), false)
	time.Sleep(50 * time.Millisecond)
	require.Zero(t, h.waiting.Load(), "every acquire counted down")
	before, r0 := refused.Load(), rounds.Load()
	time.Sleep(100 * time.Millisecond)
	require.Zero(t, h.waiting.Load())
	require.Greater(t, rounds.Load(), r0, "the busy target runs")
	require.Equal(t, before, refused.Load(), "with nothing waiting the busy home keeps its connection again")
}

// Attack 2: the rule had no floor. The homes' header records that giving
// the connections back to an acquire that had waited 100 ms undid the
// homes at 1,000 targets (p99 13 s to 83 s); with f5f8a9e's waitBefore
// any acquire bounded to under 200 ms made them give way sooner than
// that. At the tests' settings (HeartbeatInterval 100 ms, LeaseTTL 1 s)
// the backlog count, bounded by HeartbeatInterval (countBacklog), counted
// after 50 ms. Failed on f5f8a9e; now only a lease statement counts
// sooner (a user's LeaseTTL of 300 ms: its heartbeat after 75 ms, by
// choice: the lease is worth more than the homes).
func TestHomesWaitShortBoundGivesWayBeforeTheRejected100ms(t *testing.T) {
	pool, h, refused, _ := waitAttackPool(t)
	bound := 100 * time.Millisecond // countBacklog's at HeartbeatInterval 100 ms
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	var counted atomic.Int64 // ns after start when waiting first read > 0
	done := spyWaiting(h, func() { counted.CompareAndSwap(0, int64(time.Since(start))) })
	c, err := h.acquire(ctx, pool, 0)
	took := time.Since(start)
	done()
	if err == nil {
		c.Release()
	}
	t.Logf("bounded to %s: counted in waiting after %s, acquire returned after %s (err %v); home 1 gave its connection back %d times",
		bound, time.Duration(counted.Load()), took, err, refused.Load())
	require.True(t, counted.Load() == 0 || time.Duration(counted.Load()) >= 100*time.Millisecond,
		"an acquire bounded to %s counted in waiting after %s: the homes give way sooner than the 100 ms the header says undid them", bound, time.Duration(counted.Load()))
}

// Attack 4: f5f8a9e's CHANGELOG said that at the default settings nothing
// changed but the start-up read of each target's rows (startRowsWait).
// That read (readStartRows: outboxstats.Rows, pool.Query) never goes
// through the homes at all, and the backlog count's 2 s bound
// (countBacklog, HeartbeatInterval) counted after 875 ms once it had
// waited out a home turn: failed on f5f8a9e. The bounded contexts that
// reach homes.acquire, at the defaults: the heartbeat's and dormantSQL's
// (beatContext, LeaseTTL/2 = 3 s), the backlog count's, the release at
// stop (StopTimeout 5 s), the idle poll's and the watch's (askOn,
// max(LeaseTTL, 5 s)), finish (2 min) and the sweep's look (1 min). Now
// only a lease statement that has already waited over a second (for its
// slot, MaxConnsPerTarget) counts sooner than homeWait.
func TestHomesWaitDefaultsChangeOnlyALateLeaseStatement(t *testing.T) {
	cfg := Config{}
	cfg.HeartbeatInterval = HeartbeatIntervalDefault
	cfg.LeaseTTL = LeaseTTLDefault
	cfg.StopTimeout = StopTimeoutDefault
	start := time.Now()
	bg, lease := context.Background(), leaseStatement(context.Background())
	for _, c := range []struct {
		name    string
		ctx     context.Context
		bound   time.Duration
		elapsed time.Duration // before the acquire goes to the pool
		want    time.Duration
	}{
		{"heartbeat, after a home turn", lease, cfg.LeaseTTL / 2, homeTurn, homeWait},
		{"release at stop, after a home turn", bg, cfg.StopTimeout, homeTurn, homeWait},
		{"idle poll", bg, max(cfg.LeaseTTL, 5*time.Second), 0, homeWait},
		{"backlog count, after a home turn", bg, cfg.HeartbeatInterval, homeTurn, homeWait},
		{"heartbeat, after 1.2 s for its slot", lease, cfg.LeaseTTL / 2, 1200 * time.Millisecond, 900 * time.Millisecond},
	} {
		ctx, cancel := context.WithDeadline(c.ctx, start.Add(c.bound))
		got := waitBefore(ctx, start.Add(c.elapsed))
		cancel()
		require.Equal(t, c.want, got, "%s (bound %s): counts after %s for the pool", c.name, c.bound, got)
	}
}
