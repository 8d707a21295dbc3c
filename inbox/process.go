package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbox/pgbox/inbox/internal/owntx"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// maxVanished bounds the retries when a conflicting row disappears between the
// dedup insert and the follow-up read (a concurrent cleanup deleted it).
const maxVanished = 3

// codeUniqueViolation is SQLSTATE unique_violation.
const codeUniqueViolation = pgerr.CodeUniqueViolation

// probeWindow is how long batches probe for known keys before inserting
// after a batch met one (Inbox.probeUntil): redeliveries come in runs (a
// rebalance, a restart, a replay), each a few seconds of a partition's
// records.
const probeWindow = 10 * time.Second

// Process runs h for m inside tx unless m's key was processed before by this
// consumer. The dedup step is one round trip: a savepoint and an INSERT … ON
// CONFLICT DO NOTHING into pgbox_inbox, pipelined. A duplicate takes one more,
// to read the stored fingerprint and result.
//
// New key: h runs; if it returns nil, Process returns Result{Duplicate:
// false}. The key commits with tx: if the caller rolls tx back, no trace is
// left and a redelivery processes the message again.
//
// Known key: h is skipped and Result{Duplicate: true, Stored: …} comes back;
// with fingerprints on, a different payload fails with ErrFingerprintMismatch.
//
// In flight: if another transaction holds the key uncommitted, Process waits
// for it (reporting a duplicate if it commits, processing if it rolls back),
// or with Config.LockTimeout returns ErrInFlight.
//
// Errors: when h fails, the key and everything h wrote are rolled back to the
// savepoint, so even a caller that commits anyway commits no trace of the
// message; the error wraps h's. On every error the caller's transaction stays
// usable, unless the connection itself failed or pgbox's table is missing
// (an error wrapping ErrNeedsOperator: pgx prepares the pipelined statements
// before the savepoint runs, and a failed prepare aborts the transaction; roll
// it back). Bad input fails before anything is sent, with ErrInvalidMessage.
//
// Savepoints: on success Process leaves its savepoint open rather than pay a
// round trip to release it; it ends with the transaction (or with a savepoint
// of the caller's that encloses it), and statements after Process simply run
// inside it. h must not release or roll back savepoints it did not create.
// Each call is one subtransaction: PostgreSQL tracks up to 64 per transaction
// cheaply, and beyond that every snapshot on the server gets slower while the
// transaction runs. To handle many messages in one transaction, use
// ProcessBatch (one subtransaction per call).
//
// Watermark modes (Config.Dedup): the same round trip moves m's partition
// watermark to m.Offset; an offset at or below it is a duplicate (Stored is
// nil), and Result.Gap reports offsets skipped since the watermark. A
// concurrent delivery of the same partition waits on the watermark row as on
// a key.
//
// tx must be at READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ
// or SERIALIZABLE a concurrent duplicate fails with a serialization error
// (SQLSTATE 40001) instead of being reported as a duplicate.
func (ib *Inbox) Process(ctx context.Context, tx pgx.Tx, m Message, h HandlerFunc) (Result, error) {
	if tx == nil || h == nil {
		return Result{}, errors.New("inbox: Process needs a non-nil tx and handler")
	}
	return process(ctx, ib, pgxKind{Tx: tx, h: h}, m, owntx.Owns(ctx, tx))
}

// process is Process and ProcessSQL, for each kind of transaction.
func process[T txKind](ctx context.Context, ib *Inbox, tx T, m Message, owned bool) (Result, error) {
	key, err := ib.key.key(m)
	if err != nil {
		ib.stats.invalid.Add(1)
		return Result{}, ib.msgErr(0, m, "", fmt.Errorf("%w: %w", ErrInvalidMessage, err))
	}
	res := Result{Key: key}
	fp := ib.sum(m.Value)

	var o oneOutcome
	err = tx.dedup(ctx, func(q querier) error {
		o, err = ib.dedupOne(ctx, q, m, key, fp, owned)
		if err == nil && !o.wmDup && ib.keyed && !o.inserted && mismatch(fp, o.storedFP) {
			ib.stats.mismatches.Add(1)
			// Undo the watermark's move too: the message was not handled.
			err = undo(ctx, q, owned, ErrFingerprintMismatch)
		}
		return err
	})
	if err != nil {
		return res, ib.msgErr(0, m, key, err)
	}
	if o.gap > 0 { // reported even when the key turns out a duplicate
		ib.stats.gaps.Add(1)
		res.Gap = o.gap
	}
	if o.wmDup || (ib.keyed && !o.inserted) {
		ib.stats.duplicates.Add(1)
		res.Duplicate, res.Stored = true, o.stored
		return res, nil
	}

	slot := &resultSlot{}
	if err := tx.handle(handlerCtx(ctx, slot, owned), m); err != nil {
		ib.stats.handlerErrors.Add(1)
		return res, ib.msgErr(0, m, key, undo(ctx, tx, owned, fmt.Errorf("handler: %w", err)))
	}
	if slot.set {
		if _, err := tx.Exec(ctx, sqlSetResult, ib.consumer, key, slot.b); err != nil {
			return res, ib.msgErr(0, m, key, undo(ctx, tx, owned, fmt.Errorf("store result: %w", err)))
		}
		res.Stored = slot.b
	}
	ib.stats.processed.Add(1)
	return res, nil
}

func (ib *Inbox) msgErr(i int, m Message, key string, err error) error {
	return &MessageError{Consumer: ib.consumer, Index: i, Message: m, Key: key, Err: err}
}

// oneOutcome is what the dedup step said of one message.
type oneOutcome struct {
	wmDup    bool  // at or below the partition's watermark
	gap      int64 // offsets skipped between the watermark and this message
	inserted bool  // its key is new (keyed modes)
	storedFP []byte
	stored   []byte
}

// dedupOne opens the savepoint (unless the caller owns tx), moves the
// partition's watermark (watermark modes) and inserts key (keyed modes), all
// in one round trip; a key that conflicts takes a second, to read the stored
// fingerprint and result. On success the savepoint is open; on error it has
// been rolled back and released.
func (ib *Inbox) dedupOne(ctx context.Context, tx querier, m Message, key string, fp []byte, owned bool) (oneOutcome, error) {
	args := []any{ib.consumer, key, m.Topic, m.Partition, m.Offset, fp, recordAt(m.Timestamp)}
	b := &pgx.Batch{}
	if !owned {
		b.Queue(sqlSavepoint)
	}
	if ib.lockTimeout != "" {
		b.Queue(sqlSetLockTimeout, ib.lockTimeout)
	}
	if ib.watermark {
		b.Queue(sqlWatermarkOne, ib.consumer, m.Topic, m.Partition, m.TopicID, m.Offset)
	}
	if ib.keyed {
		b.Queue(sqlInsertOne, args...)
	}
	if ib.lockTimeout != "" {
		b.Queue(sqlRestoreLockTimeout)
	}
	br := tx.SendBatch(ctx, b)
	if !owned {
		if _, err := br.Exec(); err != nil {
			// The savepoint itself failed (the transaction was unusable
			// before we started), or preparing the batch did (pgbox_inbox
			// missing): no savepoint exists, there is nothing of ours to
			// undo.
			_ = br.Close()
			return oneOutcome{}, fmt.Errorf("savepoint: %w", pgerr.WithFix(err))
		}
	}
	var o oneOutcome
	err := ib.readOne(br, m, &o)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && ib.keyed && !o.inserted {
		err = ib.readStoredOne(ctx, tx, key, args, &o)
	}
	if err != nil {
		return oneOutcome{}, undo(ctx, tx, owned, ib.dedupErr(err))
	}
	return o, nil
}

// readOne reads the results of dedupOne's pipeline after the savepoint.
func (ib *Inbox) readOne(br pgx.BatchResults, m Message, o *oneOutcome) error {
	if ib.lockTimeout != "" {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	if ib.watermark {
		var prev pgtype.Int8
		err := br.QueryRow().Scan(&prev)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			o.wmDup = true
		case err != nil:
			return err
		case prev.Valid && m.Offset > prev.Int64+1:
			o.gap = m.Offset - prev.Int64 - 1
		}
	}
	if ib.keyed {
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		o.inserted = tag.RowsAffected() == 1
	}
	if ib.lockTimeout != "" {
		_, err := br.Exec()
		return err
	}
	return nil
}

// readStoredOne reads the stored row of a key that conflicted (a new
// statement, whose snapshot includes a row committed by a transaction the
// insert waited for). A row deleted meanwhile (by a concurrent cleanup) is
// inserted again.
func (ib *Inbox) readStoredOne(ctx context.Context, tx querier, key string, args []any, o *oneOutcome) error {
	for attempt := 0; ; attempt++ {
		err := tx.QueryRow(ctx, sqlTouchOne, ib.consumer, key, args[6], args[2], args[3], args[4]).Scan(&o.storedFP, &o.stored)
		if err == nil || !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if attempt == maxVanished {
			return fmt.Errorf("key conflicted but its row kept vanishing (%d attempts)", maxVanished)
		}
		tag, err := tx.Exec(ctx, sqlInsertOne, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			o.inserted = true
			return nil
		}
	}
}
