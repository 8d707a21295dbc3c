package consume_test

// The guarantee suite runs one set of test bodies against each consumer
// adapter: inboxsarama (sarama's consumer group, eager) and inboxfranz
// (franz-go's, with the cooperative-sticky balancer, and with an eager one
// where rebalances are the point). This file is the adapters' common face
// and the test world; suite_test.go holds the bodies.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// eventHeader carries the producer-assigned event id in these tests.
const eventHeader = "event-id"

// settings are what a test asks of an adapter; each maps them onto its
// own Config.
type settings struct {
	pool          *pgxpool.Pool
	ib            *inbox.Inbox
	fn            inbox.HandlerFunc
	group         string
	batch         int
	maxAttempts   int
	retryBackoff  time.Duration
	drainTimeout  time.Duration
	topicIDs      bool
	commitOffsets bool
	logger        *slog.Logger
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
	cfg := inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: s.batch, MaxAttempts: s.maxAttempts, RetryBackoff: s.retryBackoff, DrainTimeout: s.drainTimeout, Logger: s.logger}, CommitOffsets: s.commitOffsets}
	if s.topicIDs {
		client, err := sarama.NewClient(b.addrs, saramaConfig())
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close() })
		cfg.Client = client
	}
	h, err := inboxsarama.NewHandler(s.pool, s.ib, s.fn, cfg)
	require.NoError(t, err)
	cg, err := sarama.NewConsumerGroup(b.addrs, s.group, saramaConfig())
	require.NoError(t, err)
	m, ctx := newMember(h.Stats)
	go func() {
		defer close(m.done)
		defer cg.Close()
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, []string{b.topic}, h); err != nil && ctx.Err() == nil {
				m.report(err)
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(m.stop)
	return m
}

// saramaConfig is a sarama consumer-group config with short group timings.
func saramaConfig() *sarama.Config {
	cfg := kafkatest.Config()
	cfg.Consumer.Group.Session.Timeout = 2 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	cfg.Consumer.Group.Rebalance.Timeout = 5 * time.Second
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	return cfg
}

// franzOpts are the kgo options of a test member of the adapter.
func franzOpts(addrs []string, group, topic string, balancer kgo.GroupBalancer) []kgo.Opt {
	return append(franzGroupOpts(addrs, group, topic, balancer), kgo.DisableAutoCommit())
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
		cfg := inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: s.batch, MaxAttempts: s.maxAttempts, RetryBackoff: s.retryBackoff, DrainTimeout: s.drainTimeout, Logger: s.logger}, CommitOffsets: s.commitOffsets, TopicIDs: s.topicIDs, CommitInterval: 100 * time.Millisecond}
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
				c, err := inboxfranz.NewConsumer(s.pool, s.ib, s.fn, cfg, franzOpts(b.addrs, s.group, b.topic, balancer)...)
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

// bundle is one test's world: a private schema with a business table
// (effects, deliberately without a unique constraint, so a double effect
// shows as two rows), and a private broker.
type bundle struct {
	db    *testdb.DB
	kafka *kfake.Cluster
	addrs []string
	topic string
}

func setup(t testing.TB, partitions int32) *bundle {
	t.Helper()
	db := testdb.New(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE effects (
		id bigserial PRIMARY KEY, event text NOT NULL, topic text NOT NULL,
		partition int NOT NULL, "offset" bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	c := kafkatest.New(t, kfake.SeedTopics(partitions, "events"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	return &bundle{db: db, kafka: c, addrs: c.ListenAddrs(), topic: "events"}
}

func (b *bundle) settings(ib *inbox.Inbox, fn inbox.HandlerFunc) settings {
	return settings{pool: b.db.Pool, ib: ib, fn: fn, group: "svc", retryBackoff: 10 * time.Millisecond}
}

// produce sends one record per event (key, header and value name it).
func (b *bundle) produce(t testing.TB, evs ...string) {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(b.addrs, cfg)
	require.NoError(t, err)
	defer p.Close()
	msgs := make([]*sarama.ProducerMessage, len(evs))
	for i, e := range evs {
		msgs[i] = &sarama.ProducerMessage{Topic: b.topic, Key: sarama.StringEncoder(e), Value: sarama.StringEncoder("payload of " + e),
			Headers: []sarama.RecordHeader{{Key: []byte(eventHeader), Value: []byte(e)}}}
	}
	for len(msgs) > 0 {
		n := min(len(msgs), 500)
		require.NoError(t, p.SendMessages(msgs[:n]))
		msgs = msgs[n:]
	}
}

func events(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
}

// effect is the business handler: one row per event it processes.
func effect(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	ev, _ := m.Header(eventHeader)
	_, err := tx.Exec(ctx, `INSERT INTO effects (event, topic, partition, "offset") VALUES ($1, $2, $3, $4)`,
		string(ev), m.Topic, m.Partition, m.Offset)
	return err
}

func newInbox(t testing.TB, key inbox.KeyStrategy) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: key})
	require.NoError(t, err)
	return ib
}

func (b *bundle) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// effects returns the business rows and the distinct events among them.
func (b *bundle) effects(t testing.TB) (rows, distinct int) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT event) FROM effects`).Scan(&rows, &distinct))
	return rows, distinct
}

// committed is the group's committed offset of partition (-1 when none,
// or while the broker cannot answer).
func (b *bundle) committed(t testing.TB, group string, partition int32) int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(b.addrs, kafkatest.Config())
	if err != nil {
		return -1
	}
	defer admin.Close()
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{b.topic: {partition}})
	if err != nil {
		return -1
	}
	if blk := resp.GetBlock(b.topic, partition); blk != nil && blk.Err == sarama.ErrNoError {
		return blk.Offset
	}
	return -1
}

// resetOffset commits offset as group's position on partition 0 (the group
// has no running member), as `kafka-consumer-groups --reset-offsets` does.
func (b *bundle) resetOffset(t testing.TB, group string, offset int64) {
	t.Helper()
	client, err := sarama.NewClient(b.addrs, kafkatest.Config())
	require.NoError(t, err)
	defer client.Close()
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	require.NoError(t, err)
	pom, err := om.ManagePartition(b.topic, 0)
	require.NoError(t, err)
	pom.ResetOffset(offset, "") // moves backwards only...
	pom.MarkOffset(offset, "")  // ...and this forwards only
	require.NoError(t, pom.Close())
	om.Commit()
	require.NoError(t, om.Close())
	require.Equal(t, offset, b.committed(t, group, 0))
}

// dlqRow is a dead-letter record as the outbox holds it.
type dlqRow struct {
	Key     []byte
	Value   []byte
	Headers map[string]string
}

// outboxDLQ reads the outbox rows of topic (dead letters not yet published).
func (b *bundle) outboxDLQ(t testing.TB, topic string) []dlqRow {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(),
		`SELECT key, value, coalesce(headers, '[]') FROM pgbox_outbox WHERE topic = $1 ORDER BY id`, topic)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dlqRow, error) {
		var d dlqRow
		var hs []byte
		if err := r.Scan(&d.Key, &d.Value, &hs); err != nil {
			return d, err
		}
		var list []struct {
			K string `json:"k"`
			V []byte `json:"v"`
		}
		if err := json.Unmarshal(hs, &list); err != nil {
			return d, err
		}
		d.Headers = map[string]string{}
		for _, h := range list {
			d.Headers[h.K] = string(h.V)
		}
		return d, nil
	})
	require.NoError(t, err)
	return out
}

// syncBuffer is a log destination the adapters' goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
