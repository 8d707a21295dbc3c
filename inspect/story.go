package inspect

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
)

// StoryLimitDefault is how many rows of each kind ReadStory returns when
// StoryQuery.Limit is zero.
const StoryLimitDefault = 100

// ErrRowNotFound is returned (wrapped, naming the id) by ReadOutboxRow and
// ReadDeadRecord when no row has the id (published, discarded or pruned
// meanwhile).
var ErrRowNotFound = errors.New("no such row")

// StoryQuery names what ReadStory looks for: a message key on a topic, an
// event id, or both.
type StoryQuery struct {
	// Topic and Key select the outbox rows written with this key to this
	// topic, the dead letters whose record had it, and the inbox keys equal
	// to it. Defaults to "" and nil: no key lookup (EventID only).
	Topic string
	Key   []byte
	// EventID (a pgbox-event-id, a UUID) selects the inbox keys equal to it
	// (consumers keyed by inbox.ByHeader on the event id) and a parked row
	// with it. Unparked rows have no event-id index: give the key to find
	// them. Defaults to "": none.
	EventID string
	// Limit bounds the rows of each kind. Defaults to StoryLimitDefault (100).
	Limit int
}

// OutboxRow is one outbox row with its payload.
type OutboxRow struct {
	ID        int64           `json:"id"`
	EventID   string          `json:"event_id"`
	Slot      int             `json:"slot"`
	Topic     string          `json:"topic"`
	Key       []byte          `json:"key"`
	Value     []byte          `json:"value"`
	Headers   []outbox.Header `json:"headers"`
	CreatedAt time.Time       `json:"created_at"`
	Attempts  int             `json:"attempts"`
	LastError string          `json:"last_error"`
	// ParkedAt is nil while the row waits for (or is in) publication.
	ParkedAt *time.Time `json:"parked_at"`
	// ReplayOf is the inbox.ReplayHeader value of a dead letter's replay.
	ReplayOf string `json:"replay_of,omitempty"`
}

// InboxKey is one consumer's record of one processed key.
type InboxKey struct {
	Consumer   string     `json:"consumer"`
	Key        string     `json:"key"`
	Topic      string     `json:"topic"`
	Partition  int32      `json:"partition"`
	Offset     int64      `json:"offset"`
	ReceivedAt time.Time  `json:"received_at"`
	RecordAt   *time.Time `json:"record_at"`
}

// DeadRecord is a dead letter with the record stored for its replay.
type DeadRecord struct {
	DeadLetter
	RecordKey     []byte          `json:"record_key"`
	RecordValue   []byte          `json:"record_value"`
	RecordHeaders []outbox.Header `json:"record_headers"`
}

// Story is every pgbox row that mentions one key or event id.
type Story struct {
	// Outbox are the unpublished and parked rows (published rows are gone
	// from the outbox), replays of dead letters included (ReplayOf set).
	Outbox []OutboxRow `json:"outbox"`
	// Inbox are the consumers' keys: the key itself, the event ids of the
	// outbox rows found, the dead letters' inbox keys and their replays'
	// keys (key + inbox.ReplayKeySuffix + replay id).
	Inbox []InboxKey `json:"inbox"`
	// Dead are the dead letters of the key, with their replays.
	Dead []DeadLetter `json:"dead_letters"`
}

// ReadStory returns every row of pgbox that mentions q's key or event id.
// Each lookup follows an index (outbox slot and parked indexes, the inbox's
// primary key once per consumer), except the dead letters', a table that
// stays small.
func ReadStory(ctx context.Context, db Querier, q StoryQuery) (*Story, error) {
	if q.Limit < 0 {
		return nil, fmt.Errorf("inspect: story Limit %d is negative (use a positive count, or 0 for %d)", q.Limit, StoryLimitDefault)
	}
	if q.Key != nil && q.Topic == "" {
		return nil, errors.New("inspect: story of a key needs its topic")
	}
	if q.Key == nil && q.EventID == "" {
		return nil, errors.New("inspect: story needs a topic and key, or an event id")
	}
	limit := cmp.Or(q.Limit, StoryLimitDefault)
	st := &Story{}
	if err := st.readOutbox(ctx, db, q, limit); err != nil {
		return nil, err
	}
	keys := st.inboxKeys(q)
	if err := st.readDead(ctx, db, q, keys, limit); err != nil {
		return nil, err
	}
	keys = append(keys, st.replayKeys()...)
	rows, err := db.Query(ctx, sqlStoryInbox, slices.Compact(slices.Sorted(slices.Values(keys))))
	if err != nil {
		return nil, fmt.Errorf("inspect: story: read inbox keys: %w", schemaHint(err))
	}
	st.Inbox, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxKey, error) {
		var k InboxKey
		err := r.Scan(&k.Consumer, &k.Key, &k.Topic, &k.Partition, &k.Offset, &k.ReceivedAt, &k.RecordAt)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: story: read inbox keys: %w", schemaHint(err))
	}
	return st, nil
}

func (st *Story) readOutbox(ctx context.Context, db Querier, q StoryQuery, limit int) error {
	if q.Key != nil {
		rows, err := db.Query(ctx, sqlStoryOutbox, slot.Of(q.Key, outbox.EventID{}), q.Topic, q.Key, limit)
		if err != nil {
			return fmt.Errorf("inspect: story of key %q on topic %q: read outbox: %w", q.Key, q.Topic, schemaHint(err))
		}
		if st.Outbox, err = pgx.CollectRows(rows, scanOutboxRow); err != nil {
			return fmt.Errorf("inspect: story of key %q on topic %q: read outbox: %w", q.Key, q.Topic, schemaHint(err))
		}
	}
	if q.EventID == "" || slices.ContainsFunc(st.Outbox, func(r OutboxRow) bool { return r.EventID == q.EventID }) {
		return nil
	}
	rows, err := db.Query(ctx, sqlStoryOutboxParkedEvent, q.EventID)
	if err != nil {
		return fmt.Errorf("inspect: story of event %q: read outbox: %w", q.EventID, schemaHint(err))
	}
	more, err := pgx.CollectRows(rows, scanOutboxRow)
	if err != nil {
		return fmt.Errorf("inspect: story of event %q: read outbox: %w", q.EventID, schemaHint(err))
	}
	st.Outbox = append(st.Outbox, more...)
	return nil
}

// inboxKeys are the inbox keys the story's rows can have been recorded under.
func (st *Story) inboxKeys(q StoryQuery) []string {
	keys := []string{}
	if q.Key != nil {
		keys = append(keys, string(q.Key))
	}
	if q.EventID != "" {
		keys = append(keys, q.EventID)
	}
	for _, r := range st.Outbox {
		keys = append(keys, r.EventID)
	}
	return keys
}

func (st *Story) readDead(ctx context.Context, db Querier, q StoryQuery, keys []string, limit int) error {
	rows, err := db.Query(ctx, sqlStoryDead, q.Topic, q.Key, keys, limit)
	if err != nil {
		return fmt.Errorf("inspect: story: read dead letters: %w", schemaHint(err))
	}
	st.Dead, err = pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return fmt.Errorf("inspect: story: read dead letters: %w", schemaHint(err))
	}
	return nil
}

// replayKeys are the inbox keys of the dead letters' replays: the n-th
// replay of dead letter id is keyed key + "/replay/" + id (+ ".n" from the
// second on), as inspect.ReplayDead and the inbox make them.
func (st *Story) replayKeys() []string {
	var keys []string
	for _, d := range st.Dead {
		if d.Key == nil {
			continue
		}
		keys = append(keys, *d.Key)
		for n := 1; n <= d.Replays; n++ {
			tag := strconv.FormatInt(d.ID, 10)
			if n > 1 {
				tag += "." + strconv.Itoa(n)
			}
			keys = append(keys, *d.Key+inbox.ReplayKeySuffix+tag)
		}
	}
	return keys
}

func scanOutboxRow(r pgx.CollectableRow) (OutboxRow, error) {
	var o OutboxRow
	var hs []byte
	if err := r.Scan(&o.ID, &o.EventID, &o.Slot, &o.Topic, &o.Key, &o.Value, &hs, &o.CreatedAt, &o.Attempts, &o.LastError, &o.ParkedAt); err != nil {
		return o, err
	}
	if hs != nil {
		if err := json.Unmarshal(hs, &o.Headers); err != nil {
			return o, fmt.Errorf("outbox row %d: decode headers: %w", o.ID, err)
		}
	}
	for _, h := range o.Headers {
		if h.Key == inbox.ReplayHeader {
			o.ReplayOf = string(h.Value)
		}
	}
	return o, nil
}

func scanDeadLetter(r pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	err := r.Scan(&d.ID, &d.Consumer, &d.Topic, &d.TopicID, &d.Partition, &d.Offset, &d.Key, &d.Attempts, &d.Error,
		&d.DLQTopic, &d.DeadAt, &d.Replayable, &d.Replays, &d.ReplayedAt, &d.ReplayedTo)
	return d, err
}

// ReadOutboxRow reads one outbox row (unpublished or parked) with its key,
// value and headers.
func ReadOutboxRow(ctx context.Context, db Querier, id int64) (*OutboxRow, error) {
	rows, err := db.Query(ctx, sqlOutboxRow, id)
	if err != nil {
		return nil, fmt.Errorf("inspect: read outbox row %d: %w", id, schemaHint(err))
	}
	row, err := pgx.CollectExactlyOneRow(rows, scanOutboxRow)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("inspect: outbox row %d: %w", id, ErrRowNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: read outbox row %d: %w", id, schemaHint(err))
	}
	return &row, nil
}

// ReadDeadRecord reads one dead letter with its stored record.
func ReadDeadRecord(ctx context.Context, db Querier, id int64) (*DeadRecord, error) {
	var d DeadRecord
	var hs []byte
	err := db.QueryRow(ctx, sqlDeadRecord, id).Scan(&d.ID, &d.Consumer, &d.Topic, &d.TopicID, &d.Partition, &d.Offset, &d.Key,
		&d.Attempts, &d.Error, &d.DLQTopic, &d.DeadAt, &d.Replayable, &d.Replays, &d.ReplayedAt, &d.ReplayedTo,
		&d.RecordKey, &d.RecordValue, &hs)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("inspect: dead letter %d: %w", id, ErrRowNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: read dead letter %d: %w", id, schemaHint(err))
	}
	if hs != nil {
		if err := json.Unmarshal(hs, &d.RecordHeaders); err != nil {
			return nil, fmt.Errorf("inspect: dead letter %d: decode stored headers: %w", id, err)
		}
	}
	return &d, nil
}
