package consume_test

// Hostile review of 502b0e4 through the real adapters (sarama and franz-go
// against kfake): redeliveries of records committed in PostgreSQL but not in
// Kafka (a restart) and across rebalances meet the plain insert, fail it
// with 23505, and are run again by inTx with ON CONFLICT. Each key's
// handler runs once, each effect commits once, Stats are exact, nothing is
// an attempt or a dead letter, and a redelivery-free run keeps its round
// trips per message.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testutil"
)

// callCounter counts handler calls per event id.
type callCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func newCallCounter() *callCounter { return &callCounter{calls: map[string]int{}} }

func (c *callCounter) add(m inbox.Message) {
	ev, _ := m.Header(eventHeader)
	c.mu.Lock()
	c.calls[string(ev)]++
	c.mu.Unlock()
}

func (c *callCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.calls))
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

func (c *callCounter) fn() inbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		c.add(m)
		return effect(ctx, tx, m)
	}
}

func (c *callCounter) batchFn() inbox.BatchHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
		for _, m := range ms {
			c.add(m)
		}
		return batchEffect(ctx, tx, ms)
	}
}

// handlerSettings are the settings of a member with batches of batch, the
// per-message handler or the batch handler, counting calls in cc.
func handlerSettings(b *bundle, ib *inbox.Inbox, cc *callCounter, batchFn bool, batch int) settings {
	if batchFn {
		return batchSettings(b, ib, cc.batchFn(), batch)
	}
	s := settingsOf(b, ib, cc.fn())
	s.batch = batch
	return s
}

func forEachHandler(t *testing.T, body func(t *testing.T, a adapter, batchFn bool)) {
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, batchFn := range []bool{false, true} {
			t.Run(map[bool]string{false: "per-message", true: "batch-handler"}[batchFn], func(t *testing.T) {
				t.Parallel()
				body(t, a, batchFn)
			})
		}
	})
}

// ATTACK: a restart that re-reads records committed in PostgreSQL but not in
// Kafka (the group's offset back at 0, as after a SIGKILL between COMMIT and
// the offset commit), followed by new records. The new process (a new
// Inbox: probe window closed) meets the old keys with the plain insert.
func TestConflictAttackAdapterRestartRedelivery(t *testing.T) {
	t.Parallel()
	forEachHandler(t, func(t *testing.T, a adapter, batchFn bool) {
		b := setup(t, 1)
		const old, fresh = 150, 100
		b.ProduceEvents(t, events("e", old)...)
		first := newCallCounter()
		m1 := a.start(t, b, handlerSettings(b, newInbox(t, inbox.ByHeader(eventHeader)), first, batchFn, 25))
		testutil.Eventually(t, 30*time.Second, "the first process committed everything", func() bool {
			_, d := b.Effects(t)
			return d == old && b.Committed(t, "svc", 0) == old
		})
		m1.stop()
		b.ResetOffset(t, "svc", 0) // the offsets never reached Kafka
		b.ProduceEvents(t, events("f", fresh)...)

		second := newCallCounter()
		ib := newInbox(t, inbox.ByHeader(eventHeader))
		m2 := a.start(t, b, handlerSettings(b, ib, second, batchFn, 25))
		testutil.Eventually(t, 30*time.Second, "the restarted process caught up", func() bool {
			_, d := b.Effects(t)
			return d == old+fresh && b.Committed(t, "svc", 0) == old+fresh
		})
		m2.stop()

		rows, distinct := b.Effects(t)
		require.Equal(t, old+fresh, rows, "no double effect")
		require.Equal(t, old+fresh, distinct)
		calls := second.snapshot()
		for _, ev := range events("e", old) {
			require.Zero(t, calls[ev], "a redelivered key reached the handler: %s", ev)
		}
		for _, ev := range events("f", fresh) {
			require.Equal(t, 1, calls[ev], "handler calls of %s", ev)
		}
		st := m2.stats()
		require.Equal(t, inbox.ConsumerStats{Processed: fresh, Duplicates: old}, st, "exact stats, nothing else")
		ist := ib.Stats()
		require.Equal(t, uint64(fresh), ist.Processed)
		require.Equal(t, uint64(old), ist.Duplicates)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_outbox`))
	})
}

// ATTACK: rebalances mid-run with several members and a short drain: the
// records a member had read but not committed in Kafka are redelivered to
// another, concurrently with the old owner's last transaction (the zombie
// window). Each event's handler runs once (no transaction here fails for
// any other reason), each effect commits once, nothing is an attempt or a
// dead letter.
func TestConflictAttackAdapterRebalanceHandlerOnce(t *testing.T) {
	t.Parallel()
	forEachHandler(t, func(t *testing.T, a adapter, batchFn bool) {
		b := setup(t, 4)
		const n = 400
		b.ProduceEvents(t, events("e", n)...)
		cc := newCallCounter()
		slowFn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			cc.add(m)
			if err := effect(ctx, tx, m); err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
			return nil
		}
		slowBatch := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
			for _, m := range ms {
				cc.add(m)
			}
			time.Sleep(5 * time.Millisecond)
			return batchEffect(ctx, tx, ms)
		}
		mk := func() settings {
			ib := newInbox(t, inbox.ByHeader(eventHeader))
			var s settings
			if batchFn {
				s = batchSettings(b, ib, slowBatch, 10)
			} else {
				s = settingsOf(b, ib, slowFn)
				s.batch = 10
			}
			s.drainTimeout = 5 * time.Second // the old owner's transaction commits: no rollback, so no legitimate second call
			return s
		}
		m1 := a.start(t, b, mk())
		testutil.Eventually(t, 30*time.Second, "under way", func() bool { _, d := b.Effects(t); return d >= n/8 })
		m2 := a.start(t, b, mk())
		testutil.Eventually(t, 30*time.Second, "a quarter", func() bool { _, d := b.Effects(t); return d >= n/4 })
		m3 := a.start(t, b, mk())
		testutil.Eventually(t, 30*time.Second, "half", func() bool { _, d := b.Effects(t); return d >= n/2 })
		m1.stop()
		testutil.Eventually(t, 60*time.Second, "all", func() bool { _, d := b.Effects(t); return d >= n })
		m2.stop()
		m3.stop()

		rows, distinct := b.Effects(t)
		require.Equal(t, n, rows, "no double effect")
		require.Equal(t, n, distinct)
		for ev, k := range cc.snapshot() {
			require.Equal(t, 1, k, "handler calls of %s", ev)
		}
		var st inbox.ConsumerStats
		for _, m := range []*member{m1, m2, m3} {
			x := m.stats()
			st.Processed += x.Processed
			st.Failures += x.Failures
			st.DeadLettered += x.DeadLettered
		}
		require.EqualValues(t, n, st.Processed, "each event counted processed once across members")
		require.Zero(t, st.Failures)
		require.Zero(t, st.DeadLettered)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
	})
}

// rtTracer counts round trips (as bench_test.go's roundTrips) and ROLLBACKs.
type rtTracer struct {
	roundTrips
	rollbacks atomic.Int64
}

func (r *rtTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.ToLower(d.SQL), "rollback") {
		r.rollbacks.Add(1)
	}
	return r.roundTrips.TraceQueryStart(ctx, c, d)
}

// ATTACK: round trips per message on a redelivery-free run are unchanged
// (no Conflict, no ROLLBACK): at most 0.05 with a batch handler at batch
// 100. And the same run after a restart that redelivers everything costs
// one Conflict (one ROLLBACK) for the whole run, not one per batch.
func TestConflictAttackAdapterRoundTrips(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		const n = 2000
		b.ProduceEvents(t, events("e", n)...)
		tr := &rtTracer{}
		cfg := b.DB.Pool.Config()
		cfg.ConnConfig.Tracer = tr
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)

		runOnce := func(want int) (trips, rollbacks int64) {
			t0, r0 := tr.n.Load(), tr.rollbacks.Load()
			s := batchSettings(b, newInbox(t, inbox.ByHeader(eventHeader)), batchEffect, 100)
			s.pool, s.batchWait = pool, 200*time.Millisecond
			m := a.start(t, b, s)
			testutil.Eventually(t, 60*time.Second, "all committed", func() bool {
				return b.Committed(t, "svc", 0) == n
			})
			m.stop()
			rows, _ := b.Effects(t)
			require.Equal(t, want, rows)
			return tr.n.Load() - t0, tr.rollbacks.Load() - r0
		}
		trips, rb := runOnce(n)
		perMsg := float64(trips) / n
		t.Logf("%s redelivery-free: %d round trips for %d records (%.4f/msg), %d rollbacks", a.name, trips, n, perMsg, rb)
		require.Zero(t, rb, "no Conflict on a redelivery-free run")
		require.LessOrEqual(t, perMsg, 0.05)

		b.ResetOffset(t, "svc", 0)
		trips, rb = runOnce(n)
		t.Logf("%s full redelivery: %d round trips for %d records (%.4f/msg), %d rollbacks", a.name, trips, n, float64(trips)/n, rb)
		require.Equal(t, int64(1), rb, "one Conflict for the whole redelivered run (probe window)")
		require.LessOrEqual(t, float64(trips)/n, 0.05)
	})
}
