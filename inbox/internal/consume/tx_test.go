package consume

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// statements records the statements a connection sends on their own
// (Exec, Query), not those of batches.
type statements struct {
	mu  sync.Mutex
	sql []string
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, strings.ToLower(d.SQL))
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statements) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sql...)
}

type lazyTxBundle struct {
	pool  *pgxpool.Pool
	trace *statements
}

func lazyTxSetup(t *testing.T) *lazyTxBundle {
	t.Helper()
	db := testdb.New(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE t (v int NOT NULL)`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	tr := &statements{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &lazyTxBundle{pool: pool, trace: tr}
}

func (b *lazyTxBundle) tx(t *testing.T) *lazyTx {
	t.Helper()
	c, err := b.pool.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(c.Release)
	return &lazyTx{conn: c.Conn()}
}

func (b *lazyTxBundle) values(t *testing.T) []int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT v FROM t ORDER BY v`)
	require.NoError(t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return vs
}

// The first batch begins the transaction: no BEGIN of its own, and the
// batch's statements run inside the transaction (a rollback undoes them).
func TestLazyTxBeginsWithFirstBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := lazyTxSetup(t)
	for _, commit := range []bool{true, false} {
		tx := b.tx(t)
		require.Equal(t, byte('I'), tx.Conn().PgConn().TxStatus())
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO t VALUES (1)`)
		batch.Queue(`SELECT count(*) FROM t`)
		br := tx.SendBatch(ctx, batch)
		tag, err := br.Exec()
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected(), "the caller reads its own first result")
		var n int
		require.NoError(t, br.QueryRow().Scan(&n))
		require.NoError(t, br.Close())
		require.Equal(t, byte('T'), tx.Conn().PgConn().TxStatus(), "in a transaction")
		_, err = tx.Exec(ctx, `INSERT INTO t VALUES (2)`)
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, []int{1, 2}, b.values(t))
		} else {
			require.NoError(t, tx.Rollback(ctx))
			require.Equal(t, []int{1, 2}, b.values(t), "the rollback undid the second round")
		}
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed)
		require.Equal(t, byte('I'), tx.Conn().PgConn().TxStatus())
	}
	for _, sql := range b.trace.list() {
		require.NotEqual(t, "begin", sql, "BEGIN went out on its own")
	}
}

// Any other first call begins the usual way; savepoints and large objects
// are pgx's.
func TestLazyTxOtherFirstCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := lazyTxSetup(t)
	tx := b.tx(t)
	_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	require.Equal(t, byte('T'), tx.Conn().PgConn().TxStatus())
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = sp.Exec(ctx, `INSERT INTO t VALUES (2)`)
	require.NoError(t, err)
	require.NoError(t, sp.Rollback(ctx))
	lo := tx.LargeObjects()
	oid, err := lo.Create(ctx, 0)
	require.NoError(t, err)
	require.NoError(t, lo.Unlink(ctx, oid))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []int{1}, b.values(t))
	require.Contains(t, b.trace.list(), "begin")
}

// A transaction nothing was sent in has nothing to commit or roll back.
func TestLazyTxUnused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := lazyTxSetup(t)
	tx := b.tx(t)
	require.NoError(t, tx.Rollback(ctx))
	require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed)
	_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	br := tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: `SELECT 1`}}})
	_, err = br.Exec()
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.ErrorIs(t, br.Close(), pgx.ErrTxClosed)
	tx = b.tx(t)
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, b.trace.list())
}

// A first batch that fails (a statement of it, or preparing it) leaves the
// connection usable after the rollback.
func TestLazyTxFirstBatchFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := lazyTxSetup(t)
	for _, sql := range []string{`INSERT INTO t VALUES (NULL)`, `INSERT INTO missing VALUES (1)`} {
		tx := b.tx(t)
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO t VALUES (1)`)
		batch.Queue(sql)
		br := tx.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			_, err = br.Exec()
		}
		require.Error(t, err, sql)
		_ = br.Close()
		_ = tx.Rollback(ctx)
		require.Equal(t, byte('I'), tx.Conn().PgConn().TxStatus(), sql)
		require.Empty(t, b.values(t), sql)
	}
}
