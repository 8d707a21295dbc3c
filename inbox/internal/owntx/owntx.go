// Package owntx lets a caller that owns a transaction outright tell
// inbox.Process and inbox.ProcessBatch so, without widening the inbox's
// public API. The inbox's own consumer loop (inbox/internal/consume, which
// inboxsarama and inboxfranz drive) begins each transaction itself and rolls
// the whole of it back on any error the inbox returns: the savepoint that
// lets other callers carry on after an error would only cost it a statement
// and a subtransaction per call. A batch whose first, plain insert meets a
// key seen before fails with a Conflict error instead, and the loop runs it
// again in a new transaction.
package owntx

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

type key struct{}

// With returns a context saying that the caller owns tx: it began tx, and
// rolls it back, never commits it, when Process or ProcessBatch returns an
// error. The inbox then opens no savepoint in tx and leaves whatever an
// error left behind (an aborted transaction, the key, the handler's writes)
// for that rollback to undo.
func With(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, key{}, tx)
}

// Owns reports whether ctx says that its caller owns tx (With).
func Owns(ctx context.Context, tx pgx.Tx) bool {
	t, ok := ctx.Value(key{}).(pgx.Tx)
	return ok && t == tx
}

// Drop returns ctx without the mark, for the handler's context: a handler
// calling Process in turn (another inbox, the same transaction) gets the
// savepoint, since it may carry on after an error.
func Drop(ctx context.Context) context.Context {
	return context.WithValue(ctx, key{}, nil)
}

// conflictError is Conflict's error.
type conflictError struct{ err error }

func (e *conflictError) Error() string { return e.err.Error() }
func (e *conflictError) Unwrap() error { return e.err }

// Conflict marks err, returned by ProcessBatch in a transaction its caller
// owns, as the failure of its first insert on a key seen before: the
// transaction is aborted, nothing in it was the handler's, and running the
// same work again in a new transaction right away is expected to succeed
// (the inbox then takes ON CONFLICT for the keys).
func Conflict(err error) error { return &conflictError{err: err} }

// IsConflict reports whether err is (wraps) a Conflict.
func IsConflict(err error) bool {
	var c *conflictError
	return errors.As(err, &c)
}
