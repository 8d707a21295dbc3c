package inbox

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbox/pgbox/internal/pgxsql"
)

// ErrUnsupportedTx: ProcessSQL or ProcessBatchSQL was given a *sql.Tx it
// cannot work in: one from a driver other than pgx's stdlib (or behind a
// driver wrapper that does not pass arguments through), one already committed
// or rolled back, or one whose connection is not in a transaction. Nothing
// was written. It is the same value as outbox.ErrUnsupportedTx.
var ErrUnsupportedTx = pgxsql.ErrUnsupportedTx

// SQLHandlerFunc is HandlerFunc for ProcessSQL and ProcessBatchSQL: it gets
// the caller's *sql.Tx, the one its ORM or sqlc queries run in.
type SQLHandlerFunc func(ctx context.Context, tx *sql.Tx, m Message) error

// ProcessSQL is Process inside a database/sql transaction opened on pgx's
// stdlib driver (sql.Open("pgx", …), stdlib.OpenDB; GORM's postgres driver;
// bun or sqlc on such a *sql.DB). Everything Process says holds: the same
// statements, savepoint, results and errors. The dedup step runs on the pgx
// connection under tx, inside one ExecContext call that then sends an empty
// statement (one round trip more than Process; see docs/consumer.md), then h
// runs with tx. A tx that is not usable this way (another driver, already
// ended, or out of its transaction block) is refused with an error wrapping
// ErrUnsupportedTx before anything is written.
func (ib *Inbox) ProcessSQL(ctx context.Context, tx *sql.Tx, m Message, h SQLHandlerFunc) (Result, error) {
	if tx == nil || h == nil {
		return Result{}, errors.New("inbox: ProcessSQL needs a non-nil tx and handler")
	}
	return process(ctx, ib, sqlKind{tx: tx, h: h}, m, false)
}

// ProcessBatchSQL is ProcessBatch inside a database/sql transaction, as
// ProcessSQL is Process.
func (ib *Inbox) ProcessBatchSQL(ctx context.Context, tx *sql.Tx, ms []Message, h SQLHandlerFunc) ([]Result, error) {
	if tx == nil || h == nil {
		return nil, errors.New("inbox: ProcessBatchSQL needs a non-nil tx and handler")
	}
	return processBatch(ctx, ib, sqlKind{tx: tx, h: h}, ms, false)
}

// querier is what the dedup step needs of a transaction: a pgx.Tx, or the
// *pgx.Conn under a database/sql transaction.
type querier interface {
	execer
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// execer is what undoing the savepoint and storing results need.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// txKind is a kind of caller's transaction with its handler: pgxKind or
// sqlKind. Process and ProcessBatch are one body over both (process,
// processBatch), instantiated per kind.
type txKind interface {
	execer
	// dedup runs fn with a querier in the transaction.
	dedup(ctx context.Context, fn func(querier) error) error
	// handle runs the caller's handler.
	handle(ctx context.Context, m Message) error
}

type pgxKind struct {
	pgx.Tx
	h HandlerFunc
}

func (k pgxKind) dedup(_ context.Context, fn func(querier) error) error { return fn(k.Tx) }
func (k pgxKind) handle(ctx context.Context, m Message) error           { return k.h(ctx, k.Tx, m) }

type sqlKind struct {
	tx *sql.Tx
	h  SQLHandlerFunc
}

// dedup runs fn on the pgx connection under the *sql.Tx, inside the driver
// call database/sql serializes (pgxsql.Run).
func (k sqlKind) dedup(ctx context.Context, fn func(querier) error) error {
	return pgxsql.Run(ctx, k.tx, func(c *pgx.Conn) (string, []any, error) { return "", nil, fn(c) })
}

func (k sqlKind) handle(ctx context.Context, m Message) error { return k.h(ctx, k.tx, m) }

// Exec runs the statements after the handler (store results, undo) through
// the *sql.Tx, as any of the caller's statements: stdlib hands them to the
// same pgx connection.
func (k sqlKind) Exec(ctx context.Context, stmt string, args ...any) (pgconn.CommandTag, error) {
	_, err := k.tx.ExecContext(ctx, stmt, args...)
	return pgconn.CommandTag{}, err
}
