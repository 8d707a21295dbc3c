package inboxsarama_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// The world of these tests, shared with the guarantee suite
// (inbox/internal/consume).
type cgBundle = consumetest.World

const eventHeader = consumetest.EventHeader

var (
	cgSetup      = consumetest.Setup
	cgConfig     = consumetest.GroupConfig
	effect       = consumetest.Effect
	events       = consumetest.Events
	newTestInbox = consumetest.NewInbox
)

// member is one running consumer-group member.
type member struct {
	h      *inboxsarama.Handler
	cancel context.CancelFunc
	done   chan struct{}
}

// startMember joins group with h and consumes until stopped (or the test
// ends).
func startMember(t testing.TB, addrs []string, group string, topics []string, h *inboxsarama.Handler) *member {
	t.Helper()
	return startMemberConfig(t, cgConfig(), addrs, group, topics, h)
}

func startMemberConfig(t testing.TB, cfg *sarama.Config, addrs []string, group string, topics []string, h *inboxsarama.Handler) *member {
	t.Helper()
	cg, err := sarama.NewConsumerGroup(addrs, group, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{h: h, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		defer cg.Close()
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, topics, h); err != nil && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(m.stop)
	return m
}

// stop leaves the group: Consume returns after the claims finished, and
// Close commits the marked offsets.
func (m *member) stop() {
	m.cancel()
	<-m.done
}

func mustHandler(t testing.TB, pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, opts inboxsarama.Config) *inboxsarama.Handler {
	t.Helper()
	h, err := inboxsarama.NewHandler(pool, ib, fn, opts)
	require.NoError(t, err)
	return h
}

// --- tests ---

func TestNewHandlerValidates(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ib := newTestInbox(t, "svc", inbox.ByOffset())
	for _, tc := range []struct {
		name string
		pool *pgxpool.Pool
		ib   *inbox.Inbox
		fn   inbox.HandlerFunc
		opts inboxsarama.Config
		want string
	}{
		{"nil pool", nil, ib, effect, inboxsarama.Config{}, "nil pool"},
		{"nil inbox", db.Pool, nil, effect, inboxsarama.Config{}, "nil *inbox.Inbox"},
		{"nil handler", db.Pool, ib, nil, inboxsarama.Config{}, "nil HandlerFunc"},
		{"negative batch", db.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: -1}}, "BatchSize is negative"},
		{"negative attempts", db.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{MaxAttempts: -2}}, "MaxAttempts is negative"},
		{"bad dlq topic", db.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{DeadLetterTopic: "dead letters"}}, `DeadLetterTopic "dead letters"`},
	} {
		_, err := inboxsarama.NewHandler(tc.pool, tc.ib, tc.fn, tc.opts)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err := inboxsarama.NewHandler(db.Pool, ib, effect, inboxsarama.Config{})
	require.NoError(t, err)
}

// The documented fallback: a client that cannot ask for topic ids (protocol
// version below 2.8; a broker reporting the all-zero id is treated the same)
// leaves Message.TopicID empty, and ByOffset keys are topic/partition/offset.
func TestConsumerTopicIDFallback(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 1)
	b.ProduceEvents(t, "a", "b")
	cfg := cgConfig()
	cfg.Version = sarama.V2_6_0_0
	client, err := sarama.NewClient(b.Addrs, cfg)
	require.NoError(t, err)
	defer client.Close()
	var ids []string
	fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		ids = append(ids, m.TopicID)
		return effect(ctx, tx, m)
	}
	h := mustHandler(t, b.DB.Pool, newTestInbox(t, "svc", inbox.ByOffset()), fn, inboxsarama.Config{Client: client})
	m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	testutil.Eventually(t, 30*time.Second, "effects", func() bool { n, _ := b.Effects(t); return n == 2 })
	m.stop()
	require.Equal(t, []string{"", ""}, ids)
	require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM pgbox_inbox WHERE key = 'events/0/1'`))
}
