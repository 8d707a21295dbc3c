package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
)

// txKind is a kind of caller's transaction the guarantee tests run in: a
// pgx.Tx (Process, ProcessBatch) or a database/sql *sql.Tx on pgx's stdlib
// driver (ProcessSQL, ProcessBatchSQL). One test body serves both: it holds
// the transaction as a pgx.Tx, which for the database/sql kind is sqlTx, and
// calls the inbox through process and processBatch below.
type txKind string

const (
	kindPgx txKind = "pgx"
	kindSQL txKind = "database_sql"
)

var txKinds = []txKind{kindPgx, kindSQL}

// forKinds runs body once per transaction kind, each in its own schema.
func forKinds(t *testing.T, body func(t *testing.T, b *testBundle)) {
	t.Helper()
	for _, k := range txKinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.kind = k
			if k == kindSQL {
				b.sqlDB(t) // opened before any goroutine begins
			}
			body(t, b)
		})
	}
}

// sqlDB opens the database/sql handle of the bundle's schema (pgx's stdlib
// driver), closed at cleanup.
func (b *testBundle) sqlDB(t *testing.T) *sql.DB {
	t.Helper()
	if b.sdb == nil {
		db, err := sql.Open("pgx", b.db.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		b.sdb = db
	}
	return b.sdb
}

// beginKind begins a transaction of the bundle's kind.
func (b *testBundle) beginKind(ctx context.Context, t *testing.T) (pgx.Tx, error) {
	if b.kind != kindSQL {
		return b.pool.Begin(ctx)
	}
	tx, err := b.sqlDB(t).BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &sqlTx{tx: tx}, nil
}

// sqlTx presents a *sql.Tx as the pgx.Tx the test bodies use: Exec,
// QueryRow, Begin (a savepoint), Commit and Rollback go through database/sql;
// the embedded pgx.Tx is nil (no test body calls anything else).
type sqlTx struct {
	pgx.Tx
	tx *sql.Tx
	sp string // a savepoint's name, for Begin's result
}

var savepoints atomic.Int64

func (s *sqlTx) Exec(ctx context.Context, q string, args ...any) (pgconn.CommandTag, error) {
	_, err := s.tx.ExecContext(ctx, q, args...)
	return pgconn.CommandTag{}, err
}

func (s *sqlTx) QueryRow(ctx context.Context, q string, args ...any) pgx.Row {
	return s.tx.QueryRowContext(ctx, q, args...)
}

func (s *sqlTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp := fmt.Sprintf("test_sp_%d", savepoints.Add(1))
	_, err := s.tx.ExecContext(ctx, "SAVEPOINT "+sp)
	return &sqlTx{tx: s.tx, sp: sp}, err
}

func (s *sqlTx) Commit(ctx context.Context) error {
	if s.sp != "" {
		_, err := s.tx.ExecContext(ctx, "RELEASE SAVEPOINT "+s.sp)
		return err
	}
	return s.tx.Commit()
}

func (s *sqlTx) Rollback(ctx context.Context) error {
	if s.sp != "" {
		_, err := s.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+s.sp+"; RELEASE SAVEPOINT "+s.sp)
		return err
	}
	return s.tx.Rollback()
}

// viaSQL adapts a test handler to ProcessSQL's: the handler's statements go
// through the *sql.Tx that ProcessSQL hands it, which must be the caller's.
func viaSQL(caller *sql.Tx, h inbox.HandlerFunc) inbox.SQLHandlerFunc {
	return func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if tx != caller {
			return fmt.Errorf("the handler got *sql.Tx %p, not the caller's %p", tx, caller)
		}
		return h(ctx, &sqlTx{tx: tx}, m)
	}
}

// process is ib.Process, or ib.ProcessSQL for the database/sql kind.
func process(ctx context.Context, ib *inbox.Inbox, tx pgx.Tx, m inbox.Message, h inbox.HandlerFunc) (inbox.Result, error) {
	if s, ok := tx.(*sqlTx); ok {
		return ib.ProcessSQL(ctx, s.tx, m, viaSQL(s.tx, h))
	}
	return ib.Process(ctx, tx, m, h)
}

// processBatch is ib.ProcessBatch, or ib.ProcessBatchSQL for the
// database/sql kind.
func processBatch(ctx context.Context, ib *inbox.Inbox, tx pgx.Tx, ms []inbox.Message, h inbox.HandlerFunc) ([]inbox.Result, error) {
	if s, ok := tx.(*sqlTx); ok {
		return ib.ProcessBatchSQL(ctx, s.tx, ms, viaSQL(s.tx, h))
	}
	return ib.ProcessBatch(ctx, tx, ms, h)
}

// pid is the backend pid of tx's connection.
func pid(t *testing.T, tx pgx.Tx) uint32 {
	t.Helper()
	var p uint32
	require.NoError(t, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&p))
	return p
}

// beginFunc is pgx.BeginFunc for a transaction of the bundle's kind.
func (b *testBundle) beginFunc(ctx context.Context, t *testing.T, fn func(tx pgx.Tx) error) error {
	tx, err := b.beginKind(ctx, t)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}
