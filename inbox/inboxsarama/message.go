package inboxsarama

import (
	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// Message converts a record consumed with sarama into the inbox's view of
// it. TopicID is left empty: sarama's ConsumerMessage does not carry it (the
// Handler sets it from Config.Client).
func Message(m *sarama.ConsumerMessage) inbox.Message {
	if m == nil {
		return inbox.Message{}
	}
	var hs []outbox.Header
	if len(m.Headers) > 0 {
		hs = make([]outbox.Header, 0, len(m.Headers))
		for _, h := range m.Headers {
			if h == nil {
				continue
			}
			hs = append(hs, outbox.Header{Key: string(h.Key), Value: h.Value})
		}
	}
	return inbox.Message{
		Topic:     m.Topic,
		Partition: m.Partition,
		Offset:    m.Offset,
		Key:       m.Key,
		Value:     m.Value,
		Headers:   hs,
		Timestamp: m.Timestamp,
	}
}
