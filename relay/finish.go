package relay

import (
	"cmp"
	"context"
	"fmt"
	"time"
)

// Step 3 of a pass: record the sent batch's outcome (delete what Kafka
// acknowledged, count failures, park) and update the counters.

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
