package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/internal/testdb"
)

func pg(code, msg string) error {
	return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code, Message: msg})
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want pgerr.Class
	}{
		{nil, pgerr.Other},
		{context.Canceled, pgerr.Other},
		{context.DeadlineExceeded, pgerr.Retryable},
		{errors.New("plain"), pgerr.Other},
		{pg("23505", "duplicate key"), pgerr.Other},
		{pg("40001", ""), pgerr.Retryable},
		{pg("40P01", ""), pgerr.Retryable},
		{pg("55P03", ""), pgerr.Retryable},
		{pg("57P01", ""), pgerr.Retryable},
		{pg("57P03", ""), pgerr.Retryable},
		{pg("25006", ""), pgerr.Retryable},
		{pg("08006", ""), pgerr.Retryable},
		{pg("53300", ""), pgerr.Retryable},
		{pg("57014", ""), pgerr.Retryable},
		{fmt.Errorf("begin: %w", pgconn.ErrConnClosed), pgerr.Retryable},
		{io.ErrUnexpectedEOF, pgerr.Retryable},
		{pg("42P01", `relation "pgbox_outbox" does not exist`), pgerr.Operator},
		{pg("42703", ""), pgerr.Operator},
		{pg("42883", ""), pgerr.Operator},
		{pg("3F000", ""), pgerr.Operator},
		{pg("42501", "permission denied for table pgbox_outbox"), pgerr.Operator},
		{pg("3D000", ""), pgerr.Operator},
		{pg("28000", ""), pgerr.Operator},
		{pg("28P01", ""), pgerr.Operator},
		{fmt.Errorf("x: %w", pgerr.ErrNeedsOperator), pgerr.Operator},
	} {
		require.Equal(t, tc.want, pgerr.Classify(tc.err), "%v", tc.err)
	}
}

func TestWithFix(t *testing.T) {
	t.Parallel()
	plain := errors.New("plain")
	require.Same(t, plain, pgerr.WithFix(plain), "not an operator error: unchanged")
	require.NoError(t, pgerr.WithFix(nil))

	err := pgerr.WithFix(pg("42P01", `relation "pgbox_relay_lanes" does not exist`))
	require.ErrorIs(t, err, pgerr.ErrNeedsOperator)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42P01", pgErr.Code)
	require.ErrorContains(t, err, "relay migrate up")
	require.Equal(t, err, pgerr.WithFix(err), "marked once")

	require.Contains(t, pgerr.Fix(pg("42P01", `relation "payments" does not exist`)), "apply the service's migrations")
	require.Contains(t, pgerr.Fix(pg("42501", "permission denied for table pgbox_outbox")), "on pgbox_outbox")
	require.Contains(t, pgerr.Fix(pg("28P01", "password authentication failed for user \"relay\"")), "fix the user or password")
	require.Empty(t, pgerr.Fix(pg("40001", "")))
}

// The codes come from a real server as the classifier expects them.
func TestClassifyRealServer(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `SELECT 1 FROM pgbox_outbox`)
	require.Equal(t, pgerr.Operator, pgerr.Classify(err))
	require.True(t, pgerr.IsUndefinedTable(err))
	require.Contains(t, pgerr.Fix(err), "relay migrate up")

	_, err = db.Pool.Exec(ctx, `SELECT no_such_column FROM pg_class`)
	require.Equal(t, pgerr.Operator, pgerr.Classify(err))

	_, err = db.Pool.Exec(ctx, `SELECT 1/0`)
	require.Equal(t, pgerr.Other, pgerr.Classify(err))

	_, err = db.Pool.Exec(ctx, `SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)`)
	require.Equal(t, pgerr.Retryable, pgerr.Classify(err))
}
