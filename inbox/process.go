package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// maxVanished bounds the retries when a conflicting row disappears between the
// dedup insert and the follow-up read (a concurrent cleanup deleted it).
const maxVanished = 3

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
// usable (unless the connection itself failed). Bad input fails before
// anything is sent, with ErrInvalidMessage.
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
// tx must be at READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ
// or SERIALIZABLE a concurrent duplicate fails with a serialization error
// (SQLSTATE 40001) instead of being reported as a duplicate.
func (ib *Inbox) Process(ctx context.Context, tx pgx.Tx, m Message, h HandlerFunc) (Result, error) {
	if tx == nil || h == nil {
		return Result{}, errors.New("inbox: Process needs a non-nil tx and handler")
	}
	key, err := ib.key.key(m)
	if err != nil {
		ib.stats.invalid.Add(1)
		return Result{}, ib.msgErr(0, m, "", fmt.Errorf("%w: %w", ErrInvalidMessage, err))
	}
	res := Result{Key: key}
	fp := ib.sum(m.Value)

	inserted, storedFP, stored, err := ib.dedupOne(ctx, tx, m, key, fp)
	if err != nil {
		return res, ib.msgErr(0, m, key, err)
	}
	if !inserted {
		if mismatch(fp, storedFP) {
			ib.stats.mismatches.Add(1)
			// Nothing was written under the savepoint: releasing it is enough.
			if err := release(ctx, tx); err != nil {
				return res, ib.msgErr(0, m, key, fmt.Errorf("%w (and %w)", ErrFingerprintMismatch, err))
			}
			return res, ib.msgErr(0, m, key, ErrFingerprintMismatch)
		}
		ib.stats.duplicates.Add(1)
		res.Duplicate, res.Stored = true, stored
		return res, nil
	}

	slot := &resultSlot{}
	if err := h(context.WithValue(ctx, resultSlotKey{}, slot), tx, m); err != nil {
		ib.stats.handlerErrors.Add(1)
		if rbErr := rollbackToSavepoint(ctx, tx); rbErr != nil {
			return res, ib.msgErr(0, m, key, fmt.Errorf("handler: %w (and %w)", err, rbErr))
		}
		return res, ib.msgErr(0, m, key, fmt.Errorf("handler: %w", err))
	}
	if slot.set {
		if _, err := tx.Exec(ctx, sqlSetResult, ib.consumer, key, slot.b); err != nil {
			_ = rollbackToSavepoint(ctx, tx)
			return res, ib.msgErr(0, m, key, fmt.Errorf("store result: %w", err))
		}
		res.Stored = slot.b
	}
	ib.stats.processed.Add(1)
	return res, nil
}

func (ib *Inbox) msgErr(i int, m Message, key string, err error) error {
	return &MessageError{Consumer: ib.consumer, Index: i, Message: m, Key: key, Err: err}
}

// dedupOne opens the savepoint and inserts key: one round trip when the key is
// new, two when it conflicts (the second reads the stored fingerprint and
// result). On success the savepoint is open; on error it has been rolled back
// and released.
func (ib *Inbox) dedupOne(ctx context.Context, tx pgx.Tx, m Message, key string, fp []byte) (inserted bool, storedFP, stored []byte, err error) {
	args := []any{ib.consumer, key, m.Topic, m.Partition, m.Offset, fp, recordAt(m.Timestamp)}
	b := &pgx.Batch{}
	b.Queue(sqlSavepoint)
	if ib.lockTimeout != "" {
		b.Queue(sqlSetLockTimeout, ib.lockTimeout)
	}
	b.Queue(sqlInsertOne, args...)
	if ib.lockTimeout != "" {
		b.Queue(sqlRestoreLockTimeout)
	}
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		// The savepoint itself failed: the transaction was unusable before we
		// started, and there is nothing of ours to undo.
		_ = br.Close()
		return false, nil, nil, fmt.Errorf("savepoint: %w", err)
	}
	if ib.lockTimeout != "" {
		_, err = br.Exec()
	}
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		inserted = tag.RowsAffected() == 1
	}
	if err == nil && ib.lockTimeout != "" {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	for attempt := 0; err == nil && !inserted; attempt++ {
		err = tx.QueryRow(ctx, sqlSelectOne, ib.consumer, key).Scan(&storedFP, &stored)
		if err == nil || !errors.Is(err, pgx.ErrNoRows) {
			break
		}
		// The row was deleted after our insert conflicted with it (a
		// concurrent cleanup): insert again.
		if attempt == maxVanished {
			err = fmt.Errorf("key conflicted but its row kept vanishing (%d attempts)", maxVanished)
			break
		}
		var tag pgconn.CommandTag
		tag, err = tx.Exec(ctx, sqlInsertOne, args...)
		inserted = tag.RowsAffected() == 1
	}
	if err != nil {
		if rbErr := rollbackToSavepoint(ctx, tx); rbErr != nil {
			return false, nil, nil, fmt.Errorf("%w (and %w)", ib.dedupErr(err), rbErr)
		}
		return false, nil, nil, ib.dedupErr(err)
	}
	return inserted, storedFP, stored, nil
}

// ProcessBatch is Process for several messages in one savepoint: one round
// trip dedups all their keys (one more reads the stored rows of keys seen
// before, if any), then h runs, in input order, for each message
// whose key is new. A key repeated within ms is handled once; its later
// copies are duplicates (Stored is what the first copy's handler set).
// results[i] is for ms[i].
//
// The batch is all or nothing: if any message is invalid, or has a
// fingerprint mismatch (against a stored key or an earlier copy in the
// batch), or its handler fails, ProcessBatch returns a *MessageError naming
// it (Index is its position in ms) and no key of the batch, and nothing the
// handlers wrote, remains; the caller's transaction stays usable. ErrInFlight
// and database errors of the dedup step concern the batch as a whole and are
// not *MessageError values.
//
// As with Process, keys held by another uncommitted transaction are waited
// for (or fail with ErrInFlight under Config.LockTimeout), and on success the
// savepoint is left open until the transaction ends. Keys are inserted in a
// fixed (bytewise) order, so concurrent batches over the same keys cannot
// deadlock on them.
func (ib *Inbox) ProcessBatch(ctx context.Context, tx pgx.Tx, ms []Message, h HandlerFunc) ([]Result, error) {
	if tx == nil || h == nil {
		return nil, errors.New("inbox: ProcessBatch needs a non-nil tx and handler")
	}
	if len(ms) == 0 {
		return nil, nil
	}
	results := make([]Result, len(ms))
	fps := make([][]byte, len(ms))
	first := make(map[string]int, len(ms)) // key → index of its first copy
	// Columns of the distinct keys, in order of first appearance.
	var (
		keys       = make([]string, 0, len(ms))
		topics     = make([]string, 0, len(ms))
		partitions = make([]int32, 0, len(ms))
		offsets    = make([]int64, 0, len(ms))
		colFPs     = make([][]byte, 0, len(ms))
		recordAts  = make([]pgtype.Timestamptz, 0, len(ms))
	)
	for i, m := range ms {
		key, err := ib.key.key(m)
		if err != nil {
			ib.stats.invalid.Add(1)
			return nil, ib.msgErr(i, m, "", fmt.Errorf("%w: %w", ErrInvalidMessage, err))
		}
		results[i].Key = key
		fps[i] = ib.sum(m.Value)
		if j, ok := first[key]; ok {
			if mismatch(fps[i], fps[j]) {
				ib.stats.mismatches.Add(1)
				return nil, ib.msgErr(i, m, key, fmt.Errorf("%w (message %d of the batch has this key)", ErrFingerprintMismatch, j))
			}
			results[i].Duplicate = true
			continue
		}
		first[key] = i
		keys = append(keys, key)
		topics = append(topics, m.Topic)
		partitions = append(partitions, m.Partition)
		offsets = append(offsets, m.Offset)
		colFPs = append(colFPs, fps[i])
		recordAts = append(recordAts, recordAt(m.Timestamp))
	}

	type row struct {
		inserted bool
		fp, res  []byte
	}
	rows := make(map[string]row, len(keys))
	// scanInserted records the keys an insert returned; scanStored the
	// stored rows of keys that conflicted.
	scanInserted := func(r pgx.Rows) error {
		for r.Next() {
			var k string
			if err := r.Scan(&k); err != nil {
				r.Close()
				return err
			}
			rows[k] = row{inserted: true}
		}
		return r.Err()
	}
	scanStored := func(r pgx.Rows) error {
		for r.Next() {
			var k string
			var x row
			if err := r.Scan(&k, &x.fp, &x.res); err != nil {
				r.Close()
				return err
			}
			rows[k] = x
		}
		return r.Err()
	}

	b := &pgx.Batch{}
	b.Queue(sqlSavepoint)
	if ib.lockTimeout != "" {
		b.Queue(sqlSetLockTimeout, ib.lockTimeout)
	}
	b.Queue(sqlInsertMany, ib.consumer, keys, topics, partitions, offsets, colFPs, recordAts)
	if ib.lockTimeout != "" {
		b.Queue(sqlRestoreLockTimeout)
	}
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("inbox: consumer %q: savepoint: %w", ib.consumer, err)
	}
	var err error
	if ib.lockTimeout != "" {
		_, err = br.Exec()
	}
	if err == nil {
		var r pgx.Rows
		if r, err = br.Query(); err == nil {
			err = scanInserted(r)
		}
	}
	if err == nil && ib.lockTimeout != "" {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	// Keys that conflicted: read their stored rows (a new statement, so rows
	// committed by transactions the insert waited for are visible). A row
	// deleted meanwhile (by a concurrent cleanup) is inserted again.
	for attempt := 0; err == nil && len(rows) < len(keys); attempt++ {
		if attempt == maxVanished {
			err = fmt.Errorf("keys conflicted but their rows kept vanishing (%d attempts)", maxVanished)
			break
		}
		missing := missingKeys(keys, func(k string) bool { _, ok := rows[k]; return ok })
		var r pgx.Rows
		if r, err = tx.Query(ctx, sqlSelectMany, ib.consumer, missing); err == nil {
			err = scanStored(r)
		}
		if err != nil || len(rows) == len(keys) {
			break
		}
		var mk, mt []string
		var mp []int32
		var mo []int64
		var mf [][]byte
		var mr []pgtype.Timestamptz
		for i, k := range keys {
			if _, ok := rows[k]; !ok {
				mk, mt, mp, mo, mf, mr = append(mk, k), append(mt, topics[i]), append(mp, partitions[i]),
					append(mo, offsets[i]), append(mf, colFPs[i]), append(mr, recordAts[i])
			}
		}
		if r, err = tx.Query(ctx, sqlInsertMany, ib.consumer, mk, mt, mp, mo, mf, mr); err == nil {
			err = scanInserted(r)
		}
	}
	if err != nil {
		err = ib.dedupErr(err)
		if rbErr := rollbackToSavepoint(ctx, tx); rbErr != nil {
			err = fmt.Errorf("%w (and %w)", err, rbErr)
		}
		return nil, fmt.Errorf("inbox: consumer %q, batch of %d: %w", ib.consumer, len(ms), err)
	}

	// Fingerprints against stored keys, before any handler runs.
	for i, m := range ms {
		if first[results[i].Key] != i {
			continue
		}
		if r := rows[results[i].Key]; !r.inserted && mismatch(fps[i], r.fp) {
			ib.stats.mismatches.Add(1)
			err := ib.msgErr(i, m, results[i].Key, ErrFingerprintMismatch)
			if rbErr := rollbackToSavepoint(ctx, tx); rbErr != nil {
				err = fmt.Errorf("%w (and %w)", err, rbErr)
			}
			return nil, err
		}
	}

	slot := &resultSlot{}
	hctx := context.WithValue(ctx, resultSlotKey{}, slot)
	var setKeys []string
	var setResults [][]byte
	processed, dups := 0, 0
	for i, m := range ms {
		j := first[results[i].Key]
		if j != i { // a later copy within the batch
			results[i].Duplicate = true
			results[i].Stored = results[j].Stored
			dups++
			continue
		}
		r := rows[results[i].Key]
		if !r.inserted {
			results[i].Duplicate = true
			results[i].Stored = r.res
			dups++
			continue
		}
		*slot = resultSlot{}
		if err := h(hctx, tx, m); err != nil {
			ib.stats.handlerErrors.Add(1)
			err = ib.msgErr(i, m, results[i].Key, fmt.Errorf("handler: %w", err))
			if rbErr := rollbackToSavepoint(ctx, tx); rbErr != nil {
				err = fmt.Errorf("%w (and %w)", err, rbErr)
			}
			return nil, err
		}
		processed++
		if slot.set {
			results[i].Stored = slot.b
			setKeys = append(setKeys, results[i].Key)
			setResults = append(setResults, slot.b)
		}
	}
	if len(setKeys) > 0 {
		if _, err := tx.Exec(ctx, sqlSetResults, ib.consumer, setKeys, setResults); err != nil {
			_ = rollbackToSavepoint(ctx, tx)
			return nil, fmt.Errorf("inbox: consumer %q: store results: %w", ib.consumer, err)
		}
	}
	ib.stats.processed.Add(uint64(processed))
	ib.stats.duplicates.Add(uint64(dups))
	return results, nil
}

func missingKeys(keys []string, have func(string) bool) []string {
	var out []string
	for _, k := range keys {
		if !have(k) {
			out = append(out, k)
		}
	}
	return out
}
