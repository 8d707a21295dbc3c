package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
)

// A delete slowed past the lease (a checkpoint, an I/O stall: here row
// locks held by another session for three lease periods) is not cancelled
// at the lease's end, so its rows are not published again: one stall makes
// no duplicates while the instance keeps its lanes. (It used to be
// cancelled after LeaseTTL: the whole batch went out again, and again after
// every cancelled retry.)
func TestSlowDeleteIsNotABatchOfDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const n = 500
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = msg(b.topic, keyed(i%50), fmt.Sprint(i))
	}
	b.write(t, msgs...)

	// Lock every row: the relay can read them (a claim takes no lock), send
	// them, and then its delete waits.
	stall, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = stall.Rollback(ctx) }()
	_, err = stall.Exec(ctx, `SELECT 1 FROM pgbox_outbox FOR UPDATE`)
	require.NoError(t, err)

	cfg := b.config("stalled")
	cfg.BatchSize = n
	start(t, cfg)
	got := readEvents(t, b, n)
	require.Equal(t, n, len(got), "everything sent once")
	time.Sleep(3 * cfg.LeaseTTL) // the delete waits for the locks meanwhile
	require.Equal(t, n, b.outboxCount(t, "true"), "the delete is still waiting")
	require.NoError(t, stall.Rollback(ctx))
	waitFor(t, "the delete", func() bool { return b.outboxCount(t, "true") == 0 })
	require.Equal(t, n, len(readTopic(t, b, b.topic, n)), "no record sent twice")
}

// Every slot with rows is probed within PollInterval, however busy other
// slots keep the relay: a writer keeps a few keys' slots non-empty, so
// every pass finds rows (never a full batch), and a row of another key
// written once, with no notification, is still published promptly. (Passes
// used to re-probe only the slots of their last batch while rows kept
// coming: such a row waited until the busy slots ran dry.)
func TestIdleSlotIsProbedWhileOthersAreBusy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := setup(t)
	cfg := b.config("fair")
	cfg.BatchSize = 5000 // batches are never full: passes re-probe what they found
	cfg.NoListen = true  // no notifications: only probing finds the row
	start(t, cfg)

	hot := []string{"hot-a", "hot-b", "hot-c", "hot-d"}
	var writers sync.WaitGroup
	for range 4 {
		writers.Go(func() {
			for ctx.Err() == nil {
				_ = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					var ms []outbox.Message
					for i := range 100 {
						ms = append(ms, msg(b.topic, hot[i%len(hot)], "x"))
					}
					return outbox.Write(ctx, tx, ms...)
				})
			}
		})
	}
	defer func() { cancel(); writers.Wait() }()
	time.Sleep(time.Second) // the relay is busy with the hot slots

	idle := "idle-key"
	for _, k := range hot {
		require.NotEqual(t, slot.Of([]byte(k), [16]byte{}), slot.Of([]byte(idle), [16]byte{}))
	}
	b.write(t, msg(b.topic, idle, "once"))
	// The bound is 20 poll intervals (4 s), far above the promise, far
	// below "until the writer stops" (never, here).
	deadline := time.Now().Add(20 * cfg.PollInterval)
	for b.outboxCount(t, "key = 'idle-key'") > 0 {
		require.True(t, time.Now().Before(deadline), "the idle slot's row waited more than 20 poll intervals")
		time.Sleep(10 * time.Millisecond)
	}
}
