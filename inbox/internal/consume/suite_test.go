package consume_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testutil"
)

// requireExactlyOnce checks every event's effect committed once and each
// partition's committed offset is at its end: nothing lost, nothing twice.
func requireExactlyOnce(t *testing.T, b *bundle, n int, partitions int32) {
	t.Helper()
	rows, distinct := b.Effects(t)
	require.Equal(t, n, distinct, "every event's effect")
	require.Equal(t, n, rows, "no event applied twice")
	for p := range partitions {
		end := b.Count(t, `SELECT count(DISTINCT event) FROM effects WHERE partition = $1`, p)
		testutil.Eventually(t, 10*time.Second, "offsets committed", func() bool { return b.Committed(t, "svc", p) == int64(end) })
	}
}

// The basics, at batch 1 and 25: every message's effect commits once, the
// offsets are committed after, and the topic id is part of the ByOffset keys
// (in the same form whichever client read it).
func TestSuiteProcessesAndCommits(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, batch := range []int{1, 25} {
			b := setup(t, 2)
			b.ProduceEvents(t, events("e", 60)...)
			s := settingsOf(b, newInbox(t, inbox.ByOffset()), effect)
			s.batch, s.topicIDs = batch, true
			m := a.start(t, b, s)
			testutil.Eventually(t, 30*time.Second, "all effects", func() bool { _, d := b.Effects(t); return d >= 60 })
			m.stop()
			requireExactlyOnce(t, b, 60, 2)
			require.EqualValues(t, 60, m.stats().Processed)
			require.Zero(t, m.stats().DeadLettered)
			var key string
			require.NoError(t, b.DB.Pool.QueryRow(context.Background(),
				`SELECT key FROM pgbox_inbox WHERE partition = 0 AND "offset" = 0`).Scan(&key))
			require.Regexp(t, `^events@[A-Za-z0-9_-]{22}/0/0$`, key)
		}
	})
}

// A rebalance while batches are in flight (a second member joins, then the
// first leaves): the transactions in flight commit within the drain timeout
// or roll back, no offset is committed past what committed in PostgreSQL,
// and every event takes effect exactly once. Eager and cooperative.
func TestSuiteRebalanceMidBatch(t *testing.T) {
	t.Parallel()
	forEach(t, true, func(t *testing.T, a adapter) {
		b := setup(t, 4)
		const n = 400
		b.ProduceEvents(t, events("e", n)...)
		slow := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if err := effect(ctx, tx, m); err != nil {
				return err
			}
			select { // a handler that takes a while: rebalances land mid-batch
			case <-time.After(2 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), slow)
		s.batch, s.drainTimeout = 10, 200*time.Millisecond
		rebalanceMidBatch(t, a, b, s, n)
	})
}

// rebalanceMidBatch runs a member with s until n/8 events took effect,
// starts a second, stops the first at half, and checks the end: every event
// once, no committed offset ahead of the effects, nothing dead-lettered.
func rebalanceMidBatch(t *testing.T, a adapter, b *bundle, s settings, n int) {
	t.Helper()
	watched := watchCommitted(t, b, 4)
	m1 := a.start(t, b, s)
	testutil.Eventually(t, 30*time.Second, "the first member under way", func() bool { _, d := b.Effects(t); return d >= n/8 })
	m2 := a.start(t, b, s)
	testutil.Eventually(t, 30*time.Second, "half done", func() bool { _, d := b.Effects(t); return d >= n/2 })
	m1.stop()
	testutil.Eventually(t, 60*time.Second, "all effects", func() bool { _, d := b.Effects(t); return d >= n })
	m2.stop()
	requireExactlyOnce(t, b, n, 4)
	require.Empty(t, watched(), "a committed offset ran ahead of the effects committed in PostgreSQL")
	require.Zero(t, m1.stats().DeadLettered+m2.stats().DeadLettered)
}

// A poison message fails MaxAttempts times and is dead-lettered once, with
// the same headers from either adapter; the messages around it are
// processed and the offset moves past it.
func TestSuitePoisonMessage(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		evs := events("e", 10)
		poison := evs[4]
		fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if ev, _ := m.Header(eventHeader); string(ev) == poison {
				return errors.New("account closed")
			}
			return effect(ctx, tx, m)
		}
		b.ProduceEvents(t, evs...)
		s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), fn)
		s.maxAttempts = 3
		m := a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "past the poison message", func() bool { return b.Committed(t, "svc", 0) == 10 })
		m.stop()
		rows, distinct := b.Effects(t)
		require.Equal(t, 9, rows)
		require.Equal(t, 9, distinct)
		st := m.stats()
		require.EqualValues(t, 1, st.DeadLettered)
		require.EqualValues(t, 3, st.Failures)
		dl := b.OutboxDLQ(t, "events.dlq")
		require.Len(t, dl, 1)
		require.Equal(t, []byte(poison), dl[0].Key)
		require.Equal(t, "payload of "+poison, string(dl[0].Value))
		h := dl[0].Headers
		require.Equal(t, poison, h[eventHeader], "the original headers come along")
		require.Contains(t, h[inbox.HeaderDLQError], "account closed")
		require.Equal(t, "3", h[inbox.HeaderDLQAttempts])
		require.Equal(t, "events", h[inbox.HeaderDLQSourceTopic])
		require.Equal(t, "0", h[inbox.HeaderDLQSourcePart])
		require.Equal(t, "4", h[inbox.HeaderDLQSourceOffset])
		require.Equal(t, "svc", h[inbox.HeaderDLQConsumer])
		require.Equal(t, poison, h[inbox.HeaderDLQKey])
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
		require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM pgbox_consumer_dead`))
	})
}

// A Permanent error skips the retries, inside a batch too: the batch falls
// back to one by one, the failing message's handler runs once in all (no
// retry, no second run after the fallback), and only it is dead-lettered,
// to the configured dead-letter topic.
func TestSuitePermanent(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		evs := events("e", 30)
		var calls atomic.Int64
		fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if ev, _ := m.Header(eventHeader); string(ev) == evs[17] {
				calls.Add(1)
				return inbox.Permanent(errors.New("malformed amount"))
			}
			return effect(ctx, tx, m)
		}
		b.ProduceEvents(t, evs...)
		s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), fn)
		s.batch, s.batchWait, s.maxAttempts, s.deadLetterTopic = 10, 200*time.Millisecond, 5, "svc.dead"
		m := a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "past the bad message", func() bool { return b.Committed(t, "svc", 0) == 30 })
		m.stop()
		rows, distinct := b.Effects(t)
		require.Equal(t, 29, rows)
		require.Equal(t, 29, distinct)
		st := m.stats()
		require.EqualValues(t, 1, st.Failures)
		require.EqualValues(t, 1, st.DeadLettered)
		require.GreaterOrEqual(t, st.BatchFallbacks, uint64(1))
		require.EqualValues(t, 1, calls.Load())
		require.Empty(t, b.OutboxDLQ(t, "events.dlq"))
		dl := b.OutboxDLQ(t, "svc.dead")
		require.Len(t, dl, 1)
		require.Equal(t, "1", dl[0].Headers[inbox.HeaderDLQAttempts])
		require.Equal(t, "17", dl[0].Headers[inbox.HeaderDLQSourceOffset])
		require.Contains(t, dl[0].Headers[inbox.HeaderDLQError], "malformed amount")
	})
}

// A handler that writes and then fails leaves no trace of the failed
// attempt: its writes roll back with the inbox key, and the retry applies
// the event once.
func TestSuiteHandlerWritesThenFails(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, batch := range []int{1, 10} {
			b := setup(t, 1)
			var mu sync.Mutex
			failed := map[string]bool{}
			fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				if err := effect(ctx, tx, m); err != nil {
					return err
				}
				ev, _ := m.Header(eventHeader)
				mu.Lock()
				defer mu.Unlock()
				if !failed[string(ev)] {
					failed[string(ev)] = true
					return errors.New("downstream timeout, after the write")
				}
				return nil
			}
			b.ProduceEvents(t, events("e", 20)...)
			s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), fn)
			s.batch = batch
			m := a.start(t, b, s)
			testutil.Eventually(t, 60*time.Second, "all done", func() bool { return b.Committed(t, "svc", 0) == 20 })
			m.stop()
			requireExactlyOnce(t, b, 20, 1)
			require.Zero(t, m.stats().DeadLettered)
			require.Positive(t, m.stats().Failures)
		}
	})
}

// Retryable database errors from the handler's own SQL (a serialization
// failure) are not the message's fault: retried, never counted as attempts,
// never dead-lettered, even with MaxAttempts 1.
func TestSuiteInfraErrorsFromHandlerSQL(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		var mu sync.Mutex
		tries := map[string]int{}
		fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			ev, _ := m.Header(eventHeader)
			mu.Lock()
			tries[string(ev)]++
			n := tries[string(ev)]
			mu.Unlock()
			if n <= 2 {
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$`)
				return err
			}
			return effect(ctx, tx, m)
		}
		b.ProduceEvents(t, events("e", 10)...)
		s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), fn)
		s.maxAttempts = 1
		m := a.start(t, b, s)
		testutil.Eventually(t, 60*time.Second, "all done", func() bool { return b.Committed(t, "svc", 0) == 10 })
		m.stop()
		requireExactlyOnce(t, b, 10, 1)
		st := m.stats()
		require.EqualValues(t, 20, st.TransientErrors)
		require.Zero(t, st.Failures)
		require.Zero(t, st.DeadLettered)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
	})
}

// The service's role loses its grants while the adapter runs: Consume (Run)
// returns an error that wraps inbox.ErrNeedsOperator and names the fix;
// nothing is dead-lettered or counted as an attempt, and the offset stays.
// Granted again, everything is processed exactly once.
func TestSuiteRevokedGrant(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		role := testutil.NewRole(t, b.DB)
		pool, err := pgxpool.New(context.Background(), role.URL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		var logs testutil.SyncBuffer
		s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), effect)
		s.pool, s.logger = pool, slog.New(slog.NewTextHandler(&logs, nil))

		b.ProduceEvents(t, events("a", 20)...)
		m := a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "the first events", func() bool { return b.Committed(t, "svc", 0) == 20 })
		role.Revoke(t)
		b.ProduceEvents(t, events("b", 20)...)
		var err2 error
		select {
		case err2 = <-m.errs:
		case <-time.After(60 * time.Second):
			t.Fatal("the adapter did not report the revoked grant")
		}
		require.ErrorIs(t, err2, inbox.ErrNeedsOperator)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err2, &pgErr)
		require.Equal(t, "42501", pgErr.Code)
		require.ErrorContains(t, err2, "grant")
		require.Contains(t, logs.String(), "level=ERROR")
		require.EqualValues(t, 20, b.Committed(t, "svc", 0), "the offset stays")
		st := m.stats()
		require.Zero(t, st.DeadLettered)
		require.Zero(t, st.Failures)
		require.Positive(t, st.OperatorErrors)

		role.Grant(t)
		testutil.Eventually(t, 60*time.Second, "every event", func() bool { _, d := b.Effects(t); return d == 40 })
		m.stop()
		requireExactlyOnce(t, b, 40, 1)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_dead`))
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_outbox`))
	})
}

// Watermark mode: the group's offset rewound to the start reprocesses
// nothing; every redelivery is a duplicate.
func TestSuiteWatermarkRewind(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		ib, err := inbox.New(inbox.Config{Consumer: "svc", Dedup: inbox.DedupWatermark})
		require.NoError(t, err)
		b.ProduceEvents(t, events("a", 100)...)
		s := settingsOf(b, ib, effect)
		s.batch = 10
		m := a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "first pass", func() bool { return b.Committed(t, "svc", 0) == 100 })
		m.stop()
		require.Equal(t, 100, b.Count(t, `SELECT count(*) FROM effects`))

		b.ResetOffset(t, "svc", 0)
		m = a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "replay", func() bool { return m.stats().Duplicates == 100 })
		testutil.Eventually(t, 30*time.Second, "replay committed", func() bool { return b.Committed(t, "svc", 0) == 100 })
		m.stop()
		require.Zero(t, m.stats().Processed)
		require.Equal(t, 100, b.Count(t, `SELECT count(*) FROM effects`), "a rewind reprocesses nothing")
	})
}

// watchCommitted samples the group's committed offsets while a test runs:
// each must never pass a record whose effect has not committed (the offset
// is read first, the effects after, so a sample can only err towards
// passing). The returned func stops it and lists the violations seen.
func watchCommitted(t *testing.T, b *bundle, partitions int32) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var bad []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for p := range partitions {
				c := b.Committed(t, "svc", p)
				if c <= 0 {
					continue
				}
				var n int64
				if err := b.DB.Pool.QueryRow(ctx, `SELECT count(DISTINCT "offset") FROM effects WHERE partition = $1 AND "offset" < $2`, p, c).Scan(&n); err != nil {
					continue
				}
				if n != c {
					bad = append(bad, fmt.Sprintf("partition %d: committed %d with %d effects below it", p, c, n))
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	stop := func() []string {
		cancel()
		<-done
		return bad
	}
	t.Cleanup(func() { stop() })
	return stop
}
