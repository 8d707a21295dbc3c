package relay_test

// Review of 7d91c40 (the finish matches rows by id and event id), end to
// end; the statement-level attacks are in attackfinish_internal_test.go.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// (4) The failure half of the finish after a sequence reset. A batch of ten
// rows for a topic that does not exist (MaxAttempts 1, no unknown-topic
// window: the first failure parks) is held in the hook while an operator
// empties the outbox and restarts its sequence; ten new rows of the same
// key on an existing topic take the ids 1..10 again. The batch then fails: its finish must
// count no attempt on, and park none of, the new rows (matched by id alone
// they were parked, and never published); every new row is published.
func TestAttackFinishFailedBatchAfterResetParksNoNewRow(t *testing.T) {
	t.Parallel()
	for _, reset := range sequenceResets {
		t.Run(reset[:8], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := b.config("a")
			cfg.MaxAttempts = 1
			cfg.UnknownTopicWindow = relay.NoUnknownTopicWindow
			var old []outbox.Message
			for i := range 10 {
				old = append(old, msg("no-such-topic", "old", strconv.Itoa(i)))
			}
			hook := holdThenReset(t, b, cfg, reset, func() { b.write(t, old...) })
			for i := range 10 {
				// The old rows' key: the same slot, so the same lane and
				// epoch as the failed batch (another lane's epoch would
				// fence the failure update off the new rows by chance).
				b.write(t, msg(b.topic, "old", "new-"+strconv.Itoa(i)))
			}
			require.Equal(t, 1, b.outboxCount(t, "id = 1"), "a new row took id 1 again")
			close(hook.release)
			got := valuesArrived(t, b, 10, 30*time.Second, func(m *sarama.ConsumerMessage) bool { return strings.HasPrefix(string(m.Value), "new-") })
			require.Len(t, got, 10, "every new row published (parked: %d, with attempts: %d)",
				b.outboxCount(t, "parked_at IS NOT NULL"), b.outboxCount(t, "attempts > 0"))
			require.Zero(t, b.outboxCount(t, "parked_at IS NOT NULL OR attempts > 0"), "no failure recorded on a row that was never sent")
		})
	}
}

// (5) A relay process SIGKILLed again and again while writers write (so,
// now and then, between a batch's send and its finish's commit, or within
// the finish), each time replaced by a new process: nothing is lost, each
// key in order, duplicates bounded by the killed processes' in-flight
// batches, and the outbox empties (no published row stays behind to be
// sent again and again).
func TestAttackFinishKilledRepeatedlyLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const keys, childBatch, kills = 10, 16, 4
	createCounters(t, b, keys)
	stop, written, wg := startWriters(ctx, t, b, keys, 11)
	for i := range kills {
		child, exited := startChild(t, b, childBatch)
		waitFor(t, "child holds lanes", func() bool { return lanesOwnedBy(t, b, "child") == 8 })
		at := written.Load()
		waitFor(t, "traffic", func() bool { return written.Load() > at+100 })
		time.Sleep(time.Duration(i*7) * time.Millisecond)
		require.NoError(t, child.Process.Kill()) // SIGKILL
		<-exited
		waitFor(t, "the killed child's leases expire", func() bool { return lanesOwnedBy(t, b, "child") == 0 })
	}
	stop.Store(true)
	wg.Wait()
	start(t, b.config("last"))
	checkAllArrived(t, b, int(written.Load()), kills*2*childBatch, "killed")
}
