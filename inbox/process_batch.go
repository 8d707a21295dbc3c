package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbox/pgbox/inbox/internal/owntx"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// ProcessBatch is Process for several messages in one savepoint: one round
// trip dedups all their keys when they are new, then h runs, in input
// order, for each message whose key is new. A key repeated within ms is handled once; its later
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
//
// Keys go in with a plain INSERT, without ON CONFLICT: the cheapest way when
// every key is new, the common case. A key seen before (a redelivery) fails
// it; ProcessBatch then rolls back to its savepoint and inserts again with
// ON CONFLICT (two round trips more), and reads the stored rows of the keys
// seen before (one more). For the next 10 seconds the Inbox's batches probe
// for known keys before inserting, so a run of redeliveries pays the failed
// insert once; they cost the stored-row read only.
//
// Watermark modes: one statement in the same round trip moves the watermark
// of every partition in ms to its highest offset there; each partition's
// messages must come in offset order (repeats are duplicates; an offset
// lower than an earlier one of its partition fails the batch with
// ErrInvalidMessage, nothing written).
func (ib *Inbox) ProcessBatch(ctx context.Context, tx pgx.Tx, ms []Message, h HandlerFunc) ([]Result, error) {
	if tx == nil || h == nil {
		return nil, errors.New("inbox: ProcessBatch needs a non-nil tx and handler")
	}
	return processBatch(ctx, ib, pgxKind{Tx: tx, h: h}, ms, owntx.Owns(ctx, tx))
}

// processBatch is ProcessBatch and ProcessBatchSQL, for each kind of
// transaction.
func processBatch[T txKind](ctx context.Context, ib *Inbox, tx T, ms []Message, owned bool) ([]Result, error) {
	p, err := dedupBatchOf(ctx, ib, tx, ms, owned)
	if err != nil || p == nil {
		return nil, err
	}
	if err := runBatch(ctx, ib, tx, ms, p, owned); err != nil {
		return nil, err
	}
	return p.results, nil
}

// dedupBatchOf plans ms and runs the dedup step in tx; nil for no messages.
// It is the part of ProcessBatch that ProcessBatchAtOnce shares.
func dedupBatchOf[T deduper](ctx context.Context, ib *Inbox, tx T, ms []Message, owned bool) (*batchPlan, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	p, err := ib.planBatch(ms)
	if err != nil {
		return nil, err
	}
	err = tx.dedup(ctx, func(q querier) error { return ib.dedupBatchStep(ctx, q, ms, p, owned) })
	if errors.Is(err, ErrUnsupportedTx) {
		return nil, fmt.Errorf("inbox: consumer %q, batch of %d: %w", ib.consumer, len(ms), err)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// dedupBatchStep is ProcessBatch's dedup step: it moves the watermarks,
// inserts the keys and checks fingerprints against stored keys. On error it
// has rolled back to the savepoint (unless the caller owns tx).
func (ib *Inbox) dedupBatchStep(ctx context.Context, tx querier, ms []Message, p *batchPlan, owned bool) error {
	insert, probing := sqlInsertManyNew, ib.probing()
	switch {
	case probing && owned:
		// No savepoint to fall back to: ON CONFLICT, which cannot fail on
		// a key seen before.
		insert = sqlInsertMany
	case probing:
		insert = sqlInsertManyProbe
	}
	err := ib.dedupBatch(ctx, tx, p, insert, owned)
	switch {
	case ib.keyed && owned && pgerr.Is(err, codeUniqueViolation):
		// A key seen before aborted the caller's transaction: the caller
		// runs the batch again in a new one (owntx.Conflict), which takes
		// ON CONFLICT.
		ib.sawKnownKey()
		return owntx.Conflict(fmt.Errorf("inbox: consumer %q, batch of %d: a key was seen before: %w", ib.consumer, len(ms), err))
	case ib.keyed && pgerr.Is(err, codeUniqueViolation):
		// A key seen before (see sqlInsertManyNew): again, with ON
		// CONFLICT, and probe first in the next batches.
		ib.sawKnownKey()
		if err = rollbackToSavepoint(ctx, tx); err == nil {
			p.reset()
			err = ib.dedupBatch(ctx, tx, p, sqlInsertMany, false)
		}
	case err == nil && ib.keyed && p.conflicted():
		ib.sawKnownKey()
	}
	if err != nil {
		var spErr *savepointError
		if errors.As(err, &spErr) {
			// No savepoint exists (see dedupOne): nothing of ours to undo.
			return fmt.Errorf("inbox: consumer %q: %w", ib.consumer, pgerr.WithFix(err))
		}
		err = undo(ctx, tx, owned, ib.dedupErr(err))
		return fmt.Errorf("inbox: consumer %q, batch of %d: %w", ib.consumer, len(ms), err)
	}
	if p.wm != nil {
		p.wmDup, p.gaps = p.wm.decide(ms)
	}
	if err := ib.checkStored(ms, p); err != nil {
		return undo(ctx, tx, owned, err)
	}
	return nil
}

// batchPlan is one ProcessBatch call's keys and what the database said of
// them.
type batchPlan struct {
	results []Result
	fps     [][]byte
	first   map[string]int // key → index of its first copy in ms
	// Columns of the distinct keys, in order of first appearance.
	keys       []string
	topics     []string
	partitions []int32
	offsets    []int64
	colFPs     [][]byte
	recordAts  []pgtype.Timestamptz
	known      []bool // false: copies on two partitions within the batch (position unknown)
	// rows holds each distinct key's outcome: inserted now, or the stored
	// fingerprint and result.
	rows map[string]storedRow
	// The watermark modes: the partitions' step, and per message whether it
	// is at or below the watermark and the gap before it.
	wm    *wmPlan
	wmDup []bool
	gaps  []int64
}

type storedRow struct {
	inserted bool
	fp, res  []byte
}

// planBatch keys and fingerprints every message, rejecting the batch on an
// invalid message or a fingerprint mismatch between copies within it.
func (ib *Inbox) planBatch(ms []Message) (*batchPlan, error) {
	n := len(ms)
	p := &batchPlan{
		results: make([]Result, n), fps: make([][]byte, n), first: make(map[string]int, n),
		keys: make([]string, 0, n), topics: make([]string, 0, n), partitions: make([]int32, 0, n),
		offsets: make([]int64, 0, n), colFPs: make([][]byte, 0, n), recordAts: make([]pgtype.Timestamptz, 0, n),
		known: make([]bool, 0, n),
		rows:  make(map[string]storedRow, n),
	}
	for i, m := range ms {
		key, err := ib.key.key(m)
		if err != nil {
			ib.stats.invalid.Add(1)
			return nil, ib.msgErr(i, m, "", fmt.Errorf("%w: %w", ErrInvalidMessage, err))
		}
		p.results[i].Key = key
		p.fps[i] = ib.sum(m.Value)
		if j, ok := p.first[key]; ok {
			if mismatch(p.fps[i], p.fps[j]) {
				ib.stats.mismatches.Add(1)
				return nil, ib.msgErr(i, m, key, fmt.Errorf("%w (message %d of the batch has this key)", ErrFingerprintMismatch, j))
			}
			p.results[i].Duplicate = true
			p.laterCopy(slices.Index(p.keys, key), m)
			continue
		}
		p.first[key] = i
		p.keys = append(p.keys, key)
		p.topics = append(p.topics, m.Topic)
		p.partitions = append(p.partitions, m.Partition)
		p.offsets = append(p.offsets, m.Offset)
		p.colFPs = append(p.colFPs, p.fps[i])
		p.recordAts = append(p.recordAts, recordAt(m.Timestamp))
		p.known = append(p.known, true)
	}
	if ib.watermark {
		w, err := ib.planWatermark(ms)
		if err != nil {
			return nil, err
		}
		p.wm = w
	}
	return p, nil
}

// laterCopy records a later copy of key k within the batch as the
// duplicate-update statement records one across batches (sqlTouchMany):
// on the same partition it moves the key's position to the later offset and
// its record time forward; on another partition or topic it makes the
// position unknown, for cleanup.
func (p *batchPlan) laterCopy(k int, m Message) {
	if p.topics[k] != m.Topic || p.partitions[k] != m.Partition {
		p.known[k] = false
		return
	}
	p.offsets[k] = max(p.offsets[k], m.Offset)
	if at := recordAt(m.Timestamp); at.Valid && (!p.recordAts[k].Valid || at.Time.After(p.recordAts[k].Time)) {
		p.recordAts[k] = at
	}
}

// touchTopic is the topic sqlTouchMany compares with the stored row's: ""
// (no topic) when the batch itself saw the key on two partitions.
func (p *batchPlan) touchTopic(k int) string {
	if !p.known[k] {
		return ""
	}
	return p.topics[k]
}

// reset forgets what a failed dedup step read.
func (p *batchPlan) reset() {
	clear(p.rows)
	if p.wm != nil {
		clear(p.wm.moved)
	}
}

// conflicted reports whether a key of the batch was there before (its
// stored row was read, not inserted).
func (p *batchPlan) conflicted() bool {
	for _, r := range p.rows {
		if !r.inserted {
			return true
		}
	}
	return false
}

// scanInserted records the keys an insert returned.
func (p *batchPlan) scanInserted(r pgx.Rows) error {
	for r.Next() {
		var k string
		if err := r.Scan(&k); err != nil {
			r.Close()
			return err
		}
		p.rows[k] = storedRow{inserted: true}
	}
	return r.Err()
}

// scanStored records the stored rows of keys that conflicted.
func (p *batchPlan) scanStored(r pgx.Rows) error {
	for r.Next() {
		var k string
		var x storedRow
		if err := r.Scan(&k, &x.fp, &x.res); err != nil {
			r.Close()
			return err
		}
		p.rows[k] = x
	}
	return r.Err()
}

// dedupBatch opens the savepoint (unless the caller owns tx), moves the
// batch's partition watermarks (watermark modes) and inserts every distinct
// key (keyed modes) in one round trip, then reads the stored rows of the keys
// that conflicted. On error the caller rolls back to the savepoint.
func (ib *Inbox) dedupBatch(ctx context.Context, tx querier, p *batchPlan, insert string, owned bool) error {
	b := &pgx.Batch{}
	if !owned {
		b.Queue(sqlSavepoint)
	}
	if ib.lockTimeout != "" {
		b.Queue(sqlSetLockTimeout, ib.lockTimeout)
	}
	if p.wm != nil {
		p.wm.queue(b, ib.consumer)
	}
	if ib.keyed {
		b.Queue(insert, ib.consumer, p.keys, p.topics, p.partitions, p.offsets, p.colFPs, p.recordAts, p.known)
	}
	if ib.lockTimeout != "" {
		b.Queue(sqlRestoreLockTimeout)
	}
	br := tx.SendBatch(ctx, b)
	if !owned {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return &savepointError{err: err}
		}
	}
	err := ib.readBatch(br, p)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil || !ib.keyed {
		return err
	}
	return ib.readConflicts(ctx, tx, p)
}

// readBatch reads the results of dedupBatch's pipeline after the savepoint.
func (ib *Inbox) readBatch(br pgx.BatchResults, p *batchPlan) error {
	if ib.lockTimeout != "" {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	if p.wm != nil {
		r, err := br.Query()
		if err == nil {
			err = p.wm.scan(r)
		}
		if err != nil {
			return err
		}
	}
	if ib.keyed {
		r, err := br.Query()
		if err == nil {
			err = p.scanInserted(r)
		}
		if err != nil {
			return err
		}
	}
	if ib.lockTimeout != "" {
		_, err := br.Exec()
		return err
	}
	return nil
}

// readConflicts reads the stored rows of keys that conflicted (a new
// statement, so rows committed by transactions the insert waited for are
// visible). A row deleted meanwhile (by a concurrent cleanup) is inserted
// again.
func (ib *Inbox) readConflicts(ctx context.Context, tx querier, p *batchPlan) error {
	for attempt := 0; len(p.rows) < len(p.keys); attempt++ {
		if attempt == maxVanished {
			return fmt.Errorf("keys conflicted but their rows kept vanishing (%d attempts)", maxVanished)
		}
		var missing, missingTopic []string
		var missingAt []pgtype.Timestamptz
		var missingPart []int32
		var missingOff []int64
		for i, k := range p.keys {
			if _, ok := p.rows[k]; !ok {
				missing, missingAt = append(missing, k), append(missingAt, p.recordAts[i])
				missingTopic, missingPart, missingOff = append(missingTopic, p.touchTopic(i)), append(missingPart, p.partitions[i]), append(missingOff, p.offsets[i])
			}
		}
		r, err := tx.Query(ctx, sqlTouchMany, ib.consumer, missing, missingAt, missingTopic, missingPart, missingOff)
		if err == nil {
			err = p.scanStored(r)
		}
		if err != nil {
			return err
		}
		if len(p.rows) == len(p.keys) {
			return nil
		}
		var mk, mt []string
		var mp []int32
		var mo []int64
		var mf [][]byte
		var mr []pgtype.Timestamptz
		var mn []bool
		for i, k := range p.keys {
			if _, ok := p.rows[k]; !ok {
				mk, mt, mp, mo, mf, mr = append(mk, k), append(mt, p.topics[i]), append(mp, p.partitions[i]),
					append(mo, p.offsets[i]), append(mf, p.colFPs[i]), append(mr, p.recordAts[i])
				mn = append(mn, p.known[i])
			}
		}
		if r, err = tx.Query(ctx, sqlInsertMany, ib.consumer, mk, mt, mp, mo, mf, mr, mn); err == nil {
			err = p.scanInserted(r)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkStored compares fingerprints against stored keys, before any handler
// runs.
func (ib *Inbox) checkStored(ms []Message, p *batchPlan) error {
	if !ib.keyed {
		return nil
	}
	for i, m := range ms {
		key := p.results[i].Key
		if p.first[key] != i || (p.wmDup != nil && p.wmDup[i]) {
			continue
		}
		if r := p.rows[key]; !r.inserted && mismatch(p.fps[i], r.fp) {
			ib.stats.mismatches.Add(1)
			return ib.msgErr(i, m, key, ErrFingerprintMismatch)
		}
	}
	return nil
}

// runBatch runs h, in input order, for each message whose key is new, then
// stores the results handlers set. On error it has rolled back to the
// savepoint (unless the caller owns tx).
func runBatch[T txKind](ctx context.Context, ib *Inbox, tx T, ms []Message, p *batchPlan, owned bool) error {
	fresh, dups := ib.triage(ms, p)
	slot := &resultSlot{}
	hctx := handlerCtx(ctx, slot, owned)
	for _, i := range fresh {
		*slot = resultSlot{}
		if err := tx.handle(hctx, ms[i]); err != nil {
			ib.stats.handlerErrors.Add(1)
			return undo(ctx, tx, owned, ib.msgErr(i, ms[i], p.results[i].Key, fmt.Errorf("handler: %w", err)))
		}
		if slot.set {
			p.results[i].Stored = slot.b
		}
	}
	return ib.finishBatch(ctx, tx, p, fresh, dups, owned)
}

// triage marks every message of ms that needs no handler (a later copy
// within the batch, at or below its partition's watermark, a key processed
// before) as a duplicate and returns the positions of the others, in input
// order, with the number of duplicates.
func (ib *Inbox) triage(ms []Message, p *batchPlan) (fresh []int, dups int) {
	for i := range ms {
		res := &p.results[i]
		if p.first[res.Key] != i { // a later copy within the batch: Stored is set by finishBatch
			res.Duplicate = true
			dups++
			continue
		}
		if p.wmDup != nil && p.wmDup[i] {
			res.Duplicate = true
			dups++
			continue
		}
		if p.gaps != nil && p.gaps[i] > 0 { // reported even when the key turns out a duplicate
			res.Gap = p.gaps[i]
			ib.stats.gaps.Add(1)
		}
		if r := p.rows[res.Key]; ib.keyed && !r.inserted {
			res.Duplicate, res.Stored = true, r.res
			dups++
			continue
		}
		fresh = append(fresh, i)
	}
	return fresh, dups
}

// finishBatch stores the results the handlers of the fresh messages set,
// hands them to later copies within the batch, and counts. On error it has
// rolled back to the savepoint (unless the caller owns tx).
func (ib *Inbox) finishBatch(ctx context.Context, tx execer, p *batchPlan, fresh []int, dups int, owned bool) error {
	var setKeys []string
	var setResults [][]byte
	for _, i := range fresh {
		if r := p.results[i]; r.Stored != nil {
			setKeys = append(setKeys, r.Key)
			setResults = append(setResults, r.Stored)
		}
	}
	if len(setKeys) > 0 {
		if _, err := tx.Exec(ctx, sqlSetResults, ib.consumer, setKeys, setResults); err != nil {
			return undo(ctx, tx, owned, fmt.Errorf("inbox: consumer %q: store results: %w", ib.consumer, err))
		}
	}
	for i := range p.results {
		if j := p.first[p.results[i].Key]; j != i {
			p.results[i].Stored = p.results[j].Stored
		}
	}
	ib.stats.processed.Add(uint64(len(fresh)))
	ib.stats.duplicates.Add(uint64(dups))
	return nil
}

// savepointError is a failure of the savepoint that opens a batch.
type savepointError struct{ err error }

func (e *savepointError) Error() string { return "savepoint: " + e.err.Error() }
func (e *savepointError) Unwrap() error { return e.err }
