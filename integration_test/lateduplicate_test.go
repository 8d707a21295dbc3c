package integration_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/integration_test/internal/harness"
)

// TestScenarioLateDuplicate is the deterministic form of a failure the
// chaos run found (seed 1795432176558995582, 6 duplicate effects): the relay
// publishes an event again after its crash window (same event id, a later
// offset and timestamp); the consumer skips it as a duplicate, and its
// inbox row keeps the first copy's times. Once the first copy has aged out
// of Kafka, cleanup deletes the key, while the later copy is still in
// Kafka: a rewind delivers it as new, and the order is charged twice.
// Fails until the inbox keeps a key at least as long as its newest copy
// (e.g. a duplicate delivery moves the row's record time forward).
func TestScenarioLateDuplicate(t *testing.T) {
	ctx, w := scenarioWorld(t, harness.Options{Retention: 10 * time.Second})
	const events = 200
	require.NoError(t, w.StartOrders(events, 100, 4))
	requireDrained(ctx, t, w, events, 3*time.Minute)
	require.NoError(t, w.WaitConsumed(ctx, time.Minute))

	// Every original record is now older than retention + segment.ms +
	// buffer (12s).
	time.Sleep(14 * time.Second)
	recs, err := harness.ReadTopic(ctx, w.Brokers, harness.OrdersTopic)
	require.NoError(t, err)
	require.NotEmpty(t, recs)
	first := recs[0]
	resendCopy(t, w.Brokers, first) // the relay's late duplicate
	require.NoError(t, w.WaitConsumed(ctx, time.Minute))
	time.Sleep(2 * time.Second)

	require.NoError(t, w.ApplyRetention()) // the first copy goes, the late one stays
	_, err = w.Cleanup(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Rewind(ctx))
	require.NoError(t, w.WaitConsumed(ctx, time.Minute))
	requireVerdict(ctx, t, w)
}

// resendCopy produces m again, byte for byte (key, value, headers), as the
// relay does when it publishes a row whose earlier send was acknowledged
// but not recorded.
func resendCopy(t *testing.T, brokers []string, m *sarama.ConsumerMessage) {
	t.Helper()
	cfg := harness.KafkaConfig()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(brokers, cfg)
	require.NoError(t, err)
	defer p.Close()
	hs := make([]sarama.RecordHeader, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = *h
	}
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: m.Topic, Partition: m.Partition,
		Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value), Headers: hs})
	require.NoError(t, err)
}
