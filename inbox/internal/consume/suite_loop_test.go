package consume_test

// The loop's behaviour, shown for every adapter: what was once inboxsarama's
// own tests (attempts in a batch, unkeyable messages, missing tables, the
// drain of a transaction in flight) runs here against each client.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// firstError waits for the first error m's Consume (Run) returned.
func firstError(t *testing.T, m *member) error {
	t.Helper()
	select {
	case err := <-m.errs:
		return err
	case <-time.After(2 * time.Minute): // liveness only
		t.Fatal("the adapter reported no error")
		return nil
	}
}

// requireOperatorError checks what the service sees: the sentinel, the
// server's error for errors.As, and a message naming the fix.
func requireOperatorError(t *testing.T, err error, code, fix string) {
	t.Helper()
	require.ErrorIs(t, err, inbox.ErrNeedsOperator)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, code, pgErr.Code)
	require.ErrorContains(t, err, fix)
}

// MaxAttempts counts every run of the handler, the one inside a batch too:
// a batch with a failing message falls back to one by one, and the failing
// message's handler runs exactly MaxAttempts times in all.
func TestSuiteMaxAttemptsInBatch(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		evs := events("e", 20)
		poison := evs[6]
		b.ProduceEvents(t, evs...)
		var calls atomic.Int64
		fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if ev, _ := m.Header(eventHeader); string(ev) == poison {
				calls.Add(1)
				return errors.New("account closed")
			}
			return effect(ctx, tx, m)
		}
		s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), fn)
		s.batch, s.batchWait, s.maxAttempts, s.deadLetterTopic = 10, 200*time.Millisecond, 3, "svc.dead"
		m := a.start(t, b, s)
		testutil.Eventually(t, 60*time.Second, "past the poison message", func() bool { return b.Committed(t, "svc", 0) == 20 })
		m.stop()
		require.EqualValues(t, 3, calls.Load(), "the handler ran MaxAttempts times, the batch run included")
		rows, distinct := b.Effects(t)
		require.Equal(t, 19, rows)
		require.Equal(t, 19, distinct)
		st := m.stats()
		require.EqualValues(t, 1, st.DeadLettered)
		require.EqualValues(t, 3, st.Failures)
		require.Positive(t, st.BatchFallbacks)
		dl := b.OutboxDLQ(t, "svc.dead")
		require.Len(t, dl, 1)
		require.Equal(t, "3", dl[0].Headers[inbox.HeaderDLQAttempts])
	})
}

// A message the inbox cannot key (ByHeader, header missing) can never
// succeed: it is dead-lettered at once, without an inbox key, and the
// messages around it are processed.
func TestSuiteInvalidMessageDeadLettered(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		b.ProduceEvents(t, "a")
		bad := consumetest.Record(b.Topic, "no-header")
		bad.Headers = nil
		b.Produce(t, bad)
		b.ProduceEvents(t, "b")
		m := a.start(t, b, settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), effect))
		testutil.Eventually(t, 60*time.Second, "past the invalid message", func() bool { return b.Committed(t, "svc", 0) == 3 })
		m.stop()
		requireEffects(t, b, 2)
		st := m.stats()
		require.EqualValues(t, 1, st.DeadLettered)
		require.EqualValues(t, 1, st.Failures, "dead-lettered after its first run, not retried")
		var key *string
		var errText string
		require.NoError(t, b.DB.Pool.QueryRow(context.Background(),
			`SELECT key, error FROM pgbox_consumer_dead WHERE "offset" = 1`).Scan(&key, &errText))
		require.Nil(t, key)
		require.Contains(t, errText, "invalid message")
		require.Contains(t, errText, eventHeader)
		require.Len(t, b.OutboxDLQ(t, "events.dlq"), 1)
	})
}

func requireEffects(t *testing.T, b *bundle, n int) {
	t.Helper()
	rows, distinct := b.Effects(t)
	require.Equal(t, n, distinct, "every event's effect")
	require.Equal(t, n, rows, "no event applied twice")
}

// Started against a schema where pgbox's migrations were not run, the
// adapter ends Consume (Run) with an error that names the fix, logged at
// ERROR; nothing is processed or counted as an attempt.
func TestSuiteMigrationsNotRun(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		db := testdb.Empty(t)
		consumetest.CreateEffects(t, db)
		c := kafkatest.New(t, kfake.SeedTopics(1, "events"), kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
		b := &bundle{DB: db, Kafka: c, Addrs: c.ListenAddrs(), Topic: "events"}
		b.ProduceEvents(t, events("e", 5)...)
		var logs testutil.SyncBuffer
		s := settingsOf(b, newInbox(t, inbox.ByOffset()), effect)
		s.logger = slog.New(slog.NewTextHandler(&logs, nil))
		m := a.start(t, b, s)
		err := firstError(t, m)
		m.stop()
		requireOperatorError(t, err, "42P01", "relay migrate up")
		require.Contains(t, logs.String(), "level=ERROR")
		require.Contains(t, logs.String(), "relay migrate up")
		require.Zero(t, b.Count(t, `SELECT count(*) FROM effects`))
		require.Positive(t, m.stats().OperatorErrors)
		require.Zero(t, m.stats().Failures)
	})
}

// A deploy whose migration did not run: the handler's business table is
// missing. Every message fails the same way, through no fault of its own:
// the claim ends with the error, nothing is dead-lettered or counted; once
// the table is back, every message is processed exactly once. One by one
// and in batches.
func TestSuiteBusinessTableMissing(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, batch := range []int{1, 20} {
			b := setup(t, 1)
			ctx := context.Background()
			_, err := b.DB.Pool.Exec(ctx, `ALTER TABLE effects RENAME TO effects_elsewhere`)
			require.NoError(t, err)
			b.ProduceEvents(t, events("e", 40)...)
			var logs testutil.SyncBuffer
			s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), effect)
			s.batch, s.maxAttempts, s.logger = batch, 1, slog.New(slog.NewTextHandler(&logs, nil))
			m := a.start(t, b, s)
			err = firstError(t, m)
			requireOperatorError(t, err, "42P01", "apply the service's migrations")
			require.Contains(t, logs.String(), "level=ERROR")
			require.NotContains(t, logs.String(), "dead-lettered")
			st := m.stats()
			require.Zero(t, st.DeadLettered, "batch %d", batch)
			require.Zero(t, st.Failures, "batch %d", batch)
			require.Positive(t, st.OperatorErrors)
			require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
			require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_outbox`))

			_, err = b.DB.Pool.Exec(ctx, `ALTER TABLE effects_elsewhere RENAME TO effects`)
			require.NoError(t, err)
			testutil.Eventually(t, 60*time.Second, "every event once the table is back", func() bool { _, d := b.Effects(t); return d == 40 })
			m.stop()
			requireExactlyOnce(t, b, 40, 1)
			require.Zero(t, m.stats().DeadLettered)
		}
	})
}

// A transaction in flight when the member stops (sarama's session ends,
// franz-go's Run returns) finishes within DrainTimeout: it commits, its
// offset is committed as the member leaves, and nothing starts after it, so
// the next member sees no redelivery.
func TestSuiteStopFinishesInFlight(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		b.ProduceEvents(t, events("e", 5)...)
		started, release := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if m.Offset == 2 && once.CompareAndSwap(false, true) {
				close(started)
				<-release
			}
			return effect(ctx, tx, m)
		}
		ib := newInbox(t, inbox.ByOffset())
		s := settingsOf(b, ib, fn)
		s.drainTimeout = 5 * time.Minute
		m := a.start(t, b, s)
		<-started
		m.cancel() // the member stops while offset 2's transaction is open
		time.Sleep(100 * time.Millisecond)
		close(release)
		<-m.done
		require.Equal(t, 3, b.Count(t, `SELECT count(*) FROM effects`), "offsets 0-2 committed, nothing started after")
		require.EqualValues(t, 3, b.Committed(t, "svc", 0), "offset 2 committed after its transaction")

		m2 := a.start(t, b, settingsOf(b, ib, effect))
		testutil.Eventually(t, 60*time.Second, "the rest", func() bool { n, _ := b.Effects(t); return n == 5 })
		m2.stop()
		require.Zero(t, m2.stats().Duplicates, "nothing redelivered")
	})
}

// Past DrainTimeout the transaction in flight is rolled back and its offset
// is not committed: the next member processes the message, once. Shown for
// both ways a partition is taken away: the member stopping, and a rebalance
// revoking it while the member runs on (franz-go's own
// OnPartitionsRevoked path; eager and cooperative). A cancelled attempt is
// not a failure.
func TestSuiteDrainTimeoutRollsBack(t *testing.T) {
	t.Parallel()
	forEach(t, true, func(t *testing.T, a adapter) {
		t.Run("stop", func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			b.ProduceEvents(t, events("e", 5)...)
			started := make(chan struct{})
			var once atomic.Bool
			fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				if err := effect(ctx, tx, m); err != nil {
					return err
				}
				if m.Offset == 2 && once.CompareAndSwap(false, true) {
					close(started)
					<-ctx.Done() // stuck until the drain timeout cancels it
					return ctx.Err()
				}
				return nil
			}
			ib := newInbox(t, inbox.ByOffset())
			s := settingsOf(b, ib, fn)
			s.drainTimeout = 100 * time.Millisecond
			m := a.start(t, b, s)
			<-started
			m.stop()
			require.Equal(t, 2, b.Count(t, `SELECT count(*) FROM effects`), "offset 2's effect rolled back")
			require.EqualValues(t, 2, b.Committed(t, "svc", 0), "offset 2 not committed")
			require.Zero(t, m.stats().Failures, "a cancelled attempt is not a failure")

			m2 := a.start(t, b, settingsOf(b, ib, effect))
			testutil.Eventually(t, 60*time.Second, "the rest", func() bool { n, _ := b.Effects(t); return n == 5 })
			m2.stop()
			requireExactlyOnce(t, b, 5, 1)
		})
		t.Run("revoked", func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			b.ProduceEvents(t, events("e", 40)...)
			var stuck [2]atomic.Bool   // per partition: its first record got stuck once
			var cancelled atomic.Int32 // stuck transactions the drain timeout cancelled
			var stopping atomic.Bool   // set before the first member is stopped
			var whileRunning atomic.Int32
			fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				if err := effect(ctx, tx, m); err != nil {
					return err
				}
				if stuck[m.Partition].CompareAndSwap(false, true) {
					<-ctx.Done() // stuck until the drain timeout cancels it
					cancelled.Add(1)
					if !stopping.Load() {
						whileRunning.Add(1)
					}
					return ctx.Err()
				}
				return nil
			}
			s := settingsOf(b, newInbox(t, inbox.ByHeader(eventHeader)), fn)
			s.drainTimeout = 100 * time.Millisecond
			m1 := a.start(t, b, s)
			testutil.Eventually(t, 60*time.Second, "both partitions stuck", func() bool { return stuck[0].Load() && stuck[1].Load() })
			m2 := a.start(t, b, s) // the rebalance takes at least one partition from m1
			testutil.Eventually(t, 60*time.Second, "a revoked transaction rolled back", func() bool { return whileRunning.Load() >= 1 })
			stopping.Store(true)
			m1.stop()
			testutil.Eventually(t, 60*time.Second, "every event", func() bool { _, d := b.Effects(t); return d == 40 })
			m2.stop()
			requireExactlyOnce(t, b, 40, 2)
			require.Zero(t, m1.stats().Failures+m2.stats().Failures, "a cancelled attempt is not a failure")
			require.Zero(t, m1.stats().DeadLettered+m2.stats().DeadLettered)
		})
	})
}

// The members' database connections are killed (pg_terminate_backend) over
// and over while they work, at any point of their transactions, commits
// included: every event still gets exactly one business row, and a killed
// connection is never counted against a message. One member one by one, one
// in batches.
func TestSuiteDatabaseConnectionsKilled(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		ctx := context.Background()
		b := setup(t, 3)
		const n = 1500
		b.ProduceEvents(t, events("e", n)...)
		app := "pgbox-kill-" + b.DB.Schema
		s := settingsOf(b, newInbox(t, inbox.ByOffset()), effect)
		s.pool = consumetest.PoolWithAppName(t, b.DB, app, 8)
		s.retryBackoff = 5 * time.Millisecond
		m1 := a.start(t, b, s)
		s.batch = 25
		m2 := a.start(t, b, s)
		killed := 0
		// Kill every 20-60 ms; while a kill finds the members without
		// progress since the previous one (a loaded machine reconnects
		// slowly), the pause doubles up to a second, so kills keep landing
		// at every point of a transaction without starving the members.
		last, pause, stalled := -1, time.Duration(0), time.Now()
		for {
			rows, _ := b.Effects(t)
			if rows >= n {
				break
			}
			if rows > last {
				last, pause, stalled = rows, time.Duration(20+killed%5*10)*time.Millisecond, time.Now()
			} else {
				pause = min(2*pause, time.Second)
			}
			if time.Since(stalled) > 2*time.Minute { // liveness only
				t.Fatalf("no progress for 2 minutes under connection kills (%d of %d rows, %d backends killed)", rows, n, killed)
			}
			var k int
			require.NoError(t, b.DB.Pool.QueryRow(ctx,
				`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&k))
			killed += k
			time.Sleep(pause)
		}
		m1.stop()
		m2.stop()
		requireEffects(t, b, n)
		st := addStats(m1.stats(), m2.stats())
		require.Positive(t, st.TransientErrors, "the kills hit the members")
		require.Zero(t, st.DeadLettered)
		require.Zero(t, st.Failures, "killed connections never count as handler failures")
	})
}

// A topic deleted and recreated under the same name restarts its offsets at
// 0; with topic ids in the keys (inboxsarama's Config.Client, inboxfranz's
// Config.TopicIDs) its messages are new, not duplicates.
func TestSuiteTopicRecreatedIsNotDuplicate(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		m := acrossRecreation(t, a, b, newInbox(t, inbox.ByOffset()), 2)
		requireEffects(t, b, 4)
		require.Zero(t, m.stats().Duplicates)
		require.Equal(t, 2, b.Count(t, `SELECT count(DISTINCT split_part(split_part(key, '@', 2), '/', 1)) FROM pgbox_inbox`),
			"keys of the two incarnations carry different topic ids")
	})
}

// acrossRecreation has a member with topic ids on consume old events, then,
// after the topic was recreated, two new ones; it returns that member,
// stopped.
func acrossRecreation(t *testing.T, a adapter, b *bundle, ib *inbox.Inbox, old int) *member {
	t.Helper()
	s := settingsOf(b, ib, effect)
	s.topicIDs = true
	b.ProduceEvents(t, events("old", old)...)
	m := a.start(t, b, s)
	testutil.Eventually(t, 60*time.Second, "old effects", func() bool { n, _ := b.Effects(t); return n == old })
	m.stop()
	recreateTopic(t, b)
	b.ProduceEvents(t, events("new", 2)...)
	m = a.start(t, b, s)
	testutil.Eventually(t, 60*time.Second, "new effects", func() bool { n, _ := b.Effects(t); return n == old+2 })
	m.stop()
	return m
}

// recreateTopic deletes b's topic and creates it again, empty, under the same
// name, and deletes the group "svc" (its committed offset is past the new
// topic's end).
func recreateTopic(t *testing.T, b *bundle) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(b.Addrs, kafkatest.Config())
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.DeleteTopic(b.Topic))
	testutil.Eventually(t, 10*time.Second, "topic deleted", func() bool {
		ts, err := admin.ListTopics()
		require.NoError(t, err)
		_, ok := ts[b.Topic]
		return !ok
	})
	require.NoError(t, admin.CreateTopic(b.Topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false))
	require.NoError(t, admin.DeleteConsumerGroup("svc"))
}

func newWatermarkInbox(t *testing.T) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Dedup: inbox.DedupWatermark})
	require.NoError(t, err)
	return ib
}

// Watermark mode: the group's offset reset forwards, past records never
// processed, is logged and counted, not silent. (Reset backwards, it
// reprocesses nothing: TestSuiteWatermarkRewind.)
func TestSuiteWatermarkOffsetResets(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		var logs testutil.SyncBuffer
		s := settingsOf(b, newWatermarkInbox(t), effect)
		s.batch, s.logger = 10, slog.New(slog.NewTextHandler(&logs, nil))
		b.ProduceEvents(t, events("a", 100)...)
		m := a.start(t, b, s)
		testutil.Eventually(t, 60*time.Second, "first pass", func() bool { return b.Committed(t, "svc", 0) == 100 })
		m.stop()
		require.Equal(t, 100, b.Count(t, `SELECT count(*) FROM effects`))

		// Jump forward past 50 records nobody processed.
		b.ProduceEvents(t, events("b", 60)...)
		b.ResetOffset(t, "svc", 150)
		m = a.start(t, b, s)
		testutil.Eventually(t, 60*time.Second, "after the jump", func() bool { return b.Committed(t, "svc", 0) == 160 })
		m.stop()
		require.EqualValues(t, 10, m.stats().Processed)
		require.EqualValues(t, 1, m.stats().Gaps)
		require.Contains(t, logs.String(), "level=WARN")
		require.Contains(t, logs.String(), "gap=50 first_skipped_offset=100")
		require.Equal(t, 110, b.Count(t, `SELECT count(*) FROM effects`))
	})
}

// Watermark mode: a topic deleted and recreated under the same name restarts
// its offsets at 0; with topic ids the watermark row starts over for the new
// topic instead of taking its records for duplicates.
func TestSuiteWatermarkTopicRecreated(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		m := acrossRecreation(t, a, b, newWatermarkInbox(t), 3)
		requireEffects(t, b, 5)
		require.Zero(t, m.stats().Duplicates)
		require.Zero(t, m.stats().Gaps)
		require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM pgbox_inbox_watermark WHERE "offset" = 1 AND topic_id <> ''`))
	})
}

// Members join and leave one group while records are produced, a fifth of
// them resends of an earlier event id, batch sizes alternating so both paths
// meet in one group: every event has exactly one business row, and every
// resend is a duplicate. Eager and cooperative.
func TestSuiteRebalancesWithResends(t *testing.T) {
	t.Parallel()
	forEach(t, true, func(t *testing.T, a adapter) {
		b := setup(t, 4)
		msgs, unique := consumetest.Resends(b.Topic, "ev", 4000, rand.New(rand.NewPCG(1, 2)))
		ib := newInbox(t, inbox.ByHeader(eventHeader))
		var members []*member
		join := func() *member {
			s := settingsOf(b, ib, effect)
			s.batch = []int{50, 1, 20}[len(members)%3]
			m := a.start(t, b, s)
			members = append(members, m)
			return m
		}
		chunk := func(i int) { b.Produce(t, msgs[i*400:(i+1)*400]...) }
		m1 := join()
		chunk(0)
		chunk(1)
		m2 := join() // rebalance: m1 and m2 share the partitions
		chunk(2)
		chunk(3)
		m1.stop() // rebalance: m2 takes everything, mid-stream
		chunk(4)
		m3 := join()
		chunk(5)
		chunk(6)
		m2.stop()
		m4 := join()
		chunk(7)
		chunk(8)
		m3.stop()
		chunk(9)
		testutil.Eventually(t, 2*time.Minute, "every event processed", func() bool { _, d := b.Effects(t); return d == unique })
		m4.stop()
		requireEffects(t, b, unique)
		var st inbox.ConsumerStats
		for _, m := range members {
			st = addStats(st, m.stats())
		}
		require.EqualValues(t, unique, st.Processed)
		require.GreaterOrEqual(t, st.Duplicates, uint64(len(msgs)-unique), "every resend was a duplicate")
	})
}

// The loop runs Process and ProcessBatch without their savepoint (it owns
// the transaction, and BEGIN goes out with the dedup step): a handler that
// wrote and then failed must still leave nothing behind, and no message's
// effect may commit twice, in keyed and watermark mode, one by one and in
// batches. Every third message's handler writes its effect, then fails once;
// a savepoint the handler opens itself still works.
func TestSuiteHandlerErrorRollsBackWholeTx(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, mode := range []inbox.Dedup{inbox.DedupKeys, inbox.DedupWatermark} {
			for _, batch := range []int{1, 10} {
				b := setup(t, 2)
				b.ProduceEvents(t, events("e", 60)...)
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
				ib, err := inbox.New(inbox.Config{Consumer: "svc", Dedup: mode})
				require.NoError(t, err)
				s := settingsOf(b, ib, fn)
				s.batch = batch
				m := a.start(t, b, s)
				testutil.Eventually(t, 60*time.Second, "every message processed", func() bool { _, d := b.Effects(t); return d == 60 })
				m.stop()
				requireEffects(t, b, 60)
				require.NotZero(t, m.stats().Failures, "%v, batch %d", mode, batch)
				require.EqualValues(t, 60, m.stats().Processed, "%v, batch %d", mode, batch)
			}
		}
	})
}
