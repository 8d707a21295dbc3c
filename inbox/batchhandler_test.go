package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// processBatchAtOnce is ib.ProcessBatchAtOnce, or ib.ProcessBatchAtOnceSQL
// for the database/sql kind (the handler's statements then go through the
// caller's *sql.Tx).
func processBatchAtOnce(ctx context.Context, ib *inbox.Inbox, tx pgx.Tx, ms []inbox.Message, h inbox.BatchHandlerFunc) ([]inbox.Result, error) {
	s, ok := tx.(*sqlTx)
	if !ok {
		return ib.ProcessBatchAtOnce(ctx, tx, ms, h)
	}
	return ib.ProcessBatchAtOnceSQL(ctx, s.tx, ms, func(ctx context.Context, tx *sql.Tx, ms []inbox.Message) error {
		if tx != s.tx {
			return fmt.Errorf("the batch handler got *sql.Tx %p, not the caller's %p", tx, s.tx)
		}
		return h(ctx, &sqlTx{tx: tx}, ms)
	})
}

// payMany is a batch handler whose effect is one payments row per message,
// all written in one statement.
func payMany(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
	evs := make([]string, len(ms))
	for i, m := range ms {
		evs[i] = m.String()
	}
	_, err := tx.Exec(ctx, `INSERT INTO payments (event, amount) SELECT unnest($1::text[]), 100`, evs)
	return err
}

// The batch handler runs once, with the batch's new messages in input
// order (duplicates of earlier batches and later copies within the batch
// left out), and its per-message results are stored with their keys.
func TestProcessBatchAtOnce(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessBatchAtOnce)
}

func testProcessBatchAtOnce(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	ev := func(id string, offset int64, value string) inbox.Message {
		return msg("orders", 0, offset, value, outbox.Header{Key: "event-id", Value: []byte(id)})
	}
	_, err := b.process(t, ib, ev("A", 1, "a"), (&callLog{}).handler(func(m inbox.Message) string { return "receipt-a" }))
	require.NoError(t, err)

	var calls [][]string
	h := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
		var names []string
		for i, m := range ms {
			names = append(names, m.String())
			if err := inbox.SetBatchResult(ctx, i, []byte("receipt-"+string(m.Value))); err != nil {
				return err
			}
		}
		calls = append(calls, names)
		return payMany(ctx, tx, ms)
	}
	batch := []inbox.Message{ev("B", 2, "b"), ev("A", 3, "a"), ev("C", 4, "c"), ev("B", 5, "b")}
	tx := b.begin(t)
	res, err := processBatchAtOnce(ctx, ib, tx, batch, h)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []inbox.Result{
		{Key: "B", Stored: []byte("receipt-b")},
		{Key: "A", Duplicate: true, Stored: []byte("receipt-a")},
		{Key: "C", Stored: []byte("receipt-c")},
		{Key: "B", Duplicate: true, Stored: []byte("receipt-b")},
	}, res)
	require.Equal(t, [][]string{{"orders/0@2", "orders/0@4"}}, calls, "one call, new keys only, in input order")
	require.Equal(t, 3, b.payments(t))
	require.Equal(t, 3, b.inboxRows(t))
	require.Equal(t, inbox.Stats{Processed: 3, Duplicates: 2}, ib.Stats())

	// All duplicates: the handler is not called; stored results come back.
	calls = nil
	tx = b.begin(t)
	res, err = processBatchAtOnce(ctx, ib, tx, batch, h)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, calls)
	require.Equal(t, []byte("receipt-c"), res[2].Stored)
	require.True(t, res[0].Duplicate && res[2].Duplicate)
	require.Equal(t, 3, b.payments(t))

	res, err = processBatchAtOnce(ctx, ib, b.begin(t), nil, h)
	require.NoError(t, err)
	require.Empty(t, res)
}

// A BatchError names the failed messages by their position in the
// handler's slice: ProcessBatchAtOnce reports the first as a *MessageError
// with its position in the caller's input, and nothing of the batch remains,
// though the handler wrote every row. A plain error fails the batch without
// naming a message; so does a BatchError naming a position the handler did
// not receive.
func TestProcessBatchAtOnceFailures(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessBatchAtOnceFailures)
}

func testProcessBatchAtOnceFailures(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	_, err := b.process(t, ib, msg("orders", 0, 1, "old"), pay) // a duplicate ahead of the others
	require.NoError(t, err)
	require.Equal(t, 1, b.payments(t))
	batch := []inbox.Message{msg("orders", 0, 1, "old"), msg("orders", 0, 2, "x"), msg("orders", 0, 3, "y"), msg("orders", 0, 4, "z")}
	declined, closed := errors.New("card declined"), errors.New("account closed")

	failWith := func(fail func(ms []inbox.Message) error) inbox.BatchHandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
			if err := payMany(ctx, tx, ms); err != nil {
				return err
			}
			return fail(ms)
		}
	}
	tx := b.begin(t)
	_, err = processBatchAtOnce(ctx, ib, tx, batch, failWith(func(ms []inbox.Message) error {
		require.Len(t, ms, 3)
		var be inbox.BatchError
		be.Add(2, closed)
		be.Add(1, inbox.Permanent(declined))
		be.Add(0, nil) // nothing
		return fmt.Errorf("settle: %w", be.Err())
	}))
	var me *inbox.MessageError
	require.ErrorAs(t, err, &me)
	require.Equal(t, 2, me.Index, "the handler's ms[1] is the input's ms[2]")
	require.Equal(t, "orders/0/3", me.Key)
	require.ErrorIs(t, err, declined)
	require.ErrorIs(t, err, inbox.ErrPermanent)
	require.NotErrorIs(t, err, closed, "the first failed message's error")
	require.NoError(t, tx.Commit(ctx)) // the caller commits anyway: nothing of the batch
	require.Equal(t, 1, b.payments(t))
	require.Equal(t, 1, b.inboxRows(t))

	boom := errors.New("ledger unavailable")
	for name, fail := range map[string]func([]inbox.Message) error{
		"plain error": func([]inbox.Message) error { return boom },
		"position outside the batch": func(ms []inbox.Message) error {
			var be inbox.BatchError
			be.Add(len(ms), boom)
			return &be
		},
	} {
		tx := b.begin(t)
		_, err := processBatchAtOnce(ctx, ib, tx, batch, failWith(fail))
		require.ErrorIs(t, err, boom, name)
		require.False(t, errors.As(err, &me), "%s: no message named", name)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 1, b.payments(t), name)
	}
	require.Equal(t, uint64(3), ib.Stats().HandlerErrors)

	// Redelivered, the batch is processed whole.
	tx = b.begin(t)
	res, err := processBatchAtOnce(ctx, ib, tx, batch, payMany)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.True(t, res[0].Duplicate)
	require.Equal(t, 4, b.payments(t))
}

// SetResult is refused in a batch handler, and SetBatchResult outside one or
// for a position the handler did not receive, each with an error that says
// what to call instead.
func TestSetBatchResultRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	var errs []error
	_, err := ib.ProcessBatchAtOnce(ctx, b.begin(t), []inbox.Message{msg("orders", 0, 1, "x")},
		func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
			errs = append(errs, inbox.SetResult(ctx, []byte("r")), inbox.SetBatchResult(ctx, 1, []byte("r")))
			return nil
		})
	require.NoError(t, err)
	require.ErrorContains(t, errs[0], "SetBatchResult(ctx, i, result)")
	require.ErrorContains(t, errs[1], "message 1 is not one of the 1")
	require.ErrorContains(t, inbox.SetBatchResult(ctx, 0, nil), "not a batch handler's")
}

// Watermark mode: the batch handler sees only the offsets above the
// partition's watermark.
func TestProcessBatchAtOnceWatermark(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessBatchAtOnceWatermark)
}

func testProcessBatchAtOnceWatermark(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermark})
	var seen []int64
	h := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
		for _, m := range ms {
			seen = append(seen, m.Offset)
		}
		return payMany(ctx, tx, ms)
	}
	for _, offs := range [][]int64{{0, 1, 2}, {1, 2, 3, 4}} {
		var ms []inbox.Message
		for _, o := range offs {
			ms = append(ms, msg("orders", 0, o, "v"))
		}
		tx := b.begin(t)
		_, err := processBatchAtOnce(ctx, ib, tx, ms, h)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	require.Equal(t, []int64{0, 1, 2, 3, 4}, seen)
	require.Equal(t, 5, b.payments(t))
}
