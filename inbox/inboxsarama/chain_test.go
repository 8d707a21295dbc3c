package inboxsarama_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// startRelay runs a relay on pool until stopped (or the test ends).
func startRelay(t *testing.T, pool *pgxpool.Pool, addrs []string, instance, channel string) (stop func()) {
	t.Helper()
	kc := kafkatest.Config()
	kc.Producer.Idempotent = true
	kc.Producer.RequiredAcks = sarama.WaitForAll
	kc.Net.MaxOpenRequests = 1
	kc.Producer.Return.Successes = true
	r, err := relay.New(relay.Config{
		Pool: pool, Brokers: addrs, Kafka: kc, Instance: instance, Lanes: 4,
		HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second,
		PollInterval: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Channel: channel,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("relay %s did not stop", instance)
		}
	}
	t.Cleanup(stop)
	return stop
}

// consume→process→produce across two services, each with its own database:
// service A consumes "orders" (with resends of the same event id), writes its
// business row and an outbox row for "payments" in one transaction; a relay
// publishes the outbox; service B consumes "payments" and dedupes on the
// relay's event id header. A's consumer and the relay are restarted mid-run.
// Every input event yields exactly one effect in A and exactly one in B.
func TestConsumerChainAcrossServices(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t, kfake.SeedTopics(3, "orders", "payments"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	addrs := c.ListenAddrs()
	dbA, dbB := testdb.New(t), testdb.New(t)
	consumetest.CreateEffects(t, dbA)
	consumetest.CreateEffects(t, dbB)
	a := &cgBundle{DB: dbA, Kafka: c, Addrs: addrs, Topic: "orders"}
	bsvc := &cgBundle{DB: dbB, Kafka: c, Addrs: addrs, Topic: "payments"}

	// Service A: orders → effects + outbox(payments).
	ibA := newTestInbox(t, "svc-a", inbox.ByHeader(eventHeader))
	handlerA := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		ev, _ := m.Header(eventHeader)
		return outbox.Write(ctx, tx, outbox.Message{
			Topic: "payments", Key: m.Key, Value: []byte("payment for " + string(ev)),
			Headers: []outbox.Header{{Key: eventHeader, Value: ev}},
		})
	}
	// Service B: payments → effects, deduped on the relay's event id.
	ibB := newTestInbox(t, "svc-b", inbox.ByHeader(relay.EventIDHeader))
	hB := mustHandler(t, dbB.Pool, ibB, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 20}})

	rng := rand.New(rand.NewPCG(3, 4))
	msgs, unique := consumetest.Resends("orders", "order", 1200, rng)
	newA := func() (*inboxsarama.Handler, *member) {
		h := mustHandler(t, dbA.Pool, ibA, handlerA, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 10}})
		return h, startMember(t, addrs, "svc-a", []string{"orders"}, h)
	}
	channel := "pgbox_" + dbA.Schema
	hA1, mA := newA()
	stopRelay := startRelay(t, dbA.Pool, addrs, "relay-1", channel)
	mB := startMember(t, addrs, "svc-b", []string{"payments"}, hB)

	a.Produce(t, msgs[:400]...)
	testutil.Eventually(t, 60*time.Second, "A has started", func() bool { n, _ := a.Effects(t); return n > 100 })
	mA.stop() // A restarts mid-stream
	hA2, mA2 := newA()
	a.Produce(t, msgs[400:800]...)
	testutil.Eventually(t, 60*time.Second, "B has started", func() bool { n, _ := bsvc.Effects(t); return n > 100 })
	stopRelay() // the relay restarts mid-stream (another instance)
	startRelay(t, dbA.Pool, addrs, "relay-2", channel)
	a.Produce(t, msgs[800:]...)

	testutil.Eventually(t, 90*time.Second, "every event reached B", func() bool {
		_, distinct := bsvc.Effects(t)
		return distinct == unique
	})
	// Let any late duplicate (a republished outbox row) arrive and be deduped.
	testutil.Eventually(t, 30*time.Second, "outbox drained", func() bool {
		return a.Count(t, `SELECT count(*) FROM pgbox_outbox`) == 0
	})
	mA2.stop()
	mB.stop()

	rowsA, distinctA := a.Effects(t)
	require.Equal(t, unique, distinctA)
	require.Equal(t, unique, rowsA, "one effect per input event in A")
	rowsB, distinctB := bsvc.Effects(t)
	require.Equal(t, unique, distinctB)
	require.Equal(t, unique, rowsB, "one downstream effect per input event in B")
	require.EqualValues(t, unique, hA1.Stats().Processed+hA2.Stats().Processed)
	t.Logf("A duplicates %d, B duplicates %d (relay resends deduped)",
		hA1.Stats().Duplicates+hA2.Stats().Duplicates, hB.Stats().Duplicates)
}
