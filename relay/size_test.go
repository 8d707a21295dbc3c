package relay_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// What outbox.Write accepts, a relay with default settings publishes to a
// broker with the default message.max.bytes (kfake's is Kafka's, 1048588):
// a message exactly at the limit, with headers of its own, is published, not
// parked.
func TestMessageAtWriteLimitIsPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("a")
	cfg.Kafka = nil // relay.NewKafkaConfig(), its defaults
	cfg.MaxAttempts = 1
	start(t, cfg)

	m := outbox.Message{Topic: b.topic, Key: []byte("at-limit"), Headers: []outbox.Header{{Key: "trace", Value: []byte("abc")}}}
	m.Value = []byte(strings.Repeat("x", outbox.MaxBytesDefault-outbox.RecordSize(m)))
	require.Equal(t, outbox.MaxBytesDefault, outbox.RecordSize(m))
	require.Equal(t, outbox.MaxBytesDefault, relay.MaxMessageBytesDefault)
	b.write(t, m)

	got := readTopic(t, b, b.topic, 1)
	require.Len(t, got, 1)
	require.Equal(t, len(m.Value), len(got[0].Value))
	waitFor(t, "row deleted after publish", func() bool { return b.outboxCount(t, "true") == 0 })
}

// A relay's producer limit below its MaxMessageBytes would park what the
// writers accept: New refuses it and names both settings.
func TestProducerLimitBelowMaxMessageBytesRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("a")
	cfg.Kafka = kafkaConfig()
	cfg.Kafka.Producer.MaxMessageBytes = 1000
	_, err := relay.New(cfg)
	require.ErrorContains(t, err, "Producer.MaxMessageBytes")
	require.ErrorContains(t, err, "Config.MaxMessageBytes")

	// An explicit NewKafkaConfig follows nothing: it carries the default.
	cfg.Kafka = relay.NewKafkaConfig()
	cfg.MaxMessageBytes = 2 * relay.MaxMessageBytesDefault
	_, err = relay.New(cfg)
	require.ErrorContains(t, err, "too small")
}
