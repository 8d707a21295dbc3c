package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
)

// callLog is a handler that writes a payments row and remembers the order of
// its calls.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (r *callLog) handler(result func(m inbox.Message) string) inbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		r.mu.Lock()
		r.calls = append(r.calls, m.String())
		r.mu.Unlock()
		if result != nil {
			if err := inbox.SetResult(ctx, []byte(result(m))); err != nil {
				return err
			}
		}
		return pay(ctx, tx, m)
	}
}

func TestProcessBatch(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessBatch)
}

func testProcessBatch(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	ev := func(id string, offset int64, value string) inbox.Message {
		return msg("orders", 0, offset, value, outbox.Header{Key: "event-id", Value: []byte(id)})
	}
	receipt := func(m inbox.Message) string { return "receipt-" + string(m.Value) }

	// A was processed in an earlier transaction, with a stored result.
	_, err := b.process(t, ib, ev("A", 1, "a"), (&callLog{}).handler(receipt))
	require.NoError(t, err)

	rec := &callLog{}
	batch := []inbox.Message{ev("B", 2, "b"), ev("A", 3, "a"), ev("C", 4, "c"), ev("B", 5, "b")}
	tx := b.begin(t)
	res, err := processBatch(ctx, ib, tx, batch, rec.handler(receipt))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.Equal(t, []inbox.Result{
		{Key: "B", Stored: []byte("receipt-b")},
		{Key: "A", Duplicate: true, Stored: []byte("receipt-a")},
		{Key: "C", Stored: []byte("receipt-c")},
		{Key: "B", Duplicate: true, Stored: []byte("receipt-b")}, // in-batch copy
	}, res)
	require.Equal(t, []string{"orders/0@2", "orders/0@4"}, rec.calls, "handler runs for new keys only, in input order")
	require.Equal(t, 3, b.payments(t))
	require.Equal(t, 3, b.inboxRows(t))
	require.Equal(t, inbox.Stats{Processed: 3, Duplicates: 2}, ib.Stats())

	// The whole batch again: all duplicates, results kept.
	rec = &callLog{}
	tx = b.begin(t)
	res, err = processBatch(ctx, ib, tx, batch, rec.handler(nil))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, rec.calls)
	for i, r := range res {
		require.True(t, r.Duplicate, i)
	}
	require.Equal(t, []byte("receipt-c"), res[2].Stored)
	require.Equal(t, 3, b.payments(t))

	// Empty batch: nothing to do.
	res, err = processBatch(ctx, ib, b.begin(t), nil, pay)
	require.NoError(t, err)
	require.Empty(t, res)
}

func TestProcessBatchHandlerErrorLeavesNothing(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessBatchHandlerErrorLeavesNothing)
}

func testProcessBatchHandlerErrorLeavesNothing(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	boom := errors.New("boom")
	batch := []inbox.Message{msg("orders", 0, 1, "x"), msg("orders", 0, 2, "y"), msg("orders", 0, 3, "z")}

	tx := b.begin(t)
	_, err := processBatch(ctx, ib, tx, batch, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := pay(ctx, tx, m); err != nil {
			return err
		}
		if m.Offset == 2 {
			return boom
		}
		return nil
	})
	require.ErrorIs(t, err, boom)
	var me *inbox.MessageError
	require.ErrorAs(t, err, &me)
	require.Equal(t, 1, me.Index)
	require.Equal(t, "orders/0/2", me.Key)
	require.NoError(t, tx.Commit(ctx)) // the caller commits anyway
	require.Zero(t, b.inboxRows(t))
	require.Zero(t, b.payments(t))

	// Redelivery processes all three.
	tx = b.begin(t)
	res, err := processBatch(ctx, ib, tx, batch, pay)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, res, 3)
	require.Equal(t, 3, b.payments(t))
}

func TestFingerprintMismatch(t *testing.T) {
	t.Parallel()
	forKinds(t, testFingerprintMismatch)
}

func testFingerprintMismatch(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	ev := func(id string, offset int64, value string) inbox.Message {
		return msg("orders", 0, offset, value, outbox.Header{Key: "event-id", Value: []byte(id)})
	}
	_, err := b.process(t, ib, ev("evt-1", 1, `{"amount":100}`), pay)
	require.NoError(t, err)

	// Same payload again: a duplicate.
	res, err := b.process(t, ib, ev("evt-1", 2, `{"amount":100}`), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)

	// Same key, different payload: an error, not a silent skip.
	tx := b.begin(t)
	called := false
	_, err = process(ctx, ib, tx, ev("evt-1", 3, `{"amount":999}`), func(context.Context, pgx.Tx, inbox.Message) error {
		called = true
		return nil
	})
	require.ErrorIs(t, err, inbox.ErrFingerprintMismatch)
	require.ErrorContains(t, err, `key "evt-1"`)
	require.ErrorContains(t, err, "orders/0@3")
	require.False(t, called)
	_, err = tx.Exec(ctx, `SELECT 1`) // still usable
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	// In a batch, against a stored key: the batch's new keys are not kept.
	tx = b.begin(t)
	_, err = processBatch(ctx, ib, tx, []inbox.Message{ev("evt-2", 4, "x"), ev("evt-1", 5, "changed")}, pay)
	require.ErrorIs(t, err, inbox.ErrFingerprintMismatch)
	var me *inbox.MessageError
	require.ErrorAs(t, err, &me)
	require.Equal(t, 1, me.Index)
	require.NoError(t, tx.Commit(ctx))

	// In a batch, between two copies of one new key.
	tx = b.begin(t)
	_, err = processBatch(ctx, ib, tx, []inbox.Message{ev("evt-3", 6, "x"), ev("evt-3", 7, "y")}, pay)
	require.ErrorIs(t, err, inbox.ErrFingerprintMismatch)
	require.ErrorAs(t, err, &me)
	require.Equal(t, 1, me.Index)
	require.NoError(t, tx.Commit(ctx))

	require.Equal(t, 1, b.inboxRows(t))
	require.Equal(t, 1, b.payments(t))
	require.Equal(t, uint64(3), ib.Stats().FingerprintMismatches)
}

func TestFingerprintsOff(t *testing.T) {
	t.Parallel()
	forKinds(t, testFingerprintsOff)
}

func testFingerprintsOff(t *testing.T, b *testBundle) {
	ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id"), DisableFingerprint: true})
	h := outbox.Header{Key: "event-id", Value: []byte("evt-1")}
	_, err := b.process(t, ib, msg("orders", 0, 1, "one", h), pay)
	require.NoError(t, err)
	res, err := b.process(t, ib, msg("orders", 0, 2, "two", h), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, 0, b.count(t, `SELECT count(fingerprint) FROM pgbox_inbox`))

	// A row stored without a fingerprint is never compared, even once they are on.
	on := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	res, err = b.process(t, on, msg("orders", 0, 3, "three", h), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, 1, b.payments(t))
}

func TestStoredResult(t *testing.T) {
	t.Parallel()
	forKinds(t, testStoredResult)
}

func testStoredResult(t *testing.T, b *testBundle) {
	ib := newInbox(t, inbox.Config{})
	m := msg("orders", 0, 1, "v")
	res, err := b.process(t, ib, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := inbox.SetResult(ctx, []byte("first")); err != nil {
			return err
		}
		return inbox.SetResult(ctx, []byte("payment-42")) // the last call wins
	})
	require.NoError(t, err)
	require.Equal(t, []byte("payment-42"), res.Stored)

	res, err = b.process(t, ib, m, pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, []byte("payment-42"), res.Stored)

	// Without SetResult, duplicates get nil.
	_, err = b.process(t, ib, msg("orders", 0, 2, "v"), pay)
	require.NoError(t, err)
	res, err = b.process(t, ib, msg("orders", 0, 2, "v"), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Nil(t, res.Stored)

	require.Error(t, inbox.SetResult(context.Background(), []byte("x")))
}

// TestConcurrentDuplicates delivers one key on two connections at once, 100
// times: exactly one delivery must have an effect each time.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	forKinds(t, testConcurrentDuplicates)
}

func testConcurrentDuplicates(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	const rounds = 100
	for round := range rounds {
		m := msg("orders", 0, int64(round), "v")
		start := make(chan struct{})
		var wg sync.WaitGroup
		results := make([]inbox.Result, 2)
		errs := make([]error, 2)
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[w] = b.beginFunc(ctx, t, func(tx pgx.Tx) error {
					var err error
					results[w], err = process(ctx, ib, tx, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
						if err := inbox.SetResult(ctx, []byte(fmt.Sprint(w))); err != nil {
							return err
						}
						return pay(ctx, tx, m)
					})
					return err
				})
			}()
		}
		close(start)
		wg.Wait()
		require.NoError(t, errs[0], round)
		require.NoError(t, errs[1], round)
		require.NotEqual(t, results[0].Duplicate, results[1].Duplicate, "round %d: exactly one delivery processes", round)
		// The duplicate sees what the winner stored.
		require.Equal(t, results[0].Stored, results[1].Stored, round)
	}
	require.Equal(t, rounds, b.payments(t))
	require.Equal(t, rounds, b.count(t, `SELECT count(DISTINCT event) FROM payments`))
	require.Equal(t, inbox.Stats{Processed: rounds, Duplicates: rounds}, ib.Stats())
}

// waitBlocked waits until the backend pid waits on a lock.
func (b *testBundle) waitBlocked(t *testing.T, pid uint32) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "the backend to wait on a lock", func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid) == 1
	})
}

func TestInFlightWaits(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("first_commits=%v", commit), func(t *testing.T) {
			t.Parallel()
			forKinds(t, func(t *testing.T, b *testBundle) { inFlightWaits(t, b, commit) })
		})
	}
}

func inFlightWaits(t *testing.T, b *testBundle, commit bool) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	m := msg("orders", 0, 1, "v")

	tx1 := b.begin(t)
	_, err := process(ctx, ib, tx1, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		require.NoError(t, inbox.SetResult(ctx, []byte("from-1")))
		return pay(ctx, tx, m)
	})
	require.NoError(t, err)

	tx2 := b.begin(t)
	type outcome struct {
		res inbox.Result
		err error
	}
	done := make(chan outcome, 1)
	pid2 := pid(t, tx2)
	go func() {
		res, err := process(ctx, ib, tx2, m, pay)
		done <- outcome{res, err}
	}()
	b.waitBlocked(t, pid2)
	if commit {
		require.NoError(t, tx1.Commit(ctx))
	} else {
		require.NoError(t, tx1.Rollback(ctx))
	}
	o := <-done
	require.NoError(t, o.err)
	require.NoError(t, tx2.Commit(ctx))
	require.Equal(t, commit, o.res.Duplicate)
	if commit {
		require.Equal(t, []byte("from-1"), o.res.Stored)
	}
	require.Equal(t, 1, b.payments(t))
	require.Equal(t, 1, b.inboxRows(t))
}

func TestInFlightLockTimeout(t *testing.T) {
	t.Parallel()
	forKinds(t, testInFlightLockTimeout)
}

func testInFlightLockTimeout(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{LockTimeout: 50 * time.Millisecond})
	m := msg("orders", 0, 1, "v")
	other := msg("orders", 0, 2, "v")

	tx1 := b.begin(t)
	_, err := process(ctx, ib, tx1, m, pay)
	require.NoError(t, err)

	showLockTimeout := func(tx pgx.Tx) string {
		var s string
		require.NoError(t, tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&s))
		return s
	}
	tx2 := b.begin(t)
	_, err = tx2.Exec(ctx, `SET LOCAL lock_timeout = '7s'`)
	require.NoError(t, err)

	_, err = process(ctx, ib, tx2, m, pay)
	require.ErrorIs(t, err, inbox.ErrInFlight)
	require.ErrorContains(t, err, `key "orders/0/1"`)
	require.Equal(t, "7s", showLockTimeout(tx2), "the caller's setting is restored")

	_, err = processBatch(ctx, ib, tx2, []inbox.Message{other, m}, pay)
	require.ErrorIs(t, err, inbox.ErrInFlight)
	require.Equal(t, "7s", showLockTimeout(tx2))

	// The transaction is still usable; a new key processes, and its handler
	// runs under the caller's lock_timeout.
	var inHandler string
	_, err = process(ctx, ib, tx2, other, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		inHandler = showLockTimeout(tx)
		return pay(ctx, tx, m)
	})
	require.NoError(t, err)
	require.Equal(t, "7s", inHandler)
	require.Equal(t, "7s", showLockTimeout(tx2))
	require.NoError(t, tx2.Commit(ctx))

	// Without Config.LockTimeout, the caller's own lock_timeout maps to
	// ErrInFlight the same way.
	waiting := newInbox(t, inbox.Config{})
	tx3 := b.begin(t)
	_, err = tx3.Exec(ctx, `SET LOCAL lock_timeout = '50ms'`)
	require.NoError(t, err)
	_, err = process(ctx, waiting, tx3, m, pay)
	require.ErrorIs(t, err, inbox.ErrInFlight)
	_, err = tx3.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.NoError(t, tx3.Rollback(ctx))
	require.NoError(t, tx1.Commit(ctx))

	// Once the first commits, the key is a plain duplicate.
	res, err := b.process(t, ib, m, pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, 2, b.payments(t))
	require.Equal(t, uint64(2), ib.Stats().InFlight)
}

func TestKeys(t *testing.T) {
	t.Parallel()
	ib := newInbox(t, inbox.Config{})
	k, err := ib.Key(inbox.Message{Topic: "orders", Partition: 3, Offset: 42})
	require.NoError(t, err)
	require.Equal(t, "orders/3/42", k)
	k, err = ib.Key(inbox.Message{Topic: "orders", TopicID: "AAAAAAAAAAAAAAAAAAAAAQ", Partition: 3, Offset: 42})
	require.NoError(t, err)
	require.Equal(t, "orders@AAAAAAAAAAAAAAAAAAAAAQ/3/42", k)

	// Repeated headers: the last one wins.
	byHeader := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	k, err = byHeader.Key(inbox.Message{Topic: "orders", Headers: []outbox.Header{
		{Key: "event-id", Value: []byte("one")}, {Key: "Event-Id", Value: []byte("x")}, {Key: "event-id", Value: []byte("two")}}})
	require.NoError(t, err)
	require.Equal(t, "two", k)

	byFunc := newInbox(t, inbox.Config{Key: inbox.ByFunc(func(m inbox.Message) (string, error) { return "order:" + string(m.Key), nil })})
	k, err = byFunc.Key(inbox.Message{Topic: "orders", Key: []byte("o-1")})
	require.NoError(t, err)
	require.Equal(t, "order:o-1", k)
}

// TestConcurrentBatches runs two batches with the same keys in opposite
// orders at once: keys are locked in one order, so they never deadlock, and
// each key has exactly one effect.
func TestConcurrentBatches(t *testing.T) {
	t.Parallel()
	forKinds(t, testConcurrentBatches)
}

func testConcurrentBatches(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	const rounds, size = 20, 10
	for round := range rounds {
		fwd := make([]inbox.Message, size)
		for i := range fwd {
			fwd[i] = msg("orders", int32(round), int64(i), "v")
		}
		rev := slices.Clone(fwd)
		slices.Reverse(rev)
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, 2)
		dups := make([]int, 2)
		for w, batch := range [][]inbox.Message{fwd, rev} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[w] = b.beginFunc(ctx, t, func(tx pgx.Tx) error {
					res, err := processBatch(ctx, ib, tx, batch, pay)
					for _, r := range res {
						if r.Duplicate {
							dups[w]++
						}
					}
					return err
				})
			}()
		}
		close(start)
		wg.Wait()
		require.NoError(t, errs[0], round)
		require.NoError(t, errs[1], round)
		require.Equal(t, size, dups[0]+dups[1], round)
	}
	require.Equal(t, rounds*size, b.payments(t))
	require.Equal(t, rounds*size, b.count(t, `SELECT count(DISTINCT event) FROM payments`))
}
