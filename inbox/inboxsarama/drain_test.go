package inboxsarama_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/testutil"
)

// A transaction in flight when the session ends may finish within
// DrainTimeout: it commits and its offset is marked and committed as the
// member leaves, so the next member does not see the message again.
func TestConsumerSessionEndFinishesInFlight(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 1)
	b.ProduceEvents(t, events("e", 5)...)
	started, release := make(chan struct{}), make(chan struct{})
	fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.Offset == 2 {
			close(started)
			<-release
		}
		return effect(ctx, tx, m)
	}
	ib := newTestInbox(t, "svc", inbox.ByOffset())
	h := mustHandler(t, b.DB.Pool, ib, fn, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{DrainTimeout: 30 * time.Second}})
	m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	<-started
	m.cancel() // the session ends while offset 2's transaction is open
	time.Sleep(100 * time.Millisecond)
	close(release)
	<-m.done

	require.Equal(t, 3, b.Count(t, `SELECT count(*) FROM effects`), "offsets 0-2 committed, nothing started after")
	require.EqualValues(t, 3, b.Committed(t, "svc", 0), "offset 2 marked after its commit")

	h2 := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{})
	m2 := startMember(t, b.Addrs, "svc", []string{b.Topic}, h2)
	testutil.Eventually(t, 30*time.Second, "the rest", func() bool { n, _ := b.Effects(t); return n == 5 })
	m2.stop()
	require.Zero(t, h2.Stats().Duplicates, "nothing redelivered")
}

// Past DrainTimeout the transaction in flight is rolled back and its offset
// is not marked: the next member processes the message, once.
func TestConsumerSessionEndRollsBackAfterDrainTimeout(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 1)
	b.ProduceEvents(t, events("e", 5)...)
	started := make(chan struct{})
	fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		if m.Offset == 2 {
			close(started)
			<-ctx.Done() // a handler stuck until its context is cancelled
			return ctx.Err()
		}
		return nil
	}
	ib := newTestInbox(t, "svc", inbox.ByOffset())
	h := mustHandler(t, b.DB.Pool, ib, fn, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{DrainTimeout: 100 * time.Millisecond}})
	m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	<-started
	m.stop()

	require.Equal(t, 2, b.Count(t, `SELECT count(*) FROM effects`), "offset 2's effect rolled back")
	require.EqualValues(t, 2, b.Committed(t, "svc", 0), "offset 2 not marked")
	require.Zero(t, h.Stats().Failures, "a cancelled attempt is not a failure")

	h2 := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{})
	m2 := startMember(t, b.Addrs, "svc", []string{b.Topic}, h2)
	testutil.Eventually(t, 30*time.Second, "the rest", func() bool { n, _ := b.Effects(t); return n == 5 })
	m2.stop()
	rows, distinct := b.Effects(t)
	require.Equal(t, 5, rows)
	require.Equal(t, 5, distinct)
}
