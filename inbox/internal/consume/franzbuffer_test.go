package consume_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testutil"
)

// Review 34 (9a721a5 gives each franz partition's record channel a buffer of
// 256): a member whose channels are full (a slow handler, a long backlog)
// loses partitions to a second member, then stops. The records buffered in
// the revoked channels must not be processed nor marked by the old member:
// no committed offset ever runs ahead of the effects committed in
// PostgreSQL, every event takes effect once, and within each partition the
// effects were written in offset order (one writer at a time, in order).
// Cooperative and eager.
func TestFranzBufferedRecordsAtRevoke(t *testing.T) {
	t.Parallel()
	for name, bal := range map[string]kgo.GroupBalancer{"cooperative": kgo.CooperativeStickyBalancer(), "eager": kgo.RangeBalancer()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 4)
			const n = 2400
			b.ProduceEvents(t, events("e", n)...)
			slow := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				if err := effect(ctx, tx, m); err != nil {
					return err
				}
				select {
				case <-time.After(time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
				return nil
			}
			s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), slow)
			s.batch, s.batchWait, s.drainTimeout = 20, 5*time.Millisecond, 200*time.Millisecond
			watched := watchCommitted(t, b, 4)
			start := startFranz(bal)
			m1 := start(t, b, s)
			testutil.Eventually(t, 30*time.Second, "the first member under way (its channels full)", func() bool { _, d := b.Effects(t); return d >= 200 })
			m2 := start(t, b, s)
			testutil.Eventually(t, 60*time.Second, "a third done", func() bool { _, d := b.Effects(t); return d >= n/3 })
			m1.stop()
			testutil.Eventually(t, 120*time.Second, "all effects", func() bool { _, d := b.Effects(t); return d >= n })
			m2.stop()
			requireExactlyOnce(t, b, n, 4)
			require.Empty(t, watched(), "a committed offset ran ahead of the effects committed in PostgreSQL")
			for p := range int32(4) {
				out := b.Count(t, `SELECT count(*) FROM (SELECT "offset" < lag("offset") OVER (ORDER BY id) AS back FROM effects WHERE partition = $1) x WHERE back`, p)
				require.Zero(t, out, fmt.Sprintf("partition %d: effects written out of offset order", p))
			}
			require.Zero(t, m1.stats().DeadLettered+m2.stats().DeadLettered)
		})
	}
}
