package consume_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testutil"
)

// A graceful stop whose last transaction is still committing when the drain
// timeout runs out (issue 34: a sarama consumer with a batch handler stopped
// under load with every effect committed and the group's offsets short of
// the partition ends, and logged nothing). Once COMMIT is sent its outcome
// is the server's: the drain timeout must not cut the client off it, or a
// transaction that committed is never marked and its offsets never reach
// Kafka. Here the COMMIT of the last batch takes 1.5 s that a cancel
// request cannot cut short (a deferred constraint trigger sleeps through
// it, as a WAL flush under load would), the drain timeout is 200 ms, and the member is
// stopped while that COMMIT runs: the stop waits for it, marks it, and the
// group's committed offset is the partition's end. Both clients, the
// per-message handler and the batch handler.
func TestSuiteGracefulStopCommitsLastOffsets(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, batchHandler := range []bool{false, true} {
			const n = 30
			b := setup(t, 1)
			ctx := context.Background()
			_, err := b.DB.Pool.Exec(ctx, `
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	-- Like a WAL flush under load, which a cancel request cannot stop:
	-- the COMMIT completes whatever the client does meanwhile.
	BEGIN PERFORM pg_sleep(1.5); EXCEPTION WHEN query_canceled THEN NULL; END;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON effects DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.event = 'e-00029') EXECUTE FUNCTION slow_commit()`)
			require.NoError(t, err)
			b.ProduceEvents(t, events("e", n)...)

			last := make(chan struct{})
			var once sync.Once
			seen := func(ms []inbox.Message) {
				for _, m := range ms {
					if ev, _ := m.Header(eventHeader); string(ev) == "e-00029" {
						once.Do(func() { close(last) })
					}
				}
			}
			s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				seen([]inbox.Message{m})
				return effect(ctx, tx, m)
			})
			if batchHandler {
				s = batchSettings(b, s.ib, func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
					seen(ms)
					return batchEffect(ctx, tx, ms)
				}, 10)
			} else {
				s.batch = 10
			}
			s.drainTimeout = 200 * time.Millisecond
			m := a.start(t, b, s)
			select {
			case <-last:
			case <-time.After(30 * time.Second):
				t.Fatal("the last event was never handled")
			}
			time.Sleep(50 * time.Millisecond) // the handler returned; COMMIT is in flight
			t0 := time.Now()
			m.stop()
			stopped := time.Since(t0)

			// (Without the fix the server finishes the COMMIT the client
			// gave up on a moment later: every effect commits, the offsets
			// stay short. Hence Eventually.)
			testutil.Eventually(t, 5*time.Second, "every effect committed", func() bool { _, d := b.Effects(t); return d == n })
			rows, _ := b.Effects(t)
			require.Equal(t, n, rows, "no effect twice")
			// The stop returned: what it committed to Kafka is there now.
			testutil.Eventually(t, 5*time.Second, "offsets at the partition end", func() bool { return b.Committed(t, "svc", 0) == n })
			require.GreaterOrEqual(t, stopped, time.Second, "the stop waited for the COMMIT in flight (batch handler %v)", batchHandler)
		}
	})
}
