package inbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbox/pgbox/inbox/internal/owntx"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// Sentinel errors, for errors.Is. Errors returned by Process and
// ProcessBatch that concern one message are *MessageError values wrapping one
// of these (or the handler's own error).
var (
	// ErrInvalidMessage: the message cannot be keyed or stored (empty topic,
	// negative partition or offset, missing or empty key header, empty,
	// over-long or non-UTF-8 key; in a watermark mode, a batch whose
	// partition goes back in offset). Nothing was written. Redelivery will fail
	// the same way: dead-letter or skip the message.
	ErrInvalidMessage = errors.New("invalid message")
	// ErrFingerprintMismatch: the key was seen before with a different payload
	// (sha256 of Message.Value). Nothing was written. A producer reused an
	// event id, or a ByFunc strategy keys too coarsely: processing it as a
	// duplicate would silently drop a different event.
	ErrFingerprintMismatch = errors.New("payload fingerprint differs from the first delivery of this key")
	// ErrInFlight: another transaction holds the key uncommitted, and the wait
	// exceeded Config.LockTimeout (or the caller's own lock_timeout). Nothing
	// was written; back off and redeliver.
	ErrInFlight = errors.New("key is being processed by another transaction")
	// ErrNeedsOperator marks a database error that retrying cannot fix: a
	// missing table, column or function (migrations not run, or a deploy's
	// migration skipped), a revoked grant, an unknown schema or database,
	// failed authentication. The error names the fix. It is the same value
	// as relay.ErrNeedsOperator and cleanup.ErrNeedsOperator.
	ErrNeedsOperator = pgerr.ErrNeedsOperator
)

// HandlerFunc does a message's business work inside the caller's
// transaction. It runs only for a key not processed before. Its ctx carries a
// slot for SetResult.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, m Message) error

const (
	// LockTimeoutDefault is Config.LockTimeout's default: wait for an
	// in-flight duplicate as long as it takes.
	LockTimeoutDefault time.Duration = 0
	// DedupDefault is Config.Dedup's default: keyed dedup.
	DedupDefault = DedupKeys
	// MaxConsumerLen is the longest Config.Consumer accepted, in bytes.
	MaxConsumerLen = 255
)

// Config configures an Inbox.
type Config struct {
	// Consumer names whose keys these are, usually the Kafka consumer group
	// id. Keys are deduplicated per consumer: two consumers that see the same
	// key both process it. Required; valid UTF-8, at most MaxConsumerLen bytes.
	Consumer string

	// Dedup chooses how duplicates are recognised: DedupKeys (a row per
	// key in pgbox_inbox), DedupWatermark (a row per partition in
	// pgbox_inbox_watermark holding the highest offset processed; for
	// consumers that process each partition in order), or
	// DedupWatermarkAndKeys (both: the watermark for redeliveries, Key for
	// producer-side duplicates). See the package doc for when to choose
	// which. Defaults to DedupDefault (DedupKeys).
	Dedup Dedup

	// Key derives each message's dedup key. With DedupWatermark it must be
	// left unset (the watermark needs no key; Result.Key then names the
	// record as ByOffset would); with DedupWatermarkAndKeys it is required
	// and must not be ByOffset (the watermark already covers redeliveries):
	// usually ByHeader with a producer-assigned event id. Defaults to
	// ByOffset().
	Key KeyStrategy

	// DisableFingerprint turns off payload fingerprints. With fingerprints on,
	// the sha256 of Message.Value is stored with the key, and a later message
	// with the same key but a different value fails with
	// ErrFingerprintMismatch instead of being skipped as a duplicate. Rows
	// stored without a fingerprint are never compared. Defaults to false
	// (fingerprints on).
	DisableFingerprint bool

	// LockTimeout bounds how long Process waits when another transaction holds
	// the same key uncommitted; past it, Process returns ErrInFlight and the
	// caller's transaction stays usable. Zero waits until the other
	// transaction ends (then reports a duplicate, or processes if it rolled
	// back). Set as a transaction-local lock_timeout around the dedup insert
	// only; the caller's own setting is restored before the handler runs.
	// Defaults to LockTimeoutDefault (0, wait).
	LockTimeout time.Duration
}

func (c Config) validate() error {
	if c.Consumer == "" {
		return errors.New("inbox: Config.Consumer is empty (set it to the Kafka consumer group id, e.g. \"payments-svc\")")
	}
	if len(c.Consumer) > MaxConsumerLen {
		return fmt.Errorf("inbox: Config.Consumer is %d bytes, longer than MaxConsumerLen (%d)", len(c.Consumer), MaxConsumerLen)
	}
	if err := checkText(c.Consumer); err != nil {
		return fmt.Errorf("inbox: Config.Consumer %q: %w", c.Consumer, err)
	}
	if c.Key.err != nil {
		return c.Key.err
	}
	if c.Key.fn == nil && c.Key.name != "" {
		return fmt.Errorf("inbox: Config.Key %s has a nil func (pass a function to ByFunc)", c.Key.name)
	}
	if err := c.validateDedup(); err != nil {
		return err
	}
	if c.LockTimeout < 0 {
		return fmt.Errorf("inbox: Config.LockTimeout is negative (%v): use 0 to wait, or a positive duration", c.LockTimeout)
	}
	return nil
}

// Dedup is a way of recognising duplicates (Config.Dedup).
type Dedup int

const (
	// DedupKeys records every processed message's key in pgbox_inbox. Works
	// in any processing order, with any key strategy (offsets or event ids);
	// the table grows with traffic and package cleanup prunes it by topic
	// retention.
	DedupKeys Dedup = iota
	// DedupWatermark records, per (consumer, topic, partition), the highest
	// offset processed, in pgbox_inbox_watermark; a record at or below it is
	// a duplicate. Requires processing each partition in offset order (both
	// consumer adapters, inboxsarama and inboxfranz, do). O(partitions) rows,
	// nothing to clean up.
	DedupWatermark
	// DedupWatermarkAndKeys is DedupWatermark for redeliveries plus keyed
	// dedup with Config.Key (an event id) for duplicates a producer sent
	// twice, which sit at different offsets.
	DedupWatermarkAndKeys
)

// String names the mode as its constant does.
func (d Dedup) String() string {
	switch d {
	case DedupKeys:
		return "DedupKeys"
	case DedupWatermark:
		return "DedupWatermark"
	case DedupWatermarkAndKeys:
		return "DedupWatermarkAndKeys"
	}
	return fmt.Sprintf("Dedup(%d)", int(d))
}

func (c Config) validateDedup() error {
	switch c.Dedup {
	case DedupKeys:
	case DedupWatermark:
		if c.Key.fn != nil {
			return fmt.Errorf("inbox: Config.Key %s is set with DedupWatermark, which uses no key (use DedupWatermarkAndKeys to add keyed dedup on an event id)", c.Key)
		}
	case DedupWatermarkAndKeys:
		if c.Key.fn == nil || c.Key.name == "ByOffset()" {
			return errors.New("inbox: DedupWatermarkAndKeys needs Config.Key set to a producer-side key, e.g. ByHeader(\"event-id\") (offset keys duplicate what the watermark does: use DedupWatermark)")
		}
	default:
		return fmt.Errorf("inbox: Config.Dedup %v is not a known mode (use DedupKeys, DedupWatermark or DedupWatermarkAndKeys)", c.Dedup)
	}
	return nil
}

// Inbox deduplicates consumed messages inside the caller's transaction. It
// holds no connection and is safe for concurrent use.
type Inbox struct {
	consumer    string
	key         KeyStrategy
	fingerprint bool
	lockTimeout string // milliseconds, for set_config; "" when waiting
	keyed       bool   // rows in pgbox_inbox
	watermark   bool   // a row per partition in pgbox_inbox_watermark
	// probeUntil (UnixNano) ends the window in which batches probe for
	// known keys before inserting (sqlInsertManyProbe, or ON CONFLICT when
	// the caller owns the transaction): a batch in which a key was seen
	// before opens it for probeWindow. A time, not a count of batches: one
	// *Inbox serves many partitions, and the new keys of the others must
	// not use up the window of one that redelivers.
	probeUntil atomic.Int64
	probeFor   time.Duration // probeWindow; shorter in tests

	stats struct {
		processed, duplicates, mismatches, inFlight, invalid, handlerErrors, gaps atomic.Uint64
	}
}

// New returns an Inbox for cfg.
func New(cfg Config) (*Inbox, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Key.fn == nil {
		cfg.Key = ByOffset() // with DedupWatermark: names the record only
	}
	ib := &Inbox{consumer: cfg.Consumer, key: cfg.Key, fingerprint: !cfg.DisableFingerprint,
		keyed: cfg.Dedup != DedupWatermark, watermark: cfg.Dedup != DedupKeys, probeFor: probeWindow}
	if cfg.LockTimeout > 0 {
		ms := (cfg.LockTimeout + time.Millisecond - 1) / time.Millisecond // round up: never 0 (= wait forever)
		ib.lockTimeout = strconv.FormatInt(int64(ms), 10)
	}
	return ib, nil
}

// probing reports whether a batch starting now probes first (probeUntil).
func (ib *Inbox) probing() bool { return time.Now().UnixNano() < ib.probeUntil.Load() }

// sawKnownKey opens the probe window (probeUntil).
func (ib *Inbox) sawKnownKey() { ib.probeUntil.Store(time.Now().Add(ib.probeFor).UnixNano()) }

// Consumer returns Config.Consumer.
func (ib *Inbox) Consumer() string { return ib.consumer }

// Key returns the dedup key of m under this inbox's strategy, or an error
// wrapping ErrInvalidMessage. It touches no database.
func (ib *Inbox) Key(m Message) (string, error) {
	k, err := ib.key.key(m)
	if err != nil {
		return "", &MessageError{Consumer: ib.consumer, Message: m, Err: fmt.Errorf("%w: %w", ErrInvalidMessage, err)}
	}
	return k, nil
}

// Result reports what Process did with one message.
type Result struct {
	// Key is the message's dedup key.
	Key string
	// Duplicate is true when the key was processed before (or earlier in the
	// same batch): the handler was skipped. Commit and mark the offset as
	// usual.
	Duplicate bool
	// Stored is the result the first processing of the key handed to
	// SetResult (nil if none): for duplicates, what was stored; for new
	// messages, what the handler just set. Watermark-only mode stores none.
	Stored []byte
	// Gap, in the watermark modes, is how many offsets lie between the
	// partition's watermark (or the previous message of the partition in the
	// batch) and this message: offsets this consumer never processed. Kafka
	// leaves such holes legitimately (transaction markers, compaction,
	// records deleted by retention before the consumer got to them), and
	// also when the group's offset was reset forward past records: the
	// message is processed, the gap is counted in Stats.Gaps, and the
	// consumer adapters log it, so a skip is never silent. 0 otherwise.
	Gap int64
}

// MessageError is the error for one message of a Process or ProcessBatch
// call. It wraps ErrInvalidMessage, ErrFingerprintMismatch, ErrInFlight, the
// handler's error, or a database error.
type MessageError struct {
	Consumer string
	// Index is the message's position in ProcessBatch's input (0 for Process).
	Index   int
	Message Message
	// Key is the message's dedup key, "" when it could not be derived.
	Key string
	Err error
}

func (e *MessageError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("inbox: consumer %q, message %s: %v", e.Consumer, e.Message, e.Err)
	}
	return fmt.Sprintf("inbox: consumer %q, message %s, key %q: %v", e.Consumer, e.Message, e.Key, e.Err)
}

func (e *MessageError) Unwrap() error { return e.Err }

// Stats counts what an Inbox did since New. Counts are of calls, not of
// commits: a message processed in a transaction the caller then rolled back
// counts as processed, and its redelivery counts again.
type Stats struct {
	Processed             uint64 // handler ran and returned nil
	Duplicates            uint64 // handler skipped: key seen before or earlier in the batch
	FingerprintMismatches uint64 // ErrFingerprintMismatch
	InFlight              uint64 // ErrInFlight
	InvalidMessages       uint64 // ErrInvalidMessage
	HandlerErrors         uint64 // handler returned an error
	Gaps                  uint64 // watermark modes: messages that arrived after a gap (Result.Gap)
}

// Stats returns the counters so far.
func (ib *Inbox) Stats() Stats {
	return Stats{
		Processed:             ib.stats.processed.Load(),
		Duplicates:            ib.stats.duplicates.Load(),
		FingerprintMismatches: ib.stats.mismatches.Load(),
		InFlight:              ib.stats.inFlight.Load(),
		InvalidMessages:       ib.stats.invalid.Load(),
		HandlerErrors:         ib.stats.handlerErrors.Load(),
		Gaps:                  ib.stats.gaps.Load(),
	}
}

type resultSlot struct {
	b   []byte
	set bool
}

type resultSlotKey struct{}

// SetResult stores result with the key of the message whose handler received
// ctx; later duplicates of the key get it back in Result.Stored (a cached
// response, e.g. the id of the payment the first delivery created). It is
// written in the same transaction as the handler's work. Calling it again
// replaces the value. It returns an error when ctx is not a handler's.
func SetResult(ctx context.Context, result []byte) error {
	s, ok := ctx.Value(resultSlotKey{}).(*resultSlot)
	if _, batch := ctx.Value(batchSlotsKey{}).(*batchSlots); !ok && batch {
		return errors.New("inbox: SetResult called in a batch handler (call SetBatchResult(ctx, i, result) with the message's position in the batch)")
	}
	if !ok {
		return errors.New("inbox: SetResult called with a context that is not an inbox handler's (pass the ctx the handler received)")
	}
	s.b = bytes.Clone(result)
	s.set = true
	return nil
}

func (ib *Inbox) sum(v []byte) []byte {
	if !ib.fingerprint {
		return nil
	}
	s := sha256.Sum256(v)
	return s[:]
}

// mismatch reports whether a stored fingerprint contradicts ours. A side
// without a fingerprint (turned off when it was written, or now) matches.
func mismatch(ours, stored []byte) bool {
	return ours != nil && stored != nil && !bytes.Equal(ours, stored)
}

func recordAt(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// cleanupTimeout bounds the statements that undo our savepoint after a
// failure; they run even when ctx is already cancelled, so that a cancelled
// handler never leaves the inbox row behind.
const cleanupTimeout = 10 * time.Second

func rollbackToSavepoint(ctx context.Context, tx execer) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := tx.Exec(ctx, sqlRollbackRelease); err != nil {
		return fmt.Errorf("inbox: roll back to savepoint %s (roll the transaction back): %w", savepointName, err)
	}
	return nil
}

// undo rolls back to the savepoint after err, unless the caller owns tx (it
// rolls tx back itself), and returns err, with the rollback's own failure if
// any.
func undo(ctx context.Context, tx execer, owned bool, err error) error {
	if owned {
		return err
	}
	if rbErr := rollbackToSavepoint(ctx, tx); rbErr != nil {
		return fmt.Errorf("%w (and %w)", err, rbErr)
	}
	return err
}

// handlerCtx is the context a handler receives: it carries the SetResult
// slot, and never the caller's claim to own tx (a handler that calls Process
// in turn gets a savepoint).
func handlerCtx(ctx context.Context, slot *resultSlot, owned bool) context.Context {
	if owned {
		ctx = owntx.Drop(ctx)
	}
	return context.WithValue(ctx, resultSlotKey{}, slot)
}

// dedupErr turns an error of the dedup step (after ROLLBACK TO SAVEPOINT)
// into what the caller sees.
func (ib *Inbox) dedupErr(err error) error {
	if pgerr.IsLockTimeout(err) {
		ib.stats.inFlight.Add(1)
		return fmt.Errorf("%w (lock timeout %sms): %w", ErrInFlight, cmpOr(ib.lockTimeout, "caller's"), err)
	}
	return fmt.Errorf("dedup insert into pgbox_inbox: %w", pgerr.WithFix(err))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
