package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// txKind is a kind of caller's transaction the guarantee tests run in: a
// pgx.Tx (Write) or a database/sql *sql.Tx on pgx's stdlib driver
// (WriteSQL). One test body serves both through kindTx.
type txKind string

var txKinds = []txKind{"pgx", "database_sql"}

// forKinds runs body once per transaction kind, each in its own schema.
func forKinds(t *testing.T, body func(t *testing.T, db *testdb.DB, k txKind)) {
	t.Helper()
	for _, k := range txKinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			body(t, testdb.New(t), k)
		})
	}
}

// kindTx is a transaction of either kind, rolled back at cleanup if open.
type kindTx struct {
	pgx pgx.Tx
	sql *sql.Tx
}

func begin(t *testing.T, db *testdb.DB, k txKind) *kindTx {
	t.Helper()
	ctx := context.Background()
	if k == "pgx" {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		return &kindTx{pgx: tx}
	}
	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sdb.Close() })
	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	return &kindTx{sql: tx}
}

// write is w.Write or w.WriteSQL (the default Writer when w is nil).
func (k *kindTx) write(ctx context.Context, w *outbox.Writer, msgs ...outbox.Message) error {
	if w == nil {
		if k.sql != nil {
			return outbox.WriteSQL(ctx, k.sql, msgs...)
		}
		return outbox.Write(ctx, k.pgx, msgs...)
	}
	if k.sql != nil {
		return w.WriteSQL(ctx, k.sql, msgs...)
	}
	return w.Write(ctx, k.pgx, msgs...)
}

// rows counts the outbox rows the transaction sees.
func (k *kindTx) rows(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	const q = `SELECT count(*) FROM pgbox_outbox`
	var n int
	if k.sql != nil {
		require.NoError(t, k.sql.QueryRowContext(ctx, q).Scan(&n))
	} else {
		require.NoError(t, k.pgx.QueryRow(ctx, q).Scan(&n))
	}
	return n
}

func (k *kindTx) commit(ctx context.Context) error {
	if k.sql != nil {
		return k.sql.Commit()
	}
	return k.pgx.Commit(ctx)
}

func (k *kindTx) rollback(ctx context.Context) error {
	if k.sql != nil {
		return k.sql.Rollback()
	}
	return k.pgx.Rollback(ctx)
}
