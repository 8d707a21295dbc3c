package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
)

// Without pgbox's migrations, Process and ProcessBatch fail with an error
// that says what to run. (The caller's transaction is then aborted: pgx
// prepares the pipelined statements before the savepoint runs, and a failed
// prepare aborts the transaction. It has to be rolled back, which a caller
// does with any error that needs an operator.)
func TestProcessMigrationsNotRun(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	noop := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()

	_, err = ib.Process(ctx, tx, msg("orders", 0, 1, "v"), noop)
	require.ErrorIs(t, err, inbox.ErrNeedsOperator)
	require.ErrorContains(t, err, "relay migrate up")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42P01", pgErr.Code)

	require.NoError(t, tx.Rollback(ctx))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = ib.ProcessBatch(ctx, tx, []inbox.Message{msg("orders", 0, 1, "v"), msg("orders", 0, 2, "w")}, noop)
	require.ErrorIs(t, err, inbox.ErrNeedsOperator)
	require.ErrorContains(t, err, "relay migrate up")
}
