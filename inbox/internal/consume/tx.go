package consume

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lazyTx is the transaction the adapter runs a message (or a batch) in. It
// does not send BEGIN on its own: the first batch of statements sent through
// it begins the transaction (pgx's Batch.BeginTx), in the same round trip.
// That batch is the inbox's dedup step, so a transaction costs three round
// trips (BEGIN and the dedup step, the handler's statements, COMMIT) instead
// of four. Any other first call begins the transaction the usual way first.
// From then on every call goes to pgx's own transaction.
type lazyTx struct {
	conn *pgx.Conn
	tx   pgx.Tx // nil until begun
	// done: committed or rolled back before anything was sent.
	done bool
}

var _ pgx.Tx = (*lazyTx)(nil)

// begun returns the transaction, beginning it the usual way if nothing has.
func (t *lazyTx) begun(ctx context.Context) (pgx.Tx, error) {
	if t.tx != nil {
		return t.tx, nil
	}
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	tx, err := t.conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	t.tx = tx
	return tx, nil
}

// SendBatch sends b; if the transaction was not begun, b begins it.
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	if t.done {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	bb := &pgx.Batch{}
	bb.BeginTx(pgx.TxOptions{})
	bb.QueuedQueries = append(bb.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, bb)
	t.tx = br.Tx()
	// The begin query's result comes first; the caller reads its own.
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := t.begun(ctx)
	if err != nil {
		return errRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, cols, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// LargeObjects is pgx's. The adapter's handlers get the transaction begun
// (by the dedup step); were it not, it is begun here, without a deadline,
// and if that fails the zero LargeObjects (whose calls panic) comes back.
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.begun(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return tx.LargeObjects()
}

// Commit commits; a transaction nothing was sent in has nothing to commit.
func (t *lazyTx) Commit(ctx context.Context) error {
	if t.tx == nil {
		if t.done {
			return pgx.ErrTxClosed
		}
		t.done = true
		return nil
	}
	return t.tx.Commit(ctx)
}

// Rollback rolls back; a transaction nothing was sent in has nothing to roll
// back.
func (t *lazyTx) Rollback(ctx context.Context) error {
	if t.tx == nil {
		if t.done {
			return pgx.ErrTxClosed
		}
		t.done = true
		return nil
	}
	return t.tx.Rollback(ctx)
}

func (t *lazyTx) Conn() *pgx.Conn { return t.conn }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
