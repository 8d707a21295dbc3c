package inboxsarama_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/testutil"
)

// The adapter runs Process and ProcessBatch without their savepoint (it owns
// the transaction, and BEGIN goes out with the dedup step): a handler that
// wrote and then failed must still leave nothing behind, and no message's
// effect may commit twice. Every third message's handler writes its effect,
// then fails once; a savepoint the handler opens itself still works.
func TestConsumerHandlerErrorRollsBackWholeTx(t *testing.T) {
	t.Parallel()
	for _, mode := range []inbox.Dedup{inbox.DedupKeys, inbox.DedupWatermark} {
		for _, batch := range []int{1, 10} {
			t.Run(fmt.Sprintf("%v/batch%d", mode, batch), func(t *testing.T) {
				t.Parallel()
				b := cgSetup(t, 2)
				evs := events("e", 60)
				b.ProduceEvents(t, evs...)
				var mu sync.Mutex
				failed := map[string]bool{}
				fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
					// A savepoint of the handler's own, rolled back: its write goes.
					sp, err := tx.Begin(ctx)
					if err != nil {
						return err
					}
					if err := effect(ctx, sp, m); err != nil {
						return err
					}
					if err := sp.Rollback(ctx); err != nil {
						return err
					}
					if err := effect(ctx, tx, m); err != nil {
						return err
					}
					ev, _ := m.Header(eventHeader)
					mu.Lock()
					defer mu.Unlock()
					if m.Offset%3 == 0 && !failed[string(ev)] {
						failed[string(ev)] = true
						return fmt.Errorf("transient failure of %s", ev)
					}
					return nil
				}
				cfg := inbox.Config{Consumer: "svc", Dedup: mode}
				ib, err := inbox.New(cfg)
				require.NoError(t, err)
				h := mustHandler(t, b.DB.Pool, ib, fn, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch, RetryBackoff: 10 * time.Millisecond}})
				m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
				testutil.Eventually(t, 60*time.Second, "every message processed", func() bool {
					_, distinct := b.Effects(t)
					return distinct == len(evs)
				})
				m.stop()
				rows, distinct := b.Effects(t)
				require.Equal(t, len(evs), distinct)
				require.Equal(t, len(evs), rows, "each effect committed once: the failed attempts left nothing")
				require.NotZero(t, h.Stats().Failures)
				require.EqualValues(t, len(evs), h.Stats().Processed)
			})
		}
	}
}
