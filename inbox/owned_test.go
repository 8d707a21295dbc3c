package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/owntx"
)

// The path of a caller that owns its transaction (the consumer adapter):
// Process and ProcessBatch open no savepoint, and the caller rolls the whole
// transaction back on any error. The guarantees are the same: a duplicate
// never reaches the handler, and a failure leaves no trace once rolled back.

// ownedTx runs fn in a transaction marked as owned, the adapter's way: commit
// on nil, roll back on any error, and run fn again in a new transaction
// after an owntx.Conflict (a batch's plain insert met a key seen before).
func (b *testBundle) ownedTx(t *testing.T, fn func(ctx context.Context, tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	for {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		err = fn(owntx.With(ctx, tx), tx)
		if err == nil {
			require.NoError(t, tx.Commit(ctx))
			return nil
		}
		require.NoError(t, tx.Rollback(ctx))
		if !owntx.IsConflict(err) {
			return err
		}
		b.conflicts++
	}
}

// noSavepoint fails the test if the inbox's savepoint is open in tx. It
// tries to release it inside a savepoint of its own, whose rollback undoes
// the failure that the savepoint's absence causes.
func noSavepoint(t *testing.T, tx pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = sp.Exec(ctx, `RELEASE SAVEPOINT pgbox_inbox`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "3B001", pgErr.Code, "savepoint does not exist")
	require.NoError(t, sp.Rollback(ctx))
}

func TestOwnedProcess(t *testing.T) {
	t.Parallel()
	for _, dedup := range []inbox.Dedup{inbox.DedupKeys, inbox.DedupWatermark} {
		t.Run(dedup.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ib := newInbox(t, inbox.Config{Dedup: dedup})
			m := msg("orders", 1, 7, "v")
			boom := errors.New("boom")

			// A handler error: the caller rolls back, nothing remains.
			err := b.ownedTx(t, func(ctx context.Context, tx pgx.Tx) error {
				_, err := ib.Process(ctx, tx, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
					require.NoError(t, pay(ctx, tx, m))
					return boom
				})
				return err
			})
			require.ErrorIs(t, err, boom)
			require.Zero(t, b.payments(t))

			// The redelivery is processed, without a savepoint.
			for range 2 {
				err = b.ownedTx(t, func(ctx context.Context, tx pgx.Tx) error {
					_, err := ib.Process(ctx, tx, m, pay)
					noSavepoint(t, tx)
					return err
				})
				require.NoError(t, err)
			}
			require.Equal(t, 1, b.payments(t), "the second delivery was a duplicate")
			require.Equal(t, inbox.Stats{Processed: 1, Duplicates: 1, HandlerErrors: 1}, ib.Stats())
		})
	}
}

func TestOwnedProcessFingerprintMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := newInbox(t, inbox.Config{Key: inbox.ByFunc(func(inbox.Message) (string, error) { return "same", nil })})
	require.NoError(t, b.ownedTx(t, func(ctx context.Context, tx pgx.Tx) error {
		_, err := ib.Process(ctx, tx, msg("orders", 0, 1, "a"), pay)
		return err
	}))
	err := b.ownedTx(t, func(ctx context.Context, tx pgx.Tx) error {
		_, err := ib.Process(ctx, tx, msg("orders", 0, 2, "b"), pay)
		return err
	})
	require.ErrorIs(t, err, inbox.ErrFingerprintMismatch)
	require.Equal(t, 1, b.payments(t))
}

func TestOwnedProcessBatch(t *testing.T) {
	t.Parallel()
	for _, dedup := range []inbox.Dedup{inbox.DedupKeys, inbox.DedupWatermark} {
		t.Run(dedup.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ib := newInbox(t, inbox.Config{Dedup: dedup})
			batch := []inbox.Message{msg("orders", 0, 1, "a"), msg("orders", 0, 2, "b"), msg("orders", 0, 3, "c")}
			boom := errors.New("boom")

			err := b.ownedTx(t, func(ctx context.Context, tx pgx.Tx) error {
				_, err := ib.ProcessBatch(ctx, tx, batch, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
					require.NoError(t, pay(ctx, tx, m))
					if m.Offset == 3 {
						return boom
					}
					return nil
				})
				return err
			})
			require.ErrorIs(t, err, boom)
			require.Zero(t, b.payments(t))

			for range 2 {
				err = b.ownedTx(t, func(ctx context.Context, tx pgx.Tx) error {
					_, err := ib.ProcessBatch(ctx, tx, batch, pay)
					if err == nil {
						noSavepoint(t, tx)
					}
					return err
				})
				require.NoError(t, err)
			}
			require.Equal(t, 3, b.payments(t), "the second delivery was all duplicates")
			if dedup == inbox.DedupKeys {
				// The redelivery's plain insert failed once; its run again
				// took ON CONFLICT.
				require.Equal(t, 1, b.conflicts)
			}
		})
	}
}

// A handler that calls Process in turn, with the context it received, gets
// the savepoint: it may carry on after the inner call failed, and then the
// inner message leaves no trace.
func TestOwnedNestedProcessKeepsSavepoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outer := newInbox(t, inbox.Config{Consumer: "outer"})
	inner := newInbox(t, inbox.Config{Consumer: "inner"})
	m := msg("orders", 0, 1, "a")
	require.NoError(t, b.ownedTx(t, func(ctx context.Context, tx pgx.Tx) error {
		_, err := outer.Process(ctx, tx, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			_, err := inner.Process(ctx, tx, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				require.NoError(t, pay(ctx, tx, m))
				return errors.New("inner fails")
			})
			require.Error(t, err)
			return pay(ctx, tx, m) // the outer handler carries on
		})
		return err
	}))
	require.Equal(t, 1, b.payments(t), "the inner handler's write was rolled back")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM pgbox_inbox WHERE consumer = 'inner'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pgbox_inbox WHERE consumer = 'outer'`))
}

// An owned batch meeting a key that another transaction holds uncommitted
// waits for it (ON CONFLICT at once: there is no savepoint for the probe's
// fallback), then reports it a duplicate (the other committed) or processes
// it (the other rolled back). The handler never runs twice for one key.
func TestOwnedProcessBatchInFlightKey(t *testing.T) {
	t.Parallel()
	inFlightKeyRace(t, owntx.With)
}
