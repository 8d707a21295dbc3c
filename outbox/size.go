package outbox

import "encoding/binary"

// Header names the relay adds to every record (relay.EventIDHeader and
// relay.CreatedAtHeader are these). Write refuses a message that sets one
// (see Reserved).
const (
	// EventIDHeader carries the row's event id (a UUIDv7 string).
	EventIDHeader = "pgbox-event-id"
	// CreatedAtHeader carries the row's creation time, RFC 3339 with
	// nanoseconds, UTC.
	CreatedAtHeader = "pgbox-created-at"
)

// The sizes a record takes on the wire beyond its key, value and headers, as
// sarama (ProducerMessage.ByteSize, produceSet) and the broker (the produced
// record batch against message.max.bytes) count them.
const (
	// RecordBatchOverhead is a record batch's fixed header (v2 format): the
	// broker counts it against message.max.bytes.
	RecordBatchOverhead = 49
	// recordOverhead is sarama's bound on one record's framing: length,
	// offset delta, key and value lengths and header count as varint32s, the
	// timestamp delta as a varint64, and the attributes byte.
	recordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1
	// headerOverhead bounds one header's key and value length varints.
	headerOverhead = 2 * binary.MaxVarintLen32
	// relayHeadersSize is what the relay's own headers add: an event id (a
	// 36-character UUID) and a creation time (RFC 3339 with nanoseconds, UTC:
	// at most 30 characters).
	relayHeadersSize = len(EventIDHeader) + 36 + headerOverhead +
		len(CreatedAtHeader) + len("2006-01-02T15:04:05.999999999Z") + headerOverhead
)

// RecordSize is the one size rule: the bytes m takes when the relay sends it
// as a record batch of its own (uncompressed), counting its key, value and
// headers, the headers the relay adds and the record and batch overhead. It
// never undercounts what sarama checks against Producer.MaxMessageBytes or
// what a broker checks against message.max.bytes. Write rejects a message
// whose RecordSize exceeds Config.MaxBytes.
func RecordSize(m Message) int {
	size := RecordBatchOverhead + recordOverhead + len(m.Key) + len(m.Value) + relayHeadersSize
	for _, h := range m.Headers {
		size += len(h.Key) + len(h.Value) + headerOverhead
	}
	return size
}

// Reserved reports whether name is a header the relay sets on every record it
// publishes (EventIDHeader, CreatedAtHeader). Write refuses a message with
// such a header: the relay would replace it, silently. Code that forwards a
// consumed record's headers (a dead letter, a replay) drops these with
// WithoutReserved; the new record gets its own.
func Reserved(name string) bool { return name == EventIDHeader || name == CreatedAtHeader }

// WithoutReserved returns hs without the headers Reserved names, in a new
// slice (hs is not changed).
func WithoutReserved(hs []Header) []Header {
	out := make([]Header, 0, len(hs))
	for _, h := range hs {
		if !Reserved(h.Key) {
			out = append(out, h)
		}
	}
	return out
}
