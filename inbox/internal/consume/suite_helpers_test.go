package consume_test

// The guarantee suite runs one set of test bodies against each consumer
// adapter: inboxsarama (sarama's consumer group, eager) and inboxfranz
// (franz-go's, with the cooperative-sticky balancer, and with an eager one
// where rebalances are the point). This file is the adapters' common face
// and the test world; suite_test.go holds the bodies.

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
)

// The world of the tests, shared with inboxsarama's own.
type bundle = consumetest.World

const eventHeader = consumetest.EventHeader

var (
	setup  = consumetest.Setup
	events = consumetest.Events
	effect = consumetest.Effect
)

// settings are what a test asks of an adapter; each maps them onto its
// own Config.
type settings struct {
	pool            *pgxpool.Pool
	ib              *inbox.Inbox
	fn              inbox.HandlerFunc
	batchFn         inbox.BatchHandlerFunc // with fn nil: ConsumerConfig.BatchHandler
	group           string
	batch           int
	batchWait       time.Duration
	maxAttempts     int
	retryBackoff    time.Duration
	drainTimeout    time.Duration
	deadLetterTopic string
	topicIDs        bool
	commitOffsets   bool
	logger          *slog.Logger
}

// member is one running group member of some adapter.
type member struct {
	stats func() inbox.ConsumerStats
	// errs receives the errors its Consume (Run) returned; it then
	// starts over, as a service's loop does.
	errs   chan error
	cancel context.CancelFunc
	done   chan struct{}
}

func (m *member) stop() {
	m.cancel()
	<-m.done
}

// adapter is one consumer adapter under test.
type adapter struct {
	name  string
	start func(t testing.TB, b *bundle, s settings) *member
}

// adapters is every adapter; eagerToo adds franz-go with an eager balancer.
func adapters(eagerToo bool) []adapter {
	as := []adapter{{"sarama", startSarama}, {"franz", startFranz(kgo.CooperativeStickyBalancer())}}
	if eagerToo {
		as = append(as, adapter{"franz-eager", startFranz(kgo.RangeBalancer())})
	}
	return as
}

// forEach runs body once per adapter, in parallel subtests.
func forEach(t *testing.T, eagerToo bool, body func(t *testing.T, a adapter)) {
	for _, a := range adapters(eagerToo) {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			body(t, a)
		})
	}
}

func newMember(stats func() inbox.ConsumerStats) (*member, context.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	return &member{stats: stats, errs: make(chan error, 16), cancel: cancel, done: make(chan struct{})}, ctx
}

func (m *member) report(err error) {
	select {
	case m.errs <- err:
	default:
	}
}

func startSarama(t testing.TB, b *bundle, s settings) *member {
	t.Helper()
	cfg := inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: s.batch, BatchWait: s.batchWait, MaxAttempts: s.maxAttempts, RetryBackoff: s.retryBackoff, DrainTimeout: s.drainTimeout, DeadLetterTopic: s.deadLetterTopic, Logger: s.logger, BatchHandler: s.batchFn}, CommitOffsets: s.commitOffsets}
	if s.topicIDs {
		client, err := sarama.NewClient(b.Addrs, consumetest.GroupConfig())
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close() })
		cfg.Client = client
	}
	h, err := inboxsarama.NewHandler(s.pool, s.ib, s.fn, cfg)
	require.NoError(t, err)
	cg, err := sarama.NewConsumerGroup(b.Addrs, s.group, consumetest.GroupConfig())
	require.NoError(t, err)
	m, ctx := newMember(h.Stats)
	go func() {
		defer close(m.done)
		defer cg.Close()
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, []string{b.Topic}, h); err != nil && ctx.Err() == nil {
				m.report(err)
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(m.stop)
	return m
}

// franzOpts are the kgo options of a test member of the adapter: no
// kgo.DisableAutoCommit, which is the adapter's job.
func franzOpts(addrs []string, group, topic string, balancer kgo.GroupBalancer) []kgo.Opt {
	return franzGroupOpts(addrs, group, topic, balancer)
}

// franzGroupOpts are the kgo options of a group member with short timings.
func franzGroupOpts(addrs []string, group, topic string, balancer kgo.GroupBalancer) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.Balancers(balancer), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(2 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.RebalanceTimeout(5 * time.Second), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
	}
}

func startFranz(balancer kgo.GroupBalancer) func(t testing.TB, b *bundle, s settings) *member {
	return func(t testing.TB, b *bundle, s settings) *member {
		t.Helper()
		cfg := inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: s.batch, BatchWait: s.batchWait, MaxAttempts: s.maxAttempts, RetryBackoff: s.retryBackoff, DrainTimeout: s.drainTimeout, DeadLetterTopic: s.deadLetterTopic, Logger: s.logger, BatchHandler: s.batchFn}, CommitOffsets: s.commitOffsets, TopicIDs: s.topicIDs, CommitInterval: 100 * time.Millisecond}
		var mu sync.Mutex
		var total inbox.ConsumerStats // of the consumers that ended
		var cur *inboxfranz.Consumer
		stats := func() inbox.ConsumerStats {
			mu.Lock()
			defer mu.Unlock()
			s := total
			if cur != nil {
				s = addStats(s, cur.Stats())
			}
			return s
		}
		m, ctx := newMember(stats)
		go func() {
			defer close(m.done)
			for ctx.Err() == nil {
				c, err := inboxfranz.NewConsumer(s.pool, s.ib, s.fn, cfg, franzOpts(b.Addrs, s.group, b.Topic, balancer)...)
				if err != nil {
					m.report(err)
					return
				}
				mu.Lock()
				cur = c
				mu.Unlock()
				err = c.Run(ctx)
				c.Close()
				mu.Lock()
				total, cur = addStats(total, c.Stats()), nil
				mu.Unlock()
				if err != nil {
					m.report(err)
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
		t.Cleanup(m.stop)
		return m
	}
}

func addStats(a, b inbox.ConsumerStats) inbox.ConsumerStats {
	return inbox.ConsumerStats{
		Processed: a.Processed + b.Processed, Duplicates: a.Duplicates + b.Duplicates, Failures: a.Failures + b.Failures,
		TransientErrors: a.TransientErrors + b.TransientErrors, OperatorErrors: a.OperatorErrors + b.OperatorErrors,
		Retries: a.Retries + b.Retries, DeadLettered: a.DeadLettered + b.DeadLettered,
		BatchFallbacks: a.BatchFallbacks + b.BatchFallbacks, Gaps: a.Gaps + b.Gaps,
	}
}

// settingsOf are the settings most tests start from.
func settingsOf(b *bundle, ib *inbox.Inbox, fn inbox.HandlerFunc) settings {
	return settings{pool: b.DB.Pool, ib: ib, fn: fn, group: "svc", retryBackoff: 10 * time.Millisecond}
}

func newInbox(t testing.TB, key inbox.KeyStrategy) *inbox.Inbox {
	t.Helper()
	return consumetest.NewInbox(t, "svc", key)
}
