package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

type testBundle struct {
	db      *testdb.DB
	cluster *kfake.Cluster
	addrs   []string
	topic   string
	channel string
}

// setup gives a test its own schema, broker and topic (3 partitions).
func setup(t testing.TB, opts ...kfake.Opt) *testBundle {
	t.Helper()
	db := testdb.New(t)
	c := kafkatest.New(t, append([]kfake.Opt{kfake.SeedTopics(3, "events")}, opts...)...)
	return &testBundle{db: db, cluster: c, addrs: c.ListenAddrs(), topic: "events", channel: "pgbox_" + db.Schema}
}

func kafkaConfig() *sarama.Config {
	c := kafkatest.Config()
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Return.Successes = true
	c.Producer.Retry.Max = 3
	return c
}

// config is a relay config for tests: fast heartbeats and leases, the test's
// own NOTIFY channel.
func (b *testBundle) config(name string) relay.Config {
	return b.configWithPool(b.db.Pool, name)
}

func (b *testBundle) configWithPool(pool *pgxpool.Pool, name string) relay.Config {
	return relay.Config{
		Pool:              pool,
		Brokers:           b.addrs,
		Kafka:             kafkaConfig(),
		Instance:          name,
		Lanes:             8,
		HeartbeatInterval: 100 * time.Millisecond,
		LeaseTTL:          time.Second,
		PollInterval:      200 * time.Millisecond,
		MaxBackoff:        500 * time.Millisecond,
		Channel:           b.channel,
		Logger:            testLogger(name),
	}
}

func testLogger(name string) *slog.Logger {
	if os.Getenv("PGBOX_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test_relay", name)
}

type running struct {
	r      *relay.Relay
	cancel context.CancelFunc
	done   chan error
}

// start runs a relay until stop or the end of the test.
func start(t testing.TB, cfg relay.Config) *running {
	t.Helper()
	r, err := relay.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() { rr.stop(t) })
	return rr
}

func (rr *running) stop(t testing.TB) {
	rr.cancel()
	select {
	case err, ok := <-rr.done:
		if ok {
			require.NoError(t, err)
			close(rr.done)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("relay %s did not stop", rr.r.Instance())
	}
}

// write commits msgs in one transaction.
func (b *testBundle) write(t testing.TB, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, msgs...)
	}))
}

func (b *testBundle) outboxCount(t testing.TB, where string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pgbox_outbox WHERE "+where).Scan(&n))
	return n
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func header(m *sarama.ConsumerMessage, name string) (string, bool) {
	for _, h := range m.Headers {
		if string(h.Key) == name {
			return string(h.Value), true
		}
	}
	return "", false
}

func msg(topic, key, value string) outbox.Message {
	return outbox.Message{Topic: topic, Key: []byte(key), Value: []byte(value)}
}

func keyed(i int) string { return fmt.Sprintf("key-%03d", i) }

// readTopic consumes topic from the start until it has want records (or 30 s).
func readTopic(t testing.TB, b *testBundle, topic string, want int) []*sarama.ConsumerMessage {
	t.Helper()
	return kafkatest.ReadAll(t, b.addrs, topic, want, 30*time.Second)
}

// readEvents consumes topic until it has seen `events` distinct event ids
// (duplicates count toward kafkatest.ReadAll's total, so one call may stop
// short) and returns every record read.
func readEvents(t testing.TB, b *testBundle, events int) []*sarama.ConsumerMessage {
	t.Helper()
	want := events
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := readTopic(t, b, b.topic, want)
		ids := map[string]bool{}
		for _, m := range got {
			if id, ok := header(m, relay.EventIDHeader); ok {
				ids[id] = true
			}
		}
		if len(ids) >= events || time.Now().After(deadline) {
			return got
		}
		want = len(got) + events - len(ids)
	}
}

// waitAllLanes waits until every target of f holds lanes.
func waitAllLanes(t testing.TB, f *relay.Fleet) {
	t.Helper()
	waitFor(t, "every target holds lanes", func() bool {
		for _, s := range f.Targets() {
			if s.Stats.Lanes == 0 {
				return false
			}
		}
		return true
	})
}

// targetState is f's state of the target name (the test fails if f has
// none of that name).
func targetState(t testing.TB, f *relay.Fleet, name string) relay.TargetState {
	t.Helper()
	for _, s := range f.Targets() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no target %q in %v", name, f.Targets())
	return relay.TargetState{}
}
