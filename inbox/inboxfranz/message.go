package inboxfranz

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// Message converts a record consumed with franz-go into the inbox's view of
// it. TopicID is left empty (the Consumer sets it when Config.TopicIDs is
// on). The fields are those inboxsarama.Message fills, so a record keys the
// same way whichever client consumed it.
func Message(r *kgo.Record) inbox.Message {
	if r == nil {
		return inbox.Message{}
	}
	var hs []outbox.Header
	if len(r.Headers) > 0 {
		hs = make([]outbox.Header, 0, len(r.Headers))
		for _, h := range r.Headers {
			hs = append(hs, outbox.Header{Key: h.Key, Value: h.Value})
		}
	}
	return inbox.Message{
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Key:       r.Key,
		Value:     r.Value,
		Headers:   hs,
		Timestamp: r.Timestamp,
	}
}
