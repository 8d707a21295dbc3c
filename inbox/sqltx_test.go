package inbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
)

// ProcessSQL and ProcessBatchSQL refuse a *sql.Tx they cannot work in, with
// an error saying what is needed, before anything is sent: one from another
// driver (strict about argument types, or taking any), one already committed
// or rolled back, one whose connection left its transaction block (COMMIT
// run through it: a write there would commit on its own).
func TestProcessSQLRefusesUnusableTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	m := msg("orders", 0, 1, "v")
	handler := func(context.Context, *sql.Tx, inbox.Message) error {
		t.Error("the handler ran in a refused transaction")
		return nil
	}
	check := func(name string, tx *sql.Tx, want string) {
		t.Helper()
		_, err := ib.ProcessSQL(ctx, tx, m, handler)
		require.ErrorIs(t, err, inbox.ErrUnsupportedTx, name)
		require.ErrorContains(t, err, "pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib", name)
		require.ErrorContains(t, err, want, name)
		require.ErrorContains(t, err, `key "orders/0/1"`, name) // names the message
		_, err = ib.ProcessBatchSQL(ctx, tx, []inbox.Message{m, msg("orders", 0, 2, "v")}, handler)
		require.ErrorIs(t, err, inbox.ErrUnsupportedTx, name)
		require.ErrorContains(t, err, want, name)
	}

	for _, u := range testdb.UnusableTxs(t, b.db) {
		check(u.Name, u.Tx, u.Want)
		switch {
		case u.Driver == nil:
		case u.Driver.AcceptAny:
			// It ran only the harmless probe, which reads and writes nothing.
			require.Equal(t, []string{"BEGIN", "SELECT $1::text WHERE false", "SELECT $1::text WHERE false"}, u.Driver.Sent())
		default:
			require.Equal(t, []string{"BEGIN"}, u.Driver.Sent(), "nothing sent")
		}
	}

	_, err := ib.ProcessSQL(ctx, nil, m, handler)
	require.ErrorContains(t, err, "needs a non-nil tx and handler")
	require.Zero(t, b.inboxRows(t))
	require.Zero(t, b.payments(t))
}

// A database/sql caller gets the same errors as a pgx one: without the
// migrations, the one that names the fix.
func TestProcessSQLMigrationsNotRun(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()
	noop := func(context.Context, *sql.Tx, inbox.Message) error { return nil }

	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ib.ProcessSQL(ctx, tx, msg("orders", 0, 1, "v"), noop)
	require.ErrorIs(t, err, inbox.ErrNeedsOperator)
	require.ErrorContains(t, err, "relay migrate up")
	require.NoError(t, tx.Rollback())

	tx, err = sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ib.ProcessBatchSQL(ctx, tx, []inbox.Message{msg("orders", 0, 1, "v"), msg("orders", 0, 2, "w")}, noop)
	require.ErrorIs(t, err, inbox.ErrNeedsOperator)
	require.ErrorContains(t, err, "relay migrate up")
	require.NoError(t, tx.Rollback())
}

// A handler whose own statement fails aborts the transaction; the rollback to
// the inbox's savepoint makes it usable again, in either kind of transaction
// (through database/sql, the rollback goes through the *sql.Tx).
func TestHandlerStatementErrorLeavesTxUsable(t *testing.T) {
	t.Parallel()
	forKinds(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		ib := newInbox(t, inbox.Config{})
		failing := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if err := pay(ctx, tx, m); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		}
		tx := b.begin(t)
		_, err := process(ctx, ib, tx, msg("orders", 0, 1, "v"), failing)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "22012", pgErr.Code)
		_, err = processBatch(ctx, ib, tx, []inbox.Message{msg("orders", 0, 2, "v"), msg("orders", 0, 3, "v")}, failing)
		require.ErrorAs(t, err, &pgErr)
		_, err = tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ('after', 1)`)
		require.NoError(t, err, "the caller's transaction is usable")
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 1, b.payments(t))
		require.Zero(t, b.inboxRows(t))
	})
}
