// Package owntx lets a caller that owns a transaction outright tell
// inbox.Process and inbox.ProcessBatch so, without widening the inbox's
// public API. The inbox's own consumer loop (inbox/internal/consume, which
// inboxsarama and inboxfranz drive) begins each transaction itself and rolls
// the whole of it back on any error the inbox returns: the savepoint that
// lets other callers carry on after an error would only cost it a statement
// and a subtransaction per call.
package owntx

import (
	"context"

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
