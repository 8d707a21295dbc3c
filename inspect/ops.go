package inspect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Defaults of the operator functions' filters.
const (
	// ListLimitDefault is how many rows ListParked and ListDead return when
	// the filter's Limit is zero.
	ListLimitDefault = 100
	// OpsBatchDefault is how many rows one RetryParked or DiscardParked
	// statement changes when the filter's BatchSize is zero.
	OpsBatchDefault = 500
	// HeldScanDefault is how many later rows of its slot a parked row's
	// Held count reads when ParkedFilter.HeldScan or Config.HeldScan is
	// zero.
	HeldScanDefault = 200
)

// Querier is what the operator functions run their statements on: a
// *pgxpool.Pool, *pgx.Conn or pgx.Tx satisfies it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ParkedFilter selects parked outbox rows (rows the relay gave up on after
// its MaxAttempts). Every field narrows the selection; the zero filter is
// every parked row.
type ParkedFilter struct {
	// Topic keeps rows of this topic only (exact name; an unknown topic
	// selects nothing). Defaults to "": any topic.
	Topic string
	// ErrorContains keeps rows whose last error contains this text (case
	// sensitive). Defaults to "": any error.
	ErrorContains string
	// OlderThan keeps rows parked at least this long ago, on the database's
	// clock. Defaults to 0: any age.
	OlderThan time.Duration
	// IDs keeps these rows only. Defaults to nil: any id.
	IDs []int64
	// Key keeps rows with this message key only (an empty, non-nil key
	// selects rows whose key is empty). Defaults to nil: any key.
	Key []byte
	// Limit is how many rows ListParked returns (RetryParked and
	// DiscardParked act on every matching row). Defaults to
	// ListLimitDefault (100).
	Limit int
	// BatchSize is how many rows one statement of RetryParked or
	// DiscardParked changes; each batch is its own short transaction.
	// Defaults to OpsBatchDefault (500).
	BatchSize int
	// HeldScan is how many of the later rows of its slot ListParked reads
	// to count the rows each listed row holds back (ParkedMessage.Held):
	// no index finds a key's unparked rows, so the count walks the slot,
	// and stops there (HeldCapped). Defaults to [HeldScanDefault] (200);
	// -1 counts nothing (Held is 0): what a caller that does not show Held
	// passes.
	HeldScan int
}

func (f ParkedFilter) validate(db Querier) error {
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
	if f.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("inspect: BatchSize %d is negative (use a positive count, or 0 for %d)", f.BatchSize, OpsBatchDefault))
	}
	errs = append(errs, checkHeldScan(f.HeldScan), checkIDs(f.IDs))
	return errors.Join(errs...)
}

func checkHeldScan(n int) error {
	if n < -1 {
		return fmt.Errorf("inspect: HeldScan %d is out of range (use a positive count, 0 for %d, or -1 to count nothing)", n, HeldScanDefault)
	}
	return nil
}

// heldScan is the scan parameter of heldBy: 0 reads nothing.
func heldScan(n int) int {
	if n < 0 {
		return 0
	}
	return cmp.Or(n, HeldScanDefault)
}

func checkIDs(ids []int64) error {
	for _, id := range ids {
		if id <= 0 {
			return fmt.Errorf("inspect: id %d is not a row id (ids are positive)", id)
		}
	}
	return nil
}

func (f ParkedFilter) limits() (limit, batch int) {
	return cmp.Or(f.Limit, ListLimitDefault), cmp.Or(f.BatchSize, OpsBatchDefault)
}

// ParkedMessage is one parked outbox row, as ListParked returns it.
type ParkedMessage struct {
	ID        int64     `json:"id"`
	EventID   string    `json:"event_id"`
	Topic     string    `json:"topic"`
	Key       []byte    `json:"key"` // nil: no key; base64 in JSON
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	CreatedAt time.Time `json:"created_at"`
	ParkedAt  time.Time `json:"parked_at"`
	// Held counts the rows this row holds back: later rows of its topic and
	// key, which the relay publishes only once it is retried (after it, in
	// order) or discarded. With HeldCapped it is a lower bound: the count
	// read ParkedFilter.HeldScan later rows of the row's slot and stopped.
	Held       int64 `json:"held"`
	HeldCapped bool  `json:"held_capped,omitempty"`
}

// cutoff reads the filter's minimum age as a time on the database's clock,
// once, so a long operation selects against one fixed time.
func cutoff(ctx context.Context, db Querier, olderThan time.Duration) (time.Time, error) {
	var t time.Time
	if err := db.QueryRow(ctx, sqlOpsCutoff, olderThan.Seconds()).Scan(&t); err != nil {
		return t, fmt.Errorf("inspect: read the database clock: %w", schemaHint(err))
	}
	return t, nil
}

// ListParked returns the parked rows f selects, in id order, at most f.Limit.
func ListParked(ctx context.Context, db Querier, f ParkedFilter) ([]ParkedMessage, error) {
	if err := f.validate(db); err != nil {
		return nil, err
	}
	limit, _ := f.limits()
	at, err := cutoff(ctx, db, f.OlderThan)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sqlParkedList, f.Topic, f.ErrorContains, at, nonNil(f.IDs), f.Key, limit, heldScan(f.HeldScan))
	if err != nil {
		return nil, fmt.Errorf("inspect: list parked rows: %w", schemaHint(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedMessage, error) {
		var p ParkedMessage
		err := r.Scan(&p.ID, &p.EventID, &p.Topic, &p.Key, &p.Attempts, &p.LastError, &p.CreatedAt, &p.ParkedAt, &p.Held, &p.HeldCapped)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: list parked rows: %w", schemaHint(err))
	}
	return list, nil
}

// CountParked counts the parked rows f selects (f.Limit does not apply):
// what DiscardParked or RetryParked would act on now.
func CountParked(ctx context.Context, db Querier, f ParkedFilter) (int64, error) {
	if err := f.validate(db); err != nil {
		return 0, err
	}
	at, err := cutoff(ctx, db, f.OlderThan)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, sqlParkedCount, f.Topic, f.ErrorContains, at, nonNil(f.IDs), f.Key).Scan(&n); err != nil {
		return 0, fmt.Errorf("inspect: count parked rows: %w", schemaHint(err))
	}
	return n, nil
}

// RetryParked writes: it unparks every row f selects: parked_at is cleared
// and attempts restart at 0 (last_error stays until the relay overwrites it).
// Running relays then publish the rows again, and after each the rows of its
// topic and key it held back; they keep their ids, so a key's rows go out in
// id order. It works in batches of f.BatchSize
// rows, each its own statement, so relays and writers are never held up; a
// row that stopped being parked meanwhile is left alone. Running it twice
// has the same end state as once: the second finds nothing parked. It
// returns how many rows it unparked.
func RetryParked(ctx context.Context, db Querier, f ParkedFilter) (int64, error) {
	return parkedBatches(ctx, db, f, sqlParkedRetry, "unpark")
}

// DiscardParked writes: it deletes every row f selects, in batches as
// RetryParked (a row unparked meanwhile is not deleted), and returns how many
// it deleted. The rows are gone: their events are never published, and the
// rows of their keys they held back go on. Preview with CountParked
// or ListParked.
func DiscardParked(ctx context.Context, db Querier, f ParkedFilter) (int64, error) {
	return parkedBatches(ctx, db, f, sqlParkedDiscard, "discard")
}

func parkedBatches(ctx context.Context, db Querier, f ParkedFilter, sql, verb string) (int64, error) {
	if err := f.validate(db); err != nil {
		return 0, err
	}
	_, batch := f.limits()
	at, err := cutoff(ctx, db, f.OlderThan)
	if err != nil {
		return 0, err
	}
	var total, after int64
	for {
		var last *int64
		var n int64
		err := db.QueryRow(ctx, sql, f.Topic, f.ErrorContains, at, nonNil(f.IDs), f.Key, batch, after).Scan(&last, &n)
		if err != nil {
			return total, fmt.Errorf("inspect: %s parked rows after id %d: %w", verb, after, schemaHint(err))
		}
		total += n
		if last == nil {
			return total, nil
		}
		after = *last
	}
}

// nonNil makes an empty id list an empty array (cardinality 0), not NULL.
func nonNil(ids []int64) []int64 {
	if ids == nil {
		return []int64{}
	}
	return ids
}
