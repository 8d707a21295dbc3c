package inbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// uniqueViolations counts the statements PostgreSQL failed with a unique
// violation on a pool (sent alone or in a pipeline).
type uniqueViolations struct{ n atomic.Int64 }

func (u *uniqueViolations) count(err error) {
	if pe, ok := err.(*pgconn.PgError); ok && pe.Code == "23505" {
		u.n.Add(1)
	}
}
func (u *uniqueViolations) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (u *uniqueViolations) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	u.count(d.Err)
}
func (u *uniqueViolations) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (u *uniqueViolations) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	u.count(d.Err)
}
func (u *uniqueViolations) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// ProcessBatch inserts a batch's keys without first probing for known ones;
// a batch holding a key seen before fails that insert, falls back to ON
// CONFLICT within the same call (every result right, the transaction
// usable), and the batches after it probe first, so a run of redelivered
// batches costs one failed insert, not one per batch. Once the window has
// passed, the plain insert is back.
func TestProcessBatchRedeliveryRunFailsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	uv := &uniqueViolations{}
	cfg := b.pool.Config()
	cfg.ConnConfig.Tracer = uv
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	const window = 2 * time.Second
	inbox.SetProbeWindow(ib, window)

	batchOf := func(from, n int) []inbox.Message {
		ms := make([]inbox.Message, n)
		for i := range ms {
			id := fmt.Sprintf("ev-%04d", from+i)
			ms[i] = msg("orders", 0, int64(from+i), id, outbox.Header{Key: "event-id", Value: []byte(id)})
		}
		return ms
	}
	// run processes ms in one transaction, with a business row per new
	// key, and returns how many were duplicates.
	run := func(ms []inbox.Message) (dups int) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		res, err := ib.ProcessBatch(ctx, tx, ms, pay)
		require.NoError(t, err)
		// The transaction is usable after the fallback.
		_, err = tx.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		for _, r := range res {
			if r.Duplicate {
				dups++
			}
		}
		return dups
	}

	for i := range 5 {
		require.Zero(t, run(batchOf(i*10, 10)))
	}
	require.Zero(t, uv.n.Load(), "new keys go in without a unique violation")
	require.Equal(t, 50, b.payments(t))

	// The same five batches redelivered, then one with old and new keys.
	for i := range 5 {
		require.Equal(t, 10, run(batchOf(i*10, 10)), "batch %d is all duplicates", i)
	}
	require.Equal(t, 5, run(batchOf(45, 10)), "5 old keys, 5 new")
	require.EqualValues(t, 1, uv.n.Load(), "only the first redelivered batch fails its insert; the next ones probe")
	require.Equal(t, 55, b.payments(t))
	require.Equal(t, 55, b.inboxRows(t))

	// Once the window has passed, the next redelivery fails its insert
	// once again (and is still right).
	time.Sleep(2 * window)
	for i := range 20 {
		require.Zero(t, run(batchOf(1000+i*10, 10)))
	}
	require.EqualValues(t, 1, uv.n.Load())
	require.Equal(t, 10, run(batchOf(0, 10)))
	require.EqualValues(t, 2, uv.n.Load())
	require.Equal(t, 255, b.payments(t), "each key's effect once")
	require.Equal(t, inbox.Stats{Processed: 255, Duplicates: 65}, ib.Stats())
}
