package inbox

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest dedup key accepted, in bytes. Longer keys are
// rejected with ErrInvalidMessage rather than truncated (truncation could make
// two different events collide). Hash long natural keys in a ByFunc strategy.
const MaxKeyLen = 512

// ReplayHeader marks a record as an operator's replay of a dead letter
// (inspect.ReplayDead writes it; its value is the replay's id, the
// pgbox_consumer_dead row id, with ".n" for the n-th forced replay). Whatever
// the KeyStrategy, the key of a message carrying it gets ReplayKeySuffix and
// the header's value appended: the replay has a key of its own, so it is
// processed once (its redeliveries are duplicates) while the original
// record's key, recorded when it was dead-lettered, still dedupes a rewind
// over the original. The last such header counts; an empty one is rejected.
const ReplayHeader = "pgbox-replay-of"

// ReplayKeySuffix separates a replayed message's key from its replay id:
// key + "/replay/" + id.
const ReplayKeySuffix = "/replay/"

// KeyStrategy derives the dedup key of a message. Build one with ByOffset,
// ByHeader or ByFunc; the zero value means "use the default" (ByOffset).
//
// Keys are namespaced by Config.Consumer, so two consumers (consumer groups)
// that see the same key both process it.
type KeyStrategy struct {
	name string
	fn   func(Message) (string, error)
	// err is why the strategy cannot be used (ByHeader("")): New refuses it.
	err error
}

// String names the strategy, e.g. `ByHeader("event-id")`.
func (s KeyStrategy) String() string {
	if s.fn == nil {
		return "ByOffset()"
	}
	return s.name
}

// ByOffset keys a message by its position in Kafka:
//
//	topic/partition/offset            e.g. "orders/3/1042"
//	topic@topicID/partition/offset    when Message.TopicID is set
//
// Kafka topic names cannot contain '/' or '@', so the format is unambiguous.
// It dedupes redeliveries of the same record (a crash before the offset
// commit, a rebalance, a replay), but not a producer that sent the same event
// twice: use ByHeader with a producer-assigned event id for that. Including
// the topic id guards against a topic deleted and recreated under the same
// name, whose offsets restart at 0.
func ByOffset() KeyStrategy {
	return KeyStrategy{name: "ByOffset()", fn: offsetKey}
}

func offsetKey(m Message) (string, error) {
	var b strings.Builder
	b.Grow(len(m.Topic) + len(m.TopicID) + 24)
	b.WriteString(m.Topic)
	if m.TopicID != "" {
		b.WriteByte('@')
		b.WriteString(m.TopicID)
	}
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(int64(m.Partition), 10))
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(m.Offset, 10))
	return b.String(), nil
}

// ByHeader keys a message by the value of the header called name (for
// example an event id the producer assigned, such as the one pgbox's relay
// writes). A message without the header, or with an empty value, is rejected
// with ErrInvalidMessage. When the header repeats, the last one wins. An
// empty name (often an unset variable) is refused by New: every message
// would fail.
func ByHeader(name string) KeyStrategy {
	if name == "" {
		return KeyStrategy{name: `ByHeader("")`, fn: func(Message) (string, error) { return "", errEmptyHeaderName },
			err: errEmptyHeaderName}
	}
	return KeyStrategy{
		name: "ByHeader(" + strconv.Quote(name) + ")",
		fn: func(m Message) (string, error) {
			v, ok := m.Header(name)
			if !ok {
				return "", fmt.Errorf("missing header %q", name)
			}
			if len(v) == 0 {
				return "", fmt.Errorf("header %q is empty", name)
			}
			return string(v), nil
		},
	}
}

var errEmptyHeaderName = errors.New(`inbox: Config.Key is ByHeader(""), an empty header name: ` +
	`name the header that carries the producer's event id, e.g. ByHeader("event-id") (an unset variable?)`)

// ByFunc keys a message with fn. An error from fn rejects the message with
// ErrInvalidMessage (wrapping fn's error too). The key must be non-empty,
// valid UTF-8 without NUL bytes, and at most MaxKeyLen bytes.
func ByFunc(fn func(Message) (string, error)) KeyStrategy {
	return KeyStrategy{name: "ByFunc", fn: fn}
}

// key validates m and derives its key. Every error wraps ErrInvalidMessage.
func (s KeyStrategy) key(m Message) (string, error) {
	if m.Topic == "" {
		return "", errors.New("empty topic")
	}
	if err := checkText(m.Topic); err != nil {
		return "", fmt.Errorf("topic: %w", err)
	}
	if m.Partition < 0 {
		return "", fmt.Errorf("negative partition %d", m.Partition)
	}
	if m.Offset < 0 {
		return "", fmt.Errorf("negative offset %d", m.Offset)
	}
	fn := s.fn
	if fn == nil {
		fn = offsetKey
	}
	k, err := fn(m)
	if err != nil {
		return "", err
	}
	if k == "" {
		return "", errors.New("empty key")
	}
	if id, ok := m.Header(ReplayHeader); ok {
		if len(id) == 0 {
			return "", fmt.Errorf("header %q is empty", ReplayHeader)
		}
		k += ReplayKeySuffix + string(id)
	}
	if len(k) > MaxKeyLen {
		return "", fmt.Errorf("key is %d bytes, longer than MaxKeyLen (%d): hash it in a ByFunc strategy", len(k), MaxKeyLen)
	}
	if err := checkText(k); err != nil {
		return "", fmt.Errorf("key %q: %w", k, err)
	}
	return k, nil
}

// checkText rejects what a PostgreSQL text column cannot hold; sending it would
// fail the statement and abort the caller's transaction.
func checkText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	if strings.IndexByte(s, 0) >= 0 {
		return errors.New("contains a NUL byte")
	}
	return nil
}
