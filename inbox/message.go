package inbox

import (
	"fmt"
	"time"

	"github.com/pgbox/pgbox/outbox"
)

// Message is the part of a Kafka record the inbox needs. Topic, Partition and
// Offset are stored with the key (cleanup prunes by topic); Value is
// fingerprinted; Timestamp is stored as the record's own time.
type Message struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	// Headers are the record's headers, in order; the same type outbox
	// writes, so a handler can pass them on.
	Headers []outbox.Header
	// Timestamp is the record's timestamp; the zero time stores NULL.
	Timestamp time.Time
	// TopicID is the topic's id from Kafka metadata (Kafka ≥ 2.8), optional.
	// When set, ByOffset keys include it, so that a topic deleted and
	// recreated under the same name does not collide with its old offsets.
	TopicID string
}

// Header returns the value of the last header named name (Kafka allows
// repeats; the last one wins, as in the Java client's lastHeader) and whether
// one was found. Names are case-sensitive.
func (m Message) Header(name string) ([]byte, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == name {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// String names the record as topic/partition@offset, for errors and logs.
func (m Message) String() string {
	return fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)
}
