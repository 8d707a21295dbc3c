package inbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox/internal/owntx"
)

// BatchHandlerFunc does the business work of a whole batch at once, inside
// the caller's transaction: ms are the batch's messages whose keys are new,
// in input order (duplicates, and later copies of a key within the batch,
// are left out). It is the handler of ProcessBatchAtOnce, and of the consumer
// adapters when ConsumerConfig.BatchHandler is set: one INSERT … SELECT …
// FROM unnest(…) for the batch's rows and one outbox.Write for its events
// replace a statement per message.
//
// Returning nil commits the work of every message in ms with their keys.
// Returning an error fails the batch; to fail some messages only, return a
// *BatchError naming them (see BatchError for what the adapters then do).
// Its ctx carries the slots of SetBatchResult.
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, ms []Message) error

// SQLBatchHandlerFunc is BatchHandlerFunc for ProcessBatchAtOnceSQL: it gets
// the caller's *sql.Tx.
type SQLBatchHandlerFunc func(ctx context.Context, tx *sql.Tx, ms []Message) error

// BatchError is the error a batch handler returns to fail some of its
// messages, not the batch: it names each failed message by its position in
// the slice the handler received, with its own error (wrap it in Permanent
// to dead-letter the message at once). Build it with Add and return Err:
//
//	var failed inbox.BatchError
//	for i, m := range ms {
//		if err := validate(m); err != nil {
//			failed.Add(i, inbox.Permanent(err))
//		}
//	}
//	if err := failed.Err(); err != nil {
//		return err
//	}
//
// The transaction is failed all the same (nothing the handler wrote
// commits: a statement that wrote the rows of several messages cannot be
// undone for one of them); what the detail buys is the order rule of the
// adapters: the batch is cut at the first failed message. The messages before
// it are processed again as a batch and commit, the failed message is
// retried alone (its attempt counted, dead-lettered after MaxAttempts or at
// once for Permanent), and the messages after it follow as a new batch, so a
// partition's messages still commit in offset order. ProcessBatchAtOnce
// itself reports the first failed message as a *MessageError (its Index in
// the caller's input). A handler error that is not a *BatchError (and a
// BatchError that names no message of the batch) fails the whole batch: the
// adapters then process its messages one by one.
type BatchError struct {
	failed []failedMessage
}

type failedMessage struct {
	index int
	err   error
}

// Add records that the message at position i of the handler's ms failed with
// err. A nil err records nothing; adding a position twice keeps the first
// error.
func (e *BatchError) Add(i int, err error) {
	if err == nil || slices.ContainsFunc(e.failed, func(f failedMessage) bool { return f.index == i }) {
		return
	}
	e.failed = append(e.failed, failedMessage{index: i, err: err})
}

// Err returns e if it names a failed message, else nil: a handler returns
// failed.Err() whether or not anything failed.
func (e *BatchError) Err() error {
	if e == nil || len(e.failed) == 0 {
		return nil
	}
	return e
}

// Len is how many messages e names.
func (e *BatchError) Len() int { return len(e.failed) }

// Failed returns the error recorded for position i of the handler's ms, nil
// when none was.
func (e *BatchError) Failed(i int) error {
	for _, f := range e.failed {
		if f.index == i {
			return f.err
		}
	}
	return nil
}

func (e *BatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d message(s) of the batch failed", len(e.failed))
	for _, f := range e.sorted() {
		fmt.Fprintf(&b, "; message %d: %v", f.index, f.err)
	}
	return b.String()
}

// Unwrap returns the recorded errors, in position order, for errors.Is and
// errors.As.
func (e *BatchError) Unwrap() []error {
	errs := make([]error, len(e.failed))
	for i, f := range e.sorted() {
		errs[i] = f.err
	}
	return errs
}

func (e *BatchError) sorted() []failedMessage {
	return slices.SortedFunc(slices.Values(e.failed), func(a, b failedMessage) int { return a.index - b.index })
}

// first is the failed message with the lowest position, if every position
// named lies within n messages.
func (e *BatchError) first(n int) (failedMessage, bool) {
	s := e.sorted()
	if len(s) == 0 || s[0].index < 0 || s[len(s)-1].index >= n {
		return failedMessage{}, false
	}
	return s[0], true
}

// ProcessBatchAtOnce is ProcessBatch with a batch handler: the same dedup step
// (one round trip for every key of ms, in one savepoint, when all are new;
// keys seen before cost more, see ProcessBatch), then h runs once,
// with the messages whose keys are new, in input order. h is not called when
// every message is a duplicate. results[i] is for ms[i], as ProcessBatch's.
//
// SetBatchResult(ctx, i, b) in h stores b with the key of h's ms[i]; later
// duplicates get it back in Result.Stored. Fingerprints are checked per
// message before h runs, as in ProcessBatch.
//
// All or nothing, as ProcessBatch: when h fails, every key of the batch and
// everything h wrote are rolled back to the savepoint (the caller's
// transaction stays usable), and the error says which message failed: a
// *BatchError from h becomes a *MessageError naming the first message it
// names (Index is its position in ms, Err wraps that message's error);
// any other error of h fails the batch as a whole (not a *MessageError),
// wrapping h's error. See BatchError for how the consumer adapters carry on
// from a failed message without breaking a partition's order.
func (ib *Inbox) ProcessBatchAtOnce(ctx context.Context, tx pgx.Tx, ms []Message, h BatchHandlerFunc) ([]Result, error) {
	if tx == nil || h == nil {
		return nil, errors.New("inbox: ProcessBatchAtOnce needs a non-nil tx and batch handler")
	}
	return processBatchAtOnce(ctx, ib, pgxBatchKind{pgxKind: pgxKind{Tx: tx}, bh: h}, ms, owntx.Owns(ctx, tx))
}

// ProcessBatchAtOnceSQL is ProcessBatchAtOnce inside a database/sql
// transaction, as ProcessSQL is Process.
func (ib *Inbox) ProcessBatchAtOnceSQL(ctx context.Context, tx *sql.Tx, ms []Message, h SQLBatchHandlerFunc) ([]Result, error) {
	if tx == nil || h == nil {
		return nil, errors.New("inbox: ProcessBatchAtOnceSQL needs a non-nil tx and batch handler")
	}
	return processBatchAtOnce(ctx, ib, sqlBatchKind{sqlKind: sqlKind{tx: tx}, bh: h}, ms, false)
}

// deduper is what the dedup step needs of a kind of transaction.
type deduper interface {
	dedup(ctx context.Context, fn func(querier) error) error
}

// batchKind is a kind of caller's transaction with a batch handler.
type batchKind interface {
	execer
	deduper
	handleBatch(ctx context.Context, ms []Message) error
}

// pgxBatchKind and sqlBatchKind reuse the per-message kinds' transaction
// plumbing; their per-message handler is never set nor called.
type pgxBatchKind struct {
	pgxKind
	bh BatchHandlerFunc
}

func (k pgxBatchKind) handleBatch(ctx context.Context, ms []Message) error {
	return k.bh(ctx, k.Tx, ms)
}

type sqlBatchKind struct {
	sqlKind
	bh SQLBatchHandlerFunc
}

func (k sqlBatchKind) handleBatch(ctx context.Context, ms []Message) error {
	return k.bh(ctx, k.tx, ms)
}

func processBatchAtOnce[T batchKind](ctx context.Context, ib *Inbox, tx T, ms []Message, owned bool) ([]Result, error) {
	p, err := dedupBatchOf(ctx, ib, tx, ms, owned)
	if err != nil || p == nil {
		return nil, err
	}
	fresh, dups := ib.triage(ms, p)
	if len(fresh) > 0 {
		sub := make([]Message, len(fresh))
		for j, i := range fresh {
			sub[j] = ms[i]
		}
		slots := &batchSlots{s: make([]resultSlot, len(fresh))}
		if err := tx.handleBatch(batchCtx(ctx, slots, owned), sub); err != nil {
			ib.stats.handlerErrors.Add(1)
			return nil, undo(ctx, tx, owned, ib.batchHandlerErr(ms, p, fresh, err))
		}
		for j, s := range slots.s {
			if s.set {
				p.results[fresh[j]].Stored = s.b
			}
		}
	}
	if err := ib.finishBatch(ctx, tx, p, fresh, dups, owned); err != nil {
		return nil, err
	}
	return p.results, nil
}

// batchHandlerErr is what ProcessBatchAtOnce returns when h failed with err:
// a *MessageError for the first message a *BatchError names, else the batch's
// error.
func (ib *Inbox) batchHandlerErr(ms []Message, p *batchPlan, fresh []int, err error) error {
	var be *BatchError
	if !errors.As(err, &be) || be.Len() == 0 {
		return fmt.Errorf("inbox: consumer %q, batch of %d: handler: %w", ib.consumer, len(ms), err)
	}
	f, ok := be.first(len(fresh))
	if !ok {
		return fmt.Errorf("inbox: consumer %q, batch of %d: handler: its BatchError names a message outside the %d it received: %w",
			ib.consumer, len(ms), len(fresh), err)
	}
	i := fresh[f.index]
	return ib.msgErr(i, ms[i], p.results[i].Key, fmt.Errorf("handler: %w", f.err))
}

// batchSlots are a batch handler's SetBatchResult slots, one per message.
type batchSlots struct{ s []resultSlot }

type batchSlotsKey struct{}

// batchCtx is the context a batch handler receives: handlerCtx's, with a
// result slot per message.
func batchCtx(ctx context.Context, slots *batchSlots, owned bool) context.Context {
	if owned {
		ctx = owntx.Drop(ctx)
	}
	return context.WithValue(ctx, batchSlotsKey{}, slots)
}

// SetBatchResult is SetResult for a batch handler: it stores result with the
// key of ms[i], the i-th message the handler received. It returns an error
// when ctx is not a batch handler's, or i is not a position of its ms.
func SetBatchResult(ctx context.Context, i int, result []byte) error {
	s, ok := ctx.Value(batchSlotsKey{}).(*batchSlots)
	if !ok {
		return errors.New("inbox: SetBatchResult called with a context that is not a batch handler's (pass the ctx the batch handler received; a per-message handler calls SetResult)")
	}
	if i < 0 || i >= len(s.s) {
		return fmt.Errorf("inbox: SetBatchResult: message %d is not one of the %d the batch handler received", i, len(s.s))
	}
	s.s[i] = resultSlot{b: bytes.Clone(result), set: true}
	return nil
}
