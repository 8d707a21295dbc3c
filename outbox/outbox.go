package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbox/pgbox/internal/pgxsql"
	"github.com/pgbox/pgbox/internal/slot"
)

// Header is one Kafka record header. The JSON tags are the storage format of
// the outbox's headers column: [{"k": name, "v": base64 value}].
type Header struct {
	Key   string `json:"k"`
	Value []byte `json:"v"`
}

// Message is one event to publish. A nil Key publishes a record without a key
// (no ordering); a nil Value publishes a tombstone.
type Message struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers []Header
}

// Defaults of Config.
const (
	// MaxBytesDefault is Config.MaxBytes' default and the relay's producer
	// limit: 1048588, a default-configured broker's message.max.bytes, so a
	// message Write accepts is one the relay can publish there.
	MaxBytesDefault = 1048588
	// ChannelDefault is the LISTEN/NOTIFY channel writers notify and the relay listens on.
	ChannelDefault = "pgbox_outbox"
	// maxTopicLen is Kafka's limit on topic names.
	maxTopicLen = 249
)

var (
	// ErrInvalidMessage is returned (wrapped, naming the message) when a
	// message breaks a rule; nothing was written.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrTooLarge is returned (wrapped in ErrInvalidMessage's error) when a
	// message's RecordSize exceeds Config.MaxBytes.
	ErrTooLarge = errors.New("message too large")
	// ErrNilTx is returned when Write is given a nil transaction.
	ErrNilTx = errors.New("outbox: nil transaction (pass the pgx.Tx of the business transaction the events belong to)")
	// ErrUnsupportedTx is returned (wrapped, saying which) when WriteSQL is
	// given a *sql.Tx it cannot write through: one from a driver other than
	// pgx's stdlib (or behind a wrapper that does not pass arguments
	// through), one already committed or rolled back, or one whose
	// connection is not in a transaction. Nothing was written. It is the
	// same value as inbox.ErrUnsupportedTx.
	ErrUnsupportedTx = pgxsql.ErrUnsupportedTx
)

// Execer is the part of pgx.Tx that Write needs. Pass the caller's pgx.Tx so
// the rows commit or roll back with the business write; a pool or connection
// also satisfies it, but then the rows commit on their own.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config tunes a Writer. The zero value is valid.
type Config struct {
	// MaxBytes bounds a message's RecordSize: what it takes on the wire as a
	// Kafka record batch of its own, pgbox's headers and overhead included.
	// Larger messages are rejected by Write (the broker would reject them
	// anyway, after the business transaction committed). Keep it equal to the
	// relay's relay.Config.MaxMessageBytes (binary: --kafka-max-message-bytes)
	// and at most the brokers' message.max.bytes. Defaults to MaxBytesDefault
	// (1048588, Kafka's default message.max.bytes).
	MaxBytes int
	// Notify makes Write wake a sleeping relay: while some live relay
	// instance has found no rows for a while and waits for a notification,
	// Write sends a NOTIFY on Channel, delivered when the caller commits, so
	// the relay publishes at once instead of at its next poll (PollInterval,
	// 1 s). The payload lists the slots written, so the relay looks only
	// there. While every relay is awake (traffic in the last two seconds)
	// they watch the table themselves and Write sends nothing: commits of
	// notifying transactions serialize on a cluster-wide lock, so writers
	// pay for a notification only when traffic resumes after a pause. The
	// check costs Write nothing measurable (a lookup in the tiny
	// pgbox_relay_instances table, in the same statement). Defaults to false.
	Notify bool
	// Channel is the NOTIFY channel. Defaults to ChannelDefault ("pgbox_outbox").
	Channel string
}

// Writer writes outbox rows with a fixed Config.
type Writer struct {
	cfg    Config
	insert string
}

// NewWriter validates cfg and returns a Writer.
func NewWriter(cfg Config) (*Writer, error) {
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("outbox: Config.MaxBytes is %d: use a positive size in bytes, or 0 for the default %d", cfg.MaxBytes, MaxBytesDefault)
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = MaxBytesDefault
	}
	if cfg.Channel == "" {
		cfg.Channel = ChannelDefault
	}
	if strings.TrimSpace(cfg.Channel) == "" {
		return nil, errors.New("outbox: Config.Channel is blank: leave it empty for ChannelDefault, or name the relays' channel (relay.Config.Channel)")
	}
	if len(cfg.Channel) > 63 {
		return nil, fmt.Errorf("outbox: Config.Channel %q is longer than PostgreSQL's 63-byte identifier limit", cfg.Channel)
	}
	w := &Writer{cfg: cfg, insert: insertSQL}
	if cfg.Notify {
		w.insert = "WITH ins AS (" + insertSQL + ") SELECT pg_notify($7, coalesce(current_schema(), '') || ':' || $8) WHERE EXISTS (" + sleepingSQL + ")"
	}
	return w, nil
}

var defaultWriter, _ = NewWriter(Config{})

// Write inserts msgs into the outbox with the default Config (MaxBytesDefault,
// no NOTIFY), inside tx. See Writer.Write.
func Write(ctx context.Context, tx Execer, msgs ...Message) error {
	return defaultWriter.Write(ctx, tx, msgs...)
}

// insertSQL inserts every message in one round trip: one array per column.
//
// It is a plain INSERT: the relay's floor needs every writer's transaction
// to take its transaction id before its rows take ids, and the outbox's
// statement trigger does that for every writer, this one included (see
// docs/relay.md, "The floor", and migration 00120).
const insertSQL = `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, headers)
SELECT * FROM unnest($1::uuid[], $2::smallint[], $3::text[], $4::bytea[], $5::bytea[], $6::jsonb[])`

// sleepingSQL finds a live relay instance waiting for a notification (see
// Config.Notify). The INSERT in the WITH clause runs whether or not the
// notification does.
const sleepingSQL = `SELECT 1 FROM pgbox_relay_instances WHERE sleeping AND expires_at > now()`

// Write validates every message, then inserts them all in one statement inside
// tx, each with a fresh event id. If any message is invalid it returns an
// error wrapping ErrInvalidMessage that names the message (index, topic,
// key), writes nothing, and leaves tx usable. The rows become visible to the
// relay when tx commits; if tx rolls back, they never existed.
func (w *Writer) Write(ctx context.Context, tx Execer, msgs ...Message) error {
	if tx == nil {
		return ErrNilTx
	}
	args, err := w.args(msgs)
	if err != nil || args == nil {
		return err
	}
	if _, err := tx.Exec(ctx, w.insert, args...); err != nil {
		return insertErr(msgs, err)
	}
	return nil
}

// WriteSQL is Write inside a database/sql transaction opened on pgx's stdlib
// driver (sql.Open("pgx", …), stdlib.OpenDB; GORM's postgres driver; bun or
// sqlc on such a *sql.DB). The statement, its encoding and its errors are
// Write's: pgx's connection under tx sends it, in one round trip. A tx from
// another driver, already committed or rolled back, or whose connection is
// not in a transaction, is refused with an error wrapping ErrUnsupportedTx
// before anything is sent. See docs/relay.md.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) error {
	if tx == nil {
		return ErrNilTx
	}
	args, err := w.args(msgs)
	if err != nil || args == nil {
		return err
	}
	err = pgxsql.Run(ctx, tx, func(*pgx.Conn) (string, []any, error) { return w.insert, args, nil })
	switch {
	case errors.Is(err, ErrUnsupportedTx):
		return fmt.Errorf("outbox: %w", err)
	case err != nil:
		return insertErr(msgs, err)
	}
	return nil
}

// WriteSQL is Writer.WriteSQL with the default Config.
func WriteSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) error {
	return defaultWriter.WriteSQL(ctx, tx, msgs...)
}

func insertErr(msgs []Message, err error) error {
	return fmt.Errorf("outbox: insert %d message(s), first to topic %q: %w", len(msgs), msgs[0].Topic, err)
}

// args validates msgs and returns the insert's arguments, nil for no
// messages.
func (w *Writer) args(msgs []Message) ([]any, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	for i := range msgs {
		if err := w.validate(&msgs[i]); err != nil {
			return nil, fmt.Errorf("%w: message %d (topic %q, key %s): %w", ErrInvalidMessage, i, msgs[i].Topic, showKey(msgs[i].Key), err)
		}
	}
	eventIDs := make([]EventID, len(msgs))
	ids.fill(eventIDs)
	var (
		uuids   = make([]pgtype.UUID, len(msgs)) // typed, so pgx's exec and simple_protocol modes (pgbouncer) can encode it
		slots   = make([]int16, len(msgs))
		topics  = make([]string, len(msgs))
		keys    = make([][]byte, len(msgs))
		values  = make([][]byte, len(msgs))
		headers = make([]*string, len(msgs))
	)
	for i, m := range msgs {
		uuids[i] = pgtype.UUID{Bytes: eventIDs[i], Valid: true}
		slots[i] = int16(slot.Of(m.Key, eventIDs[i]))
		topics[i] = m.Topic
		keys[i] = m.Key
		values[i] = m.Value
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil { // cannot happen for valid headers
				return nil, fmt.Errorf("outbox: message %d (topic %q): encode headers: %w", i, m.Topic, err)
			}
			s := string(b)
			headers[i] = &s
		}
	}
	args := []any{uuids, slots, topics, keys, values, headers}
	if w.cfg.Notify {
		args = append(args, w.cfg.Channel, slotList(slots))
	}
	return args, nil
}

// slotList is the notification payload: the distinct slots written, sorted
// and comma-separated ("3,17,200"), so the relay probes just those. Equal
// payloads within one transaction fold into one notification.
func slotList(slots []int16) string {
	var seen [slot.Count]bool
	for _, s := range slots {
		seen[s] = true
	}
	b := make([]byte, 0, 4*len(slots))
	for s, ok := range seen {
		if ok {
			if len(b) > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(s), 10)
		}
	}
	return string(b)
}

func (w *Writer) validate(m *Message) error {
	if err := ValidateTopic(m.Topic); err != nil {
		return err
	}
	for j, h := range m.Headers {
		if !utf8.ValidString(h.Key) { // Kafka header keys are strings
			return fmt.Errorf("header %d key %q is not valid UTF-8", j, h.Key)
		}
		if Reserved(h.Key) {
			return fmt.Errorf("header %d is named %q, which the relay sets on every record (it would replace yours): "+
				"rename your header, or drop it when forwarding a consumed record (outbox.WithoutReserved)", j, h.Key)
		}
	}
	if size := RecordSize(*m); size > w.cfg.MaxBytes {
		return fmt.Errorf("%w: record size %d bytes (outbox.RecordSize: key, value, headers, pgbox's own headers and Kafka's record overhead) exceeds the limit of %d bytes; "+
			"to send larger messages raise outbox.Config.MaxBytes, the relay's limit (relay.Config.MaxMessageBytes, --kafka-max-message-bytes / PGBOX_KAFKA_MAX_MESSAGE_BYTES) "+
			"and the brokers' message.max.bytes together", ErrTooLarge, size, w.cfg.MaxBytes)
	}
	return nil
}

// ValidateTopic applies Kafka's topic-name rules: 1 to 249 characters from
// [a-zA-Z0-9._-], and not "." or "..".
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return errors.New("empty topic")
	case len(topic) > maxTopicLen:
		return fmt.Errorf("topic is %d characters long, Kafka allows at most %d", len(topic), maxTopicLen)
	case topic == "." || topic == "..":
		return fmt.Errorf("topic %q is not allowed by Kafka", topic)
	}
	for i := 0; i < len(topic); i++ {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic has character %q at byte %d; Kafka allows only [a-zA-Z0-9._-]", rune(c), i)
		}
	}
	return nil
}

// showKey renders a key for error messages: quoted, truncated to 64 bytes.
func showKey(k []byte) string {
	if k == nil {
		return "<nil>"
	}
	if len(k) > 64 {
		return fmt.Sprintf("%q…(%d bytes)", k[:64], len(k))
	}
	return fmt.Sprintf("%q", k)
}
