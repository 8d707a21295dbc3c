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
	"github.com/pgbox/pgbox/outbox"
)

// ErrDeadNotFound is returned (wrapped, naming the ids) when ReplayDead is
// given an id no dead letter has; nothing was replayed.
var ErrDeadNotFound = errors.New("no such dead letter")

// ErrReplaysChanged is returned (wrapped, naming the ids) when
// ReplayConfig.Replays does not match a dead letter's replay count when
// ReplayDead has locked it: another replay ran since the caller looked.
// Nothing was replayed.
var ErrReplaysChanged = errors.New("dead letter replay count changed")

// ErrNotReplayable is returned (wrapped, naming the id) when a dead letter
// was recorded before migration 00040 and has no stored record to replay;
// its payload is in the dead-letter topic. Nothing was replayed.
var ErrNotReplayable = errors.New("dead letter has no stored record (dead-lettered before migration 00040): resend it from its dead-letter topic")

// DeadFilter selects dead letters (pgbox_consumer_dead). The zero filter is
// every dead letter.
type DeadFilter struct {
	// Consumer keeps dead letters of this consumer (inbox.Config.Consumer)
	// only. Defaults to "": any consumer.
	Consumer string
	// Topic keeps dead letters consumed from this topic only (an unknown
	// topic selects nothing). Defaults to "": any topic.
	Topic string
	// OlderThan keeps dead letters recorded at least this long ago.
	// Defaults to 0: any age.
	OlderThan time.Duration
	// IDs keeps these dead letters only. Defaults to nil: any id.
	IDs []int64
	// Key keeps dead letters whose inbox key or record key is this.
	// Defaults to "": any key.
	Key string
	// ErrorContains keeps dead letters whose error contains this text
	// (case sensitive). Defaults to "": any error.
	ErrorContains string
	// Limit is how many dead letters ListDead returns. Defaults to
	// [ListLimitDefault] (100).
	Limit int
}

func (f DeadFilter) validate(db Querier) error {
	var errs []error
	if db == nil {
		errs = append(errs, errNilDB)
	}
	if f.OlderThan < 0 {
		errs = append(errs, fmt.Errorf("inspect: OlderThan %v is negative (use a positive age, or 0 for any age)", f.OlderThan))
	}
	if f.Limit < 0 {
		errs = append(errs, fmt.Errorf("inspect: Limit %d is negative (use a positive count, or 0 for %d)", f.Limit, ListLimitDefault))
	}
	errs = append(errs, checkIDs(f.IDs))
	return errors.Join(errs...)
}

// DeadLetter is one dead-lettered consumer message.
type DeadLetter struct {
	ID        int64     `json:"id"`
	Consumer  string    `json:"consumer"`
	Topic     string    `json:"topic"`
	TopicID   string    `json:"topic_id,omitempty"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Key       *string   `json:"inbox_key"` // nil: the record had no usable key
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"`
	DLQTopic  string    `json:"dlq_topic"`
	DeadAt    time.Time `json:"dead_at"`
	// Replayable is false for dead letters recorded before migration 00040.
	Replayable bool       `json:"replayable"`
	Replays    int        `json:"replays"`
	ReplayedAt *time.Time `json:"replayed_at"`
	ReplayedTo string     `json:"replayed_to,omitempty"`
}

// ListDead returns the dead letters f selects (every condition of f before
// the limit), in id order, at most f.Limit.
func ListDead(ctx context.Context, db Querier, f DeadFilter) ([]DeadLetter, error) {
	if err := f.validate(db); err != nil {
		return nil, err
	}
	at, err := cutoff(ctx, db, f.OlderThan)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sqlDeadList, f.Consumer, f.Topic, at, nonNil(f.IDs), f.Key, f.ErrorContains, cmp.Or(f.Limit, ListLimitDefault))
	if err != nil {
		return nil, fmt.Errorf("inspect: list dead letters: %w", schemaHint(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.Consumer, &d.Topic, &d.TopicID, &d.Partition, &d.Offset, &d.Key, &d.Attempts, &d.Error,
			&d.DLQTopic, &d.DeadAt, &d.Replayable, &d.Replays, &d.ReplayedAt, &d.ReplayedTo)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: list dead letters: %w", schemaHint(err))
	}
	return list, nil
}

// ReplayConfig configures ReplayDead.
type ReplayConfig struct {
	// ToTopic is the topic the replays are written to. Defaults to "": each
	// dead letter's own source topic.
	ToTopic string
	// Again replays dead letters that were replayed before, as a new replay
	// with a new replay id (so the inbox processes it once more). Defaults
	// to false: a dead letter already replayed is skipped.
	Again bool
	// Replays, when set, is the replay count each dead letter must still
	// have once ReplayDead has locked it (what an operator confirmed): if
	// any differs (another replay ran meanwhile; Again would replay it a
	// second time), the call fails with ErrReplaysChanged and writes
	// nothing. Ids it lacks are not checked. Defaults to nil: no check.
	Replays map[int64]int
}

// Replay is what ReplayDead did with one dead letter.
type Replay struct {
	ID int64 `json:"id"`
	// Topic is where the replay was written ("" when skipped).
	Topic string `json:"topic,omitempty"`
	// ReplayOf is the replay's inbox.ReplayHeader value: the dead letter's
	// id, with ".n" for the n-th replay forced by Again.
	ReplayOf string `json:"replay_of,omitempty"`
	// Skipped is set when the dead letter had been replayed before (and
	// Again was not set): nothing was written for it.
	Skipped bool `json:"skipped"`
}

// ReplayDead writes: it replays the dead letters ids name, in one
// transaction on db: each one's record (key, value and headers as consumed) is written through
// outbox.Write, with the header inbox.ReplayHeader set to its replay id, to
// cfg.ToTopic or its source topic, and the dead letter is marked replayed.
// Running relays then publish the replays; the consumer's inbox processes
// each one under a key of its own (see package inbox, "Replayed dead
// letters"), while the original record's key still dedupes a rewind.
//
// It is idempotent: a dead letter replayed before is skipped unless
// cfg.Again is set, and two concurrent replays of one dead letter
// serialize on its row (the second skips it). An unknown id
// (ErrDeadNotFound), a dead letter without a stored record
// (ErrNotReplayable) or a record outbox.Write refuses fails the whole call
// with an error naming it; nothing is written.
func ReplayDead(ctx context.Context, db DB, ids []int64, cfg ReplayConfig) ([]Replay, error) {
	if db == nil {
		return nil, errNilDB
	}
	if len(ids) == 0 {
		return nil, errors.New("inspect: no dead letter ids to replay")
	}
	if err := checkIDs(ids); err != nil {
		return nil, err
	}
	if cfg.ToTopic != "" {
		if err := outbox.ValidateTopic(cfg.ToTopic); err != nil {
			return nil, fmt.Errorf("inspect: replay topic %q: %w", cfg.ToTopic, err)
		}
	}
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("inspect: begin: %w (%w)", err, ErrNoConnection)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	out, err := replayTx(ctx, tx, ids, cfg)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("inspect: commit replay of dead letters %v: %w", ids, err)
	}
	return out, nil
}

// deadRecord is a locked dead letter and its stored record.
type deadRecord struct {
	id      int64
	topic   string
	stored  bool
	key     []byte
	value   []byte
	headers []byte
	replays int
}

func replayTx(ctx context.Context, tx pgx.Tx, ids []int64, cfg ReplayConfig) ([]Replay, error) {
	recs, err := lockDead(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	var changed []int64
	for _, d := range recs {
		if want, ok := cfg.Replays[d.id]; ok && want != d.replays {
			changed = append(changed, d.id)
		}
	}
	if changed != nil {
		return nil, fmt.Errorf("inspect: dead letter id(s) %v: %w", changed, ErrReplaysChanged)
	}
	var (
		out     []Replay
		msgs    []outbox.Message
		written []int64
		topics  []string
	)
	for _, d := range recs {
		if d.replays > 0 && !cfg.Again {
			out = append(out, Replay{ID: d.id, Skipped: true})
			continue
		}
		m, tag, err := d.message(cfg.ToTopic)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
		written, topics = append(written, d.id), append(topics, m.Topic)
		out = append(out, Replay{ID: d.id, Topic: m.Topic, ReplayOf: tag})
	}
	if len(msgs) == 0 {
		return out, nil
	}
	if err := outbox.Write(ctx, tx, msgs...); err != nil {
		return nil, fmt.Errorf("inspect: write replays of dead letters %v: %w", written, err)
	}
	if _, err := tx.Exec(ctx, sqlDeadMarkReplayed, written, topics); err != nil {
		return nil, fmt.Errorf("inspect: mark dead letters %v replayed: %w", written, err)
	}
	return out, nil
}

func lockDead(ctx context.Context, tx pgx.Tx, ids []int64) ([]deadRecord, error) {
	rows, err := tx.Query(ctx, sqlDeadLock, ids)
	if err != nil {
		return nil, fmt.Errorf("inspect: read dead letters %v: %w", ids, schemaHint(err))
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadRecord, error) {
		var d deadRecord
		err := r.Scan(&d.id, &d.topic, &d.stored, &d.key, &d.value, &d.headers, &d.replays)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: read dead letters %v: %w", ids, schemaHint(err))
	}
	if len(recs) < len(ids) {
		var missing []int64
		for _, id := range ids {
			if !slices.ContainsFunc(recs, func(d deadRecord) bool { return d.id == id }) {
				missing = append(missing, id)
			}
		}
		return nil, fmt.Errorf("inspect: dead letter id(s) %v: %w", missing, ErrDeadNotFound)
	}
	return recs, nil
}

// message builds d's replay: its record, to topic (or d's source topic), its
// headers with any earlier replay header replaced by this replay's id.
func (d deadRecord) message(topic string) (outbox.Message, string, error) {
	if !d.stored {
		return outbox.Message{}, "", fmt.Errorf("inspect: dead letter %d: %w", d.id, ErrNotReplayable)
	}
	var hs []outbox.Header
	if d.headers != nil {
		if err := json.Unmarshal(d.headers, &hs); err != nil {
			return outbox.Message{}, "", fmt.Errorf("inspect: dead letter %d: decode stored headers: %w", d.id, err)
		}
	}
	tag := strconv.FormatInt(d.id, 10)
	if d.replays > 0 {
		tag += "." + strconv.Itoa(d.replays+1)
	}
	hs = slices.DeleteFunc(hs, func(h outbox.Header) bool { return h.Key == inbox.ReplayHeader || outbox.Reserved(h.Key) })
	hs = append(hs, outbox.Header{Key: inbox.ReplayHeader, Value: []byte(tag)})
	return outbox.Message{Topic: cmp.Or(topic, d.topic), Key: d.key, Value: d.value, Headers: hs}, tag, nil
}
