package inbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/owntx"
)

// A batch meeting a key that another transaction inserted and has not
// committed waits for it, then reports the key a duplicate (the other
// committed) or processes it (the other rolled back), and processes the rest
// of the batch either way. (ProcessBatch's first insert has no ON CONFLICT:
// this is its fallback at work.)
func TestProcessBatchWaitsForInFlightKey(t *testing.T) {
	t.Parallel()
	inFlightKeyRace(t, func(ctx context.Context, _ pgx.Tx) context.Context { return ctx })
}

// inFlightKeyRace runs the race of TestProcessBatchWaitsForInFlightKey with
// each transaction's context made by wrap (owntx.With for the owned path).
func inFlightKeyRace(t *testing.T, wrap func(context.Context, pgx.Tx) context.Context) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("first_commits=%v", commit), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			ib := newInbox(t, inbox.Config{})
			m := func(off int64) inbox.Message { return msg("orders", 0, off, "v") }

			tx1 := b.begin(t)
			_, err := ib.ProcessBatch(wrap(ctx, tx1), tx1, []inbox.Message{m(1), m(2)}, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				require.NoError(t, inbox.SetResult(ctx, []byte("from-1")))
				return pay(ctx, tx, m)
			})
			require.NoError(t, err)

			tx2 := b.begin(t)
			type outcome struct {
				res []inbox.Result
				err error
			}
			done := make(chan outcome, 1)
			pid := tx2.Conn().PgConn().PID()
			go func() {
				res, err := ib.ProcessBatch(wrap(ctx, tx2), tx2, []inbox.Message{m(2), m(3)}, pay)
				if owntx.IsConflict(err) {
					// The owned path's plain insert met the key once it
					// committed: its owner runs the batch again in a new
					// transaction (as the consumer loop does).
					if err = tx2.Rollback(ctx); err == nil {
						if tx2, err = b.pool.Begin(ctx); err == nil {
							res, err = ib.ProcessBatch(wrap(ctx, tx2), tx2, []inbox.Message{m(2), m(3)}, pay)
						}
					}
				}
				if err == nil {
					err = tx2.Commit(ctx)
				}
				done <- outcome{res, err}
			}()
			b.waitBlocked(t, pid)
			if commit {
				require.NoError(t, tx1.Commit(ctx))
			} else {
				require.NoError(t, tx1.Rollback(ctx))
			}
			o := <-done
			require.NoError(t, o.err)
			require.Equal(t, commit, o.res[0].Duplicate, "offset 2")
			require.False(t, o.res[1].Duplicate, "offset 3")
			if commit {
				require.Equal(t, []byte("from-1"), o.res[0].Stored)
				require.Equal(t, 3, b.payments(t))
				require.Equal(t, 3, b.inboxRows(t))
			} else {
				require.Equal(t, 2, b.payments(t))
				require.Equal(t, 2, b.inboxRows(t))
			}
		})
	}
}
