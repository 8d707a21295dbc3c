package relay

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/outbox"
)

// workLoop runs passes until ctx ends, or a pass fails in a way retrying
// cannot fix (then it stops Run through stop).
func (r *Relay) workLoop(ctx context.Context, p *producer, stop context.CancelCauseFunc) {
	var (
		b         = backoff.Backoff{Base: backoffMin, Limit: r.cfg.MaxBackoff}
		busyUntil time.Time
		nextSlot  int
		full      = true // probe every owned slot, not just the ones named
		carry     slotSet
		w         watcher
	)
	defer r.waitFinish()
	r.startWatch(ctx, &w)
	for {
		if ctx.Err() != nil {
			return
		}
		// A pass probes every owned slot, except right after a notification,
		// a watch that found rows or a non-full batch: then only the slots
		// named plus the slots the last batch found rows in. Every poll
		// probes them all, so rows nobody named are found within
		// PollInterval.
		var only *slotSet
		dirty, all := r.takeDirty()
		if !full && !all {
			dirty.union(&carry)
			only = &dirty
		}
		res := r.pass(ctx, p, &nextSlot, only)
		w.saw(res.maxID)
		switch {
		case res.published > 0:
			r.kafkaUp(ctx)
		case res.kafkaFailed:
			r.kafkaDown()
		}
		full, carry = true, slotSet{}
		var wait time.Duration
		switch {
		case res.err != nil || (res.failed > 0 && res.published == 0):
			if res.err != nil && r.stopOn("pass", res.err, stop) {
				return
			}
			wait = b.Next()
			if res.err != nil && ctx.Err() == nil {
				r.log.WarnContext(ctx, "pass failed", "error", res.err, "backoff", wait)
			}
		case res.failed > 0:
			b.Reset()
			wait = backoffMin // some rows went out: retry the rest soon
		case res.claimed > 0:
			b.Reset()
			busyUntil = time.Now().Add(busyWindow)
			r.awake(ctx, &w)
			if res.claimed < r.cfg.BatchSize {
				full, carry = false, res.slots
			}
			continue // drain again at once
		default:
			full = r.waitForWork(ctx, &w, busyUntil)
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
			full = false
		case <-t.C:
		}
		t.Stop()
	}
}

type row struct {
	id        int64
	eventID   outbox.EventID
	slot      int16
	topic     string
	key       []byte
	value     []byte
	headers   []outbox.Header
	createdAt time.Time
	attempts  int32
	epoch     int64
}

type passResult struct {
	claimed, published, failed int
	kafkaFailed                bool    // every send failed for a reason retrying may fix
	maxID                      int64   // the newest row claimed
	slots                      slotSet // slots the batch had rows in
	err                        error
}

// minRowsPerSlot is the least a claim takes from one slot.
const minRowsPerSlot = 16

// claimPerSlot is the most rows one claim takes from one slot, so that a
// batch spans several slots when a backlog is spread over many, while a few
// hot keys still fill a batch.
func (r *Relay) claimPerSlot() int { return max(minRowsPerSlot, r.cfg.BatchSize/4) }

// pass claims one batch, sends it and records the outcome.
func (r *Relay) pass(ctx context.Context, p *producer, nextSlot *int, only *slotSet) passResult {
	start := time.Now()
	rows, gen, err := r.takeBatch(ctx, *nextSlot, only)
	if err != nil {
		return passResult{err: fmt.Errorf("claim: %w", err)}
	}
	if len(rows) == 0 {
		return passResult{}
	}
	*nextSlot = (int(rows[len(rows)-1].slot) + 1) % outbox.Slots

	claimed := time.Now()
	outcome, _ := r.sendBatch(ctx, p, rows, gen)
	t := r.tally(rows, outcome)
	r.waitFinish() // one finish at a time
	if len(t.okIDs)+len(t.badIDs) == 0 {
		return t.res
	}
	b := finishedBatch{tally: t, rows: len(rows), start: start, claimed: claimed, sent: time.Now()}
	// Record the outcome even when stopping: these records are in Kafka.
	if t.res.failed > 0 || ctx.Err() != nil {
		if err := r.finish(ctx, &b); err != nil {
			t.res.err = err
		}
		return t.res
	}
	// All went out: delete in the background; the next claim waits for it
	// (see takeBatch). If the delete fails the rows are found again and sent
	// again (same event ids, after their key's earlier records, so a deduping
	// consumer sees the same order).
	job := &finishJob{done: make(chan struct{})}
	go func() {
		defer close(job.done)
		if err := r.finish(ctx, &b); err != nil && ctx.Err() == nil {
			r.log.Warn("recording a batch failed; its rows will be sent again", "error", err)
		}
	}()
	r.fin = job
	return t.res
}

// takeBatch claims from the slots in rotation from nextSlot (only the ones in
// only, if given).
func (r *Relay) takeBatch(ctx context.Context, nextSlot int, only *slotSet) ([]row, int64, error) {
	gen := r.leaseGen.Load()
	slots := allSlots(nextSlot)
	if only != nil {
		if only.empty() {
			return nil, gen, nil
		}
		slots = only.list(nextSlot)
	}
	// The claim sees every row, late commits too, once the previous batch's
	// rows are gone: no claim skips rows by id (see claimSQL).
	r.waitFinish()
	rows, err := r.claim(ctx, slots)
	return rows, gen, err
}

// tally is a sent batch's outcome, as the finish statement takes it.
type tally struct {
	okIDs, okEpochs, badIDs, badEpochs []int64
	badErrs                            []string
	badWaits                           []bool // the topic does not exist: parked after UnknownTopicWindow
	res                                passResult
}

func (r *Relay) tally(rows []row, outcome map[int]error) tally {
	var t tally
	var transient int
	var firstErr error
	for i := range rows {
		e, tried := outcome[i]
		t.res.slots.add(int(rows[i].slot))
		t.res.maxID = max(t.res.maxID, rows[i].id)
		switch {
		case !tried: // held back behind a failed row of its key, or stopping
		case e == nil:
			t.okIDs = append(t.okIDs, rows[i].id)
			t.okEpochs = append(t.okEpochs, rows[i].epoch)
		case classify(e).fate != fateTransient:
			waits := r.cfg.UnknownTopicWindow > 0 && classify(e).fate == fateMissingTopic
			t.badIDs = append(t.badIDs, rows[i].id)
			t.badEpochs = append(t.badEpochs, rows[i].epoch)
			t.badErrs = append(t.badErrs, e.Error())
			t.badWaits = append(t.badWaits, waits)
			msg := "publish failed permanently"
			if waits {
				msg = "topic does not exist; retrying until the unknown-topic window has passed"
			}
			r.log.Warn(msg, "topic", rows[i].topic, "row_id", rows[i].id,
				"event_id", rows[i].eventID.String(), "attempt", rows[i].attempts+1, "error", e)
		default:
			transient++
			firstErr = cmp.Or(firstErr, e)
		}
	}
	t.res.claimed, t.res.published, t.res.failed = len(rows), len(t.okIDs), transient+len(t.badIDs)
	if transient > 0 {
		t.res.kafkaFailed = len(t.okIDs) == 0
		t.res.err = fmt.Errorf("send: %d of %d records failed, will retry: %w", transient, len(rows), firstErr)
	}
	r.retried.Add(uint64(transient))
	return t
}

// finishedBatch is a sent batch on its way to the finish statement.
type finishedBatch struct {
	tally
	rows                 int
	start, claimed, sent time.Time
}

// finish records a batch's outcome in one statement (delete the published
// rows, count the failed ones' attempts) and updates the counters.
func (r *Relay) finish(ctx context.Context, b *finishedBatch) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	defer cancel()
	var deleted, parked int
	if err := r.cfg.Pool.QueryRow(fctx, finishSQL, b.okIDs, b.okEpochs, b.badIDs, b.badEpochs, b.badErrs, r.cfg.MaxAttempts,
		b.badWaits, max(r.cfg.UnknownTopicWindow, 0)).Scan(&deleted, &parked, nil); err != nil {
		// The records went out but the rows stay: they will be sent again
		// (same event ids). That is the at-least-once window.
		return fmt.Errorf("record outcome of %d rows: %w", b.rows, err)
	}
	if deleted < len(b.okIDs) {
		r.log.Info("lane changed hands during the batch; the new owner may send some rows again", "sent", len(b.okIDs), "deleted", deleted)
	}
	lat := time.Since(b.start)
	r.log.Debug("batch", "rows", b.rows, "published", len(b.okIDs), "claim", b.claimed.Sub(b.start), "send", b.sent.Sub(b.claimed), "finish", time.Since(b.sent))
	r.published.Add(uint64(len(b.okIDs)))
	r.retried.Add(uint64(len(b.badIDs) - parked))
	r.parked.Add(uint64(parked))
	r.batches.Add(1)
	r.latLast.Store(int64(lat))
	r.latTotal.Add(int64(lat))
	for {
		m := r.latMax.Load()
		if int64(lat) <= m || r.latMax.CompareAndSwap(m, int64(lat)) {
			break
		}
	}
	if parked > 0 {
		r.log.Error("rows parked after repeated permanent failures; each holds its key's later rows until retried or discarded (relay parked)",
			"rows", parked, "max_attempts", r.cfg.MaxAttempts)
	}
	return nil
}

// finishJob is a batch whose rows are being deleted in the background.
type finishJob struct {
	done chan struct{}
}

// waitFinish waits for the background delete, if any.
func (r *Relay) waitFinish() {
	if r.fin != nil {
		<-r.fin.done
		r.fin = nil
	}
}

// claim reads the next batch from slots, in slot order, skipping in each
func (r *Relay) claim(ctx context.Context, slots []int32) ([]row, error) {
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.id, r.cfg.BatchSize, r.cfg.Lanes, slots, r.claimPerSlot())
	if err != nil {
		return nil, err
	}
	out := make([]row, 0, 64)
	for rows.Next() {
		var x row
		if err := rows.Scan(&x.id, &x.eventID, &x.slot, &x.topic, &x.key, &x.value, &x.headers, &x.createdAt, &x.attempts, &x.epoch); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

func toMessage(x *row) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: x.topic}
	if x.key != nil {
		m.Key = sarama.ByteEncoder(x.key)
	}
	if x.value != nil {
		m.Value = sarama.ByteEncoder(x.value)
	}
	m.Headers = make([]sarama.RecordHeader, 0, len(x.headers)+2)
	for _, h := range x.headers {
		if outbox.Reserved(h.Key) { // outbox.Write refuses them; rows written otherwise get the relay's
			continue
		}
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	m.Headers = append(m.Headers,
		sarama.RecordHeader{Key: []byte(EventIDHeader), Value: []byte(x.eventID.String())},
		sarama.RecordHeader{Key: []byte(CreatedAtHeader), Value: []byte(x.createdAt.UTC().Format(time.RFC3339Nano))},
	)
	return m
}

const backoffMin = 100 * time.Millisecond
