package inboxsarama_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/outbox"
)

func TestMessage(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	m := inboxsarama.Message(&sarama.ConsumerMessage{
		Topic: "orders", Partition: 2, Offset: 99, Key: []byte("k"), Value: []byte("v"), Timestamp: ts,
		Headers: []*sarama.RecordHeader{{Key: []byte("event-id"), Value: []byte("evt-9")}, nil},
	})
	require.Equal(t, inbox.Message{Topic: "orders", Partition: 2, Offset: 99, Key: []byte("k"), Value: []byte("v"),
		Timestamp: ts, Headers: []outbox.Header{{Key: "event-id", Value: []byte("evt-9")}}}, m)
	require.Equal(t, inbox.Message{}, inboxsarama.Message(nil))
}
