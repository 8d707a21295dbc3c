// Package pgxsql reaches the pgx connection under a database/sql transaction
// opened on pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib: sql.Open("pgx",
// …), stdlib.OpenDB, GORM's postgres driver, bun or sqlc on a pgx *sql.DB), so
// that inbox.ProcessSQL and outbox.WriteSQL run the very statements, pipelines
// and error paths of their pgx.Tx versions.
//
// A *sql.Tx has no Raw method (only *sql.Conn has), and the driver connection
// it holds is private to database/sql. What it does have is ExecContext, whose
// arguments stdlib hands to (*pgx.Conn).Exec untouched; and pgx treats a first
// argument that implements pgx.QueryRewriter as a hook, called with the
// *pgx.Conn before anything is sent. Run passes such a hook: it runs inside
// the driver call, under the lock database/sql holds on the connection for
// that call, so nothing else can use the connection meanwhile, and it never
// keeps the *pgx.Conn past it.
//
// Any other driver refuses the hook (it is a driver.Valuer whose Value fails
// with a message naming what is needed), or, if it takes arguments of any
// type, runs the harmless probeSQL (which writes nothing and cannot fail);
// either way Run returns ErrUnsupportedTx and nothing was written.
package pgxsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrUnsupportedTx is re-exported as inbox.ErrUnsupportedTx and
// outbox.ErrUnsupportedTx (the same value).
var ErrUnsupportedTx = errors.New("the *sql.Tx must be an open transaction on pgx's database/sql driver " +
	"(github.com/jackc/pgx/v5/stdlib: sql.Open(\"pgx\", url) or stdlib.OpenDB)")

// errStop ends the driver call after fn failed; Run returns fn's error.
var errStop = errors.New("pgbox: statement not sent")

// Func runs on the *pgx.Conn of the transaction. It returns the statement
// and arguments the call then sends (the last of the caller's statements, so
// it costs no round trip of its own), or "" for none.
type Func func(conn *pgx.Conn) (sql string, args []any, err error)

type hook struct {
	fn  Func
	ran bool
	err error
}

// RewriteQuery is called by (*pgx.Conn).Exec before it sends anything.
func (h *hook) RewriteQuery(_ context.Context, conn *pgx.Conn, _ string, _ []any) (string, []any, error) {
	h.ran = true
	if conn.PgConn().TxStatus() == 'I' {
		h.err = fmt.Errorf("%w: its connection is not in a transaction block (was COMMIT or ROLLBACK run through the *sql.Tx?)", ErrUnsupportedTx)
		return "", nil, errStop
	}
	stmt, args, err := h.fn(conn)
	if err != nil {
		h.err = err
		return "", nil, errStop
	}
	if stmt == "" {
		stmt = noStatement
	}
	return stmt, args, nil
}

// Value is what a driver other than pgx's gets: an error saying what is needed.
func (*hook) Value() (driver.Value, error) {
	return nil, errors.New("pgbox: this *sql.Tx is not on pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib), " +
		"or a driver wrapper in between does not pass arguments through")
}

// Run runs fn on the *pgx.Conn under tx, then sends the statement fn
// returned, and returns the first error. Before fn runs, it refuses a tx that
// is nil, done, not in a transaction or not on pgx's driver with
// ErrUnsupportedTx, having sent nothing.
func Run(ctx context.Context, tx *sql.Tx, fn Func) error {
	if tx == nil {
		return fmt.Errorf("%w: it is nil", ErrUnsupportedTx)
	}
	h := &hook{fn: fn}
	_, err := tx.ExecContext(ctx, probeSQL, h)
	switch {
	case h.err != nil:
		return h.err
	case h.ran:
		return err // fn's statement
	case errors.Is(err, sql.ErrTxDone):
		return fmt.Errorf("%w: %w (it was already committed or rolled back)", ErrUnsupportedTx, err)
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		return fmt.Errorf("%w: %w", ErrUnsupportedTx, err)
	}
	return fmt.Errorf("%w: its driver ran the statement without handing it to pgx", ErrUnsupportedTx)
}
