package inboxsarama_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// consumeUntilError runs one Consume call of a new group member and returns its
// error (what a service's Consume loop sees), failing the test if Consume
// has not returned within timeout.
func consumeUntilError(t *testing.T, addrs []string, group, topic string, h *inboxsarama.Handler, timeout time.Duration) error {
	t.Helper()
	cg, err := sarama.NewConsumerGroup(addrs, group, cgConfig())
	require.NoError(t, err)
	defer cg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- cg.Consume(ctx, []string{topic}, h) }()
	select {
	case err := <-errc:
		require.NoError(t, ctx.Err(), "Consume returned only because the test's deadline passed")
		return err
	case <-time.After(timeout + 30*time.Second):
		t.Fatal("Consume did not return")
		return nil
	}
}

// requireOperatorError checks what the service sees: the sentinel, the
// server's error for errors.As, and a message naming the fix.
func requireOperatorError(t *testing.T, err error, code, fix string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, inbox.ErrNeedsOperator)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, code, pgErr.Code)
	require.ErrorContains(t, err, fix)
}

// requireNoDeadLetters checks that an infrastructure failure was never
// blamed on a message.
func requireNoDeadLetters(t *testing.T, b *cgBundle, h *inboxsarama.Handler) {
	t.Helper()
	st := h.Stats()
	require.Zero(t, st.DeadLettered, "no message dead-lettered")
	require.Zero(t, st.Failures, "no attempt counted")
	require.Positive(t, st.OperatorErrors)
	require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_dead`))
	require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
	require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_outbox`))
}

// Started against a schema where pgbox's migrations were not run, the
// adapter ends Consume within seconds with an error that names the fix.
func TestConsumerMigrationsNotRun(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	consumetest.CreateEffects(t, db)
	c := kafkatest.New(t, kfake.SeedTopics(1, "events"), kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	b := &cgBundle{DB: db, Kafka: c, Addrs: c.ListenAddrs(), Topic: "events"}
	b.ProduceEvents(t, events("e", 5)...)

	var logs testutil.SyncBuffer
	h := mustHandler(t, db.Pool, newTestInbox(t, "svc", inbox.ByOffset()), effect,
		inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	start := time.Now()
	err := consumeUntilError(t, b.Addrs, "svc", b.Topic, h, 60*time.Second)
	requireOperatorError(t, err, "42P01", "relay migrate up")
	require.Less(t, time.Since(start), 30*time.Second)
	require.Contains(t, logs.String(), "level=ERROR")
	require.Contains(t, logs.String(), "relay migrate up")
	require.Zero(t, b.Count(t, `SELECT count(*) FROM effects`))
	require.Positive(t, h.Stats().OperatorErrors)
	require.Zero(t, h.Stats().Failures)
}

// The service's role loses its grants while the adapter runs: Consume
// returns the error (no dead letters, no attempts); granted again, a new
// Consume processes everything exactly once.
func TestConsumerGrantsRevoked(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 20} {
		t.Run(map[int]string{1: "batch1", 20: "batch20"}[batch], func(t *testing.T) {
			t.Parallel()
			b := cgSetup(t, 2)
			role := testutil.NewRole(t, b.DB)
			pool, err := pgxpool.New(context.Background(), role.URL)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			h := mustHandler(t, pool, newTestInbox(t, "svc", inbox.ByHeader(eventHeader)), effect,
				inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch, RetryBackoff: 10 * time.Millisecond}})

			first := events("a", 50)
			b.ProduceEvents(t, first...)
			m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
			testutil.Eventually(t, 60*time.Second, "the first events processed", func() bool {
				_, distinct := b.Effects(t)
				return distinct == len(first)
			})
			m.stop()

			role.Revoke(t)
			second := events("b", 50)
			b.ProduceEvents(t, second...)
			err = consumeUntilError(t, b.Addrs, "svc", b.Topic, h, 60*time.Second)
			requireOperatorError(t, err, "42501", "grant")
			requireNoDeadLetters(t, b, h)

			role.Grant(t)
			m = startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
			testutil.Eventually(t, 60*time.Second, "every event processed", func() bool {
				_, distinct := b.Effects(t)
				return distinct == len(first)+len(second)
			})
			m.stop()
			rows, distinct := b.Effects(t)
			require.Equal(t, len(first)+len(second), distinct)
			require.Equal(t, distinct, rows, "no event applied twice")
			require.Zero(t, h.Stats().DeadLettered)
		})
	}
}

// A deploy whose migration did not run: the handler's business table is
// missing. Every message fails the same way, through no fault of its own:
// the claim ends with the error, nothing is dead-lettered; once the table is
// back, a new Consume processes every message exactly once.
func TestConsumerBusinessTableMissing(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 20} {
		t.Run(map[int]string{1: "batch1", 20: "batch20"}[batch], func(t *testing.T) {
			t.Parallel()
			b := cgSetup(t, 2)
			ctx := context.Background()
			_, err := b.DB.Pool.Exec(ctx, `ALTER TABLE effects RENAME TO effects_elsewhere`)
			require.NoError(t, err)
			evs := events("e", 40)
			b.ProduceEvents(t, evs...)

			var logs testutil.SyncBuffer
			h := mustHandler(t, b.DB.Pool, newTestInbox(t, "svc", inbox.ByHeader(eventHeader)), effect,
				inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch, MaxAttempts: 1, RetryBackoff: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
			err = consumeUntilError(t, b.Addrs, "svc", b.Topic, h, 60*time.Second)
			requireOperatorError(t, err, "42P01", "apply the service's migrations")
			require.True(t, errors.Is(err, inbox.ErrNeedsOperator))
			requireNoDeadLetters(t, b, h)
			require.Contains(t, logs.String(), "level=ERROR")
			require.NotContains(t, logs.String(), "dead-lettered")

			_, err = b.DB.Pool.Exec(ctx, `ALTER TABLE effects_elsewhere RENAME TO effects`)
			require.NoError(t, err)
			m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
			testutil.Eventually(t, 60*time.Second, "every event processed", func() bool {
				_, distinct := b.Effects(t)
				return distinct == len(evs)
			})
			m.stop()
			rows, distinct := b.Effects(t)
			require.Equal(t, len(evs), distinct)
			require.Equal(t, len(evs), rows, "no event applied twice")
			require.Zero(t, h.Stats().DeadLettered)
		})
	}
}
