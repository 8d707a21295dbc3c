package consume_test

// The guarantee suite with a batch handler (ConsumerConfig.BatchHandler):
// the handler writes a whole batch's business rows in one statement, and
// fails some messages with an inbox.BatchError. Nothing is applied twice,
// nothing is lost, and each partition's effects commit in offset order.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testutil"
)

// batchEffect is the batch handler: the effects of all its messages in one
// INSERT … SELECT … FROM unnest.
func batchEffect(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
	evs, topics := make([]string, len(ms)), make([]string, len(ms))
	parts, offs := make([]int32, len(ms)), make([]int64, len(ms))
	for i, m := range ms {
		ev, _ := m.Header(eventHeader)
		evs[i], topics[i], parts[i], offs[i] = string(ev), m.Topic, m.Partition, m.Offset
	}
	_, err := tx.Exec(ctx, benchInsertMany, evs, topics, parts, offs)
	return err
}

// batchSettings are settingsOf with the batch handler fn, batches of batch.
func batchSettings(b *bundle, ib *inbox.Inbox, fn inbox.BatchHandlerFunc, batch int) settings {
	s := settingsOf(b, ib, nil)
	s.batchFn, s.batch = fn, batch
	return s
}

// requireInOrder checks that each partition's effects committed in offset
// order: the business rows, in the order they were written, have rising
// offsets.
func requireInOrder(t *testing.T, b *bundle) {
	t.Helper()
	require.Zero(t, b.Count(t, `SELECT count(*) FROM (
		SELECT "offset" < lag("offset") OVER (PARTITION BY partition ORDER BY id) AS back FROM effects) x WHERE back`),
		"a partition's effects committed out of offset order")
}

// sizes records the sizes of the batches a batch handler received.
type sizes struct {
	mu  sync.Mutex
	max int
	all []int
}

func (s *sizes) wrap(fn inbox.BatchHandlerFunc) inbox.BatchHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
		s.mu.Lock()
		s.max = max(s.max, len(ms))
		s.all = append(s.all, len(ms))
		s.mu.Unlock()
		return fn(ctx, tx, ms)
	}
}

// The batch handler gets whole batches; every message's effect commits
// once, in offset order, and the offsets are committed after.
func TestSuiteBatchHandlerProcessesAndCommits(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 2)
		const n = 200
		b.ProduceEvents(t, events("e", n)...)
		var sz sizes
		s := batchSettings(b, newInbox(t, inbox.ByOffset()), sz.wrap(batchEffect), 25)
		s.batchWait = 100 * time.Millisecond
		m := a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "all effects", func() bool { _, d := b.Effects(t); return d >= n })
		m.stop()
		requireExactlyOnce(t, b, n, 2)
		requireInOrder(t, b)
		require.EqualValues(t, n, m.stats().Processed)
		require.Greater(t, sz.max, 1, "the handler got batches")
		require.LessOrEqual(t, sz.max, 25)
	})
}

// With no batch wait, a batch is what is already fetched: a backlog comes
// in full batches, not one record per batch (the franz-go adapter once
// handed its loop one record at a time through an unbuffered channel, so
// "what is buffered" was one record).
func TestSuiteBatchHandlerNoWaitTakesWhatIsFetched(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		const n, batch = 2000, 50
		b.ProduceEvents(t, events("e", n)...)
		var sz sizes
		s := batchSettings(b, newInbox(t, inbox.ByOffset()), sz.wrap(batchEffect), batch)
		s.batchWait = inbox.NoBatchWait
		m := a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "all effects", func() bool { _, d := b.Effects(t); return d >= n })
		m.stop()
		requireExactlyOnce(t, b, n, 1)
		sz.mu.Lock()
		defer sz.mu.Unlock()
		require.LessOrEqual(t, sz.max, batch)
		// The first batch may be short (the fetch still arriving); a
		// 2,000-record backlog in batches of at most 50 takes 40 of them
		// when they come full, 2,000 when they come one by one.
		require.Less(t, len(sz.all), 4*n/batch, "batches of a fetched backlog: %v", sz.all)
	})
}

// A rebalance while batches are in flight (a second member joins, then the
// first leaves): every event takes effect exactly once, in order, and no
// offset is committed past what committed in PostgreSQL. Eager and
// cooperative.
func TestSuiteBatchHandlerRebalanceMidBatch(t *testing.T) {
	t.Parallel()
	forEach(t, true, func(t *testing.T, a adapter) {
		b := setup(t, 4)
		const n = 800
		b.ProduceEvents(t, events("e", n)...)
		slow := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
			if err := batchEffect(ctx, tx, ms); err != nil {
				return err
			}
			select { // a batch that takes a while: rebalances land mid-batch
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		s := batchSettings(b, newInbox(t, inbox.ByHeader(eventHeader)), slow, 10)
		s.drainTimeout = 200 * time.Millisecond
		rebalanceMidBatch(t, a, b, s, n)
		requireInOrder(t, b)
	})
}

// Poison inside a batch, three ways: a message the handler fails with a
// BatchError (retried alone, dead-lettered after MaxAttempts), one it fails
// with a permanent error in a BatchError (dead-lettered at once, its handler
// run once in all), and one whose batch fails with a plain error (the batch
// goes one by one; the message fails alone until dead-lettered). The others
// commit exactly once, in offset order, and the offset moves past all three.
func TestSuiteBatchHandlerPoison(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		const n = 40
		evs := events("e", n)
		retried, permanent, whole := evs[5], evs[15], evs[25]
		var mu sync.Mutex
		seen := map[string]int{}
		var calls [][]int64 // the offsets of each call, in call order
		fn := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
			if err := batchEffect(ctx, tx, ms); err != nil {
				return err
			}
			var failed inbox.BatchError
			mu.Lock()
			defer mu.Unlock()
			var offs []int64
			for _, m := range ms {
				offs = append(offs, m.Offset)
			}
			calls = append(calls, offs)
			for i, m := range ms {
				ev, _ := m.Header(eventHeader)
				seen[string(ev)]++
				switch string(ev) {
				case whole:
					return errors.New("settlement file unreadable")
				case retried:
					failed.Add(i, errors.New("account locked"))
				case permanent:
					failed.Add(i, inbox.Permanent(errors.New("account closed")))
				}
			}
			return failed.Err()
		}
		b.ProduceEvents(t, evs...)
		s := batchSettings(b, newInbox(t, inbox.ByHeader(eventHeader)), fn, 10)
		s.batchWait, s.maxAttempts = 200*time.Millisecond, 3
		m := a.start(t, b, s)
		testutil.Eventually(t, 60*time.Second, "past the poison messages", func() bool { return b.Committed(t, "svc", 0) == n })
		m.stop()
		rows, distinct := b.Effects(t)
		require.Equal(t, n-3, rows)
		require.Equal(t, n-3, distinct)
		requireInOrder(t, b)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM effects WHERE event = ANY($1)`, []string{retried, permanent, whole}))
		st := m.stats()
		require.EqualValues(t, 3, st.DeadLettered)
		require.EqualValues(t, 3+1+3, st.Failures)
		require.EqualValues(t, n-3, st.Processed)
		mu.Lock()
		require.Equal(t, 1, seen[permanent], "a permanent failure in a batch is not run again")
		require.Equal(t, 3, seen[retried])
		requireCut(t, calls, 5, 3)
		mu.Unlock()
		dl := b.OutboxDLQ(t, "events.dlq")
		require.Len(t, dl, 3)
		var offsets []string
		for _, d := range dl {
			offsets = append(offsets, d.Headers[inbox.HeaderDLQSourceOffset])
		}
		slices.Sort(offsets)
		require.Equal(t, []string{"15", "25", "5"}, offsets)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
	})
}

// A batch handler that writes every row of its batch and then fails leaves
// no trace of the failed run, whether it names a message (BatchError) or
// fails the batch: the retries apply each event once.
func TestSuiteBatchHandlerWritesThenFails(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, named := range []bool{true, false} {
			b := setup(t, 1)
			var mu sync.Mutex
			failed := map[string]bool{}
			fn := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
				if err := batchEffect(ctx, tx, ms); err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				var be inbox.BatchError
				for i, m := range ms {
					ev, _ := m.Header(eventHeader)
					if !failed[string(ev)] {
						failed[string(ev)] = true
						be.Add(i, errors.New("downstream timeout, after the write"))
					}
				}
				if err := be.Err(); err != nil && !named {
					return errors.New("downstream timeout, after the batch's write")
				}
				return be.Err()
			}
			b.ProduceEvents(t, events("e", 30)...)
			s := batchSettings(b, newInbox(t, inbox.ByHeader(eventHeader)), fn, 10)
			m := a.start(t, b, s)
			testutil.Eventually(t, 60*time.Second, "all done", func() bool { return b.Committed(t, "svc", 0) == 30 })
			m.stop()
			requireExactlyOnce(t, b, 30, 1)
			requireInOrder(t, b)
			st := m.stats()
			require.Zero(t, st.DeadLettered)
			require.Positive(t, st.BatchFallbacks)
			if named { // a failed batch run counts as the named message's attempt
				require.Positive(t, st.Failures)
			}
		}
	})
}

// Watermark mode with a batch handler and a poison message in a batch: the
// cut keeps the partition's order, so the watermark never passes a message
// that did not commit; the poison is dead-lettered; a rewind to the start
// reprocesses nothing.
func TestSuiteBatchHandlerWatermark(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		ib, err := inbox.New(inbox.Config{Consumer: "svc", Dedup: inbox.DedupWatermark})
		require.NoError(t, err)
		const n = 100
		fn := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
			var failed inbox.BatchError
			for i, m := range ms {
				if m.Offset == 42 {
					failed.Add(i, inbox.Permanent(errors.New("malformed amount")))
				}
			}
			if err := failed.Err(); err != nil {
				return err
			}
			return batchEffect(ctx, tx, ms)
		}
		b.ProduceEvents(t, events("a", n)...)
		s := batchSettings(b, ib, fn, 10)
		m := a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "first pass", func() bool { return b.Committed(t, "svc", 0) == n })
		m.stop()
		require.Equal(t, n-1, b.Count(t, `SELECT count(*) FROM effects`))
		require.EqualValues(t, 1, m.stats().DeadLettered)
		requireInOrder(t, b)

		b.ResetOffset(t, "svc", 0)
		m = a.start(t, b, s)
		testutil.Eventually(t, 30*time.Second, "replay", func() bool { return m.stats().Duplicates == n })
		testutil.Eventually(t, 30*time.Second, "replay committed", func() bool { return b.Committed(t, "svc", 0) == n })
		m.stop()
		require.Zero(t, m.stats().Processed)
		require.Zero(t, m.stats().DeadLettered)
		require.Equal(t, n-1, b.Count(t, `SELECT count(*) FROM effects`), "a rewind reprocesses nothing")
		require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM pgbox_consumer_dead`))
	})
}

// requireCut checks the order rule on a batch handler's calls: the first
// call that failed offset k with others is followed by the messages before
// k as one call, then k alone (runs times in all), then the messages after
// k as one call.
func requireCut(t *testing.T, calls [][]int64, k int64, runs int) {
	t.Helper()
	i := slices.IndexFunc(calls, func(c []int64) bool { return len(c) > 1 && slices.Contains(c, k) })
	if i < 0 {
		t.Logf("offset %d never came in a batch with others: nothing to check", k)
		return
	}
	failed := calls[i]
	at := slices.Index(failed, k)
	var want [][]int64
	if at > 0 {
		want = append(want, failed[:at])
	}
	for range runs - 1 {
		want = append(want, []int64{k})
	}
	if at+1 < len(failed) {
		want = append(want, failed[at+1:])
	}
	require.GreaterOrEqual(t, len(calls), i+1+len(want))
	require.Equal(t, want, calls[i+1:i+1+len(want)], "the batch %v is cut at offset %d", failed, k)
}
