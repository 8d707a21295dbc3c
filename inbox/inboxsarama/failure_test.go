package inboxsarama_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/relay"
)

// A poison message: it fails MaxAttempts times, counted in Postgres across a
// restart of the consumer, then exactly one dead-letter record is written
// with the key recorded in the inbox; the offset moves past it and the later
// messages are processed. A resend of the same event is a duplicate.
func TestConsumerPoisonMessageDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := cgSetup(t, 1, "events.dlq")
	evs := events("e", 10)
	poison := evs[4]
	b.ProduceEvents(t, evs...)

	var calls atomic.Int64 // handler runs for the poison message, both members
	third := make(chan struct{})
	failing := func(member int) inbox.HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if ev, _ := m.Header(eventHeader); string(ev) == poison {
				n := calls.Add(1)
				if member == 1 && n == 3 {
					// Member 1 stops here, before its third attempt fails.
					close(third)
					<-ctx.Done()
					return ctx.Err()
				}
				return fmt.Errorf("cannot apply %s: account closed", ev)
			}
			return effect(ctx, tx, m)
		}
	}
	opts := inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{MaxAttempts: 3, RetryBackoff: 20 * time.Millisecond, DrainTimeout: 50 * time.Millisecond}}

	ib := newTestInbox(t, "svc", inbox.ByHeader(eventHeader))
	h1 := mustHandler(t, b.DB.Pool, ib, failing(1), opts)
	m1 := startMember(t, b.Addrs, "svc", []string{b.Topic}, h1)
	<-third
	m1.stop()
	require.Equal(t, 2, b.Count(t, `SELECT attempts FROM pgbox_consumer_attempts WHERE "offset" = 4`),
		"two failed attempts recorded before the restart")
	require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_dead`))
	require.Equal(t, 4, b.Count(t, `SELECT count(*) FROM effects`), "nothing after the poison message yet")
	require.EqualValues(t, 4, b.Committed(t, "svc", 0))

	// Restart: one more failure reaches MaxAttempts.
	h2 := mustHandler(t, b.DB.Pool, ib, failing(2), opts)
	m2 := startMember(t, b.Addrs, "svc", []string{b.Topic}, h2)
	testutil.Eventually(t, 30*time.Second, "later messages", func() bool { n, _ := b.Effects(t); return n == 9 })
	m2.stop()

	require.EqualValues(t, 4, calls.Load(), "3 failed attempts (the 3rd interrupted one did not count) + 1 after restart")
	require.EqualValues(t, 1, h2.Stats().DeadLettered)
	require.EqualValues(t, 10, b.Committed(t, "svc", 0), "offset advanced past the poison message")
	require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_consumer_attempts`))
	var dead struct {
		key      string
		attempts int
		errText  string
		dlq      string
	}
	require.NoError(t, b.DB.Pool.QueryRow(ctx, `SELECT key, attempts, error, dlq_topic FROM pgbox_consumer_dead`).
		Scan(&dead.key, &dead.attempts, &dead.errText, &dead.dlq))
	require.Equal(t, poison, dead.key)
	require.Equal(t, 3, dead.attempts)
	require.Contains(t, dead.errText, "account closed")
	require.Equal(t, "events.dlq", dead.dlq)
	// The record itself is kept for a replay (inspect.ReplayDead).
	var stored bool
	var recKey, recValue []byte
	var recHeaders string
	require.NoError(t, b.DB.Pool.QueryRow(ctx, `SELECT record_stored, record_key, record_value, record_headers::text FROM pgbox_consumer_dead`).
		Scan(&stored, &recKey, &recValue, &recHeaders))
	require.True(t, stored)
	require.Equal(t, poison, string(recKey))
	require.Equal(t, "payload of "+poison, string(recValue))
	require.Contains(t, recHeaders, `"k": "`+eventHeader+`"`)

	dl := b.OutboxDLQ(t, "events.dlq")
	require.Len(t, dl, 1, "exactly one dead-letter record")
	require.Equal(t, poison, string(dl[0].Key))
	require.Equal(t, "payload of "+poison, string(dl[0].Value))
	require.Equal(t, poison, dl[0].Headers[eventHeader], "original headers kept")
	require.Contains(t, dl[0].Headers[inbox.HeaderDLQError], "account closed")
	require.Equal(t, "3", dl[0].Headers[inbox.HeaderDLQAttempts])
	require.Equal(t, "events", dl[0].Headers[inbox.HeaderDLQSourceTopic])
	require.Equal(t, "0", dl[0].Headers[inbox.HeaderDLQSourcePart])
	require.Equal(t, "4", dl[0].Headers[inbox.HeaderDLQSourceOffset])
	require.Equal(t, "svc", dl[0].Headers[inbox.HeaderDLQConsumer])
	require.Equal(t, poison, dl[0].Headers[inbox.HeaderDLQKey])

	// The key is recorded: a resend of the poison event is a duplicate.
	b.ProduceEvents(t, poison, "e-after")
	h3 := mustHandler(t, b.DB.Pool, ib, failing(3), opts)
	m3 := startMember(t, b.Addrs, "svc", []string{b.Topic}, h3)
	testutil.Eventually(t, 30*time.Second, "message after the resend", func() bool { n, _ := b.Effects(t); return n == 10 })
	m3.stop()
	require.EqualValues(t, 4, calls.Load(), "the resend did not run the handler")
	require.EqualValues(t, 1, h3.Stats().Duplicates)
	require.Len(t, b.OutboxDLQ(t, "events.dlq"), 1)

	// A relay publishes it: exactly one record on the dead-letter topic.
	startRelay(t, b.DB.Pool, b.Addrs, "relay", "pgbox_"+b.DB.Schema)
	got := kafkatest.ReadAll(t, b.Addrs, "events.dlq", 1, 30*time.Second)
	require.Len(t, got, 1)
	require.Equal(t, poison, string(got[0].Key))
	require.Equal(t, "payload of "+poison, string(got[0].Value))
	hs := map[string]string{}
	for _, h := range got[0].Headers {
		hs[string(h.Key)] = string(h.Value)
	}
	require.Equal(t, "3", hs[inbox.HeaderDLQAttempts])
	require.Equal(t, "4", hs[inbox.HeaderDLQSourceOffset])
	require.Contains(t, hs[inbox.HeaderDLQError], "account closed")
	require.NotEmpty(t, hs[relay.EventIDHeader])
}
