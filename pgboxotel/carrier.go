package pgboxotel

import (
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// The carriers below let an otel propagator read and write record headers.
// Kafka header names are case-sensitive and may repeat: Get returns the last
// value (as inbox.Message.Header and the Java client's lastHeader do), Set
// replaces every header of that name.

// outboxCarrier writes the trace context into a message's headers.
type outboxCarrier struct{ headers *[]outbox.Header }

func (c outboxCarrier) Get(key string) string {
	hs := *c.headers
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return string(hs[i].Value)
		}
	}
	return ""
}

func (c outboxCarrier) Set(key, value string) {
	hs := (*c.headers)[:0:0] // a new array: never write into the caller's
	for _, h := range *c.headers {
		if h.Key != key {
			hs = append(hs, h)
		}
	}
	*c.headers = append(hs, outbox.Header{Key: key, Value: []byte(value)})
}

func (c outboxCarrier) Keys() []string {
	keys := make([]string, len(*c.headers))
	for i, h := range *c.headers {
		keys[i] = h.Key
	}
	return keys
}

// inboxCarrier reads the trace context from a consumed message. Set is a
// no-op: the message is not changed.
type inboxCarrier inbox.Message

func (c inboxCarrier) Get(key string) string {
	v, _ := inbox.Message(c).Header(key)
	return string(v)
}

func (inboxCarrier) Set(string, string) {}

func (c inboxCarrier) Keys() []string {
	keys := make([]string, len(c.Headers))
	for i, h := range c.Headers {
		keys[i] = h.Key
	}
	return keys
}
