package relay

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// nonNil is s, or an empty slice for nil (an empty array, not NULL).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Step 3 of a pass: record the sent batch's outcome (delete what Kafka
// acknowledged, count failures, park) and update the counters.

// tally is a sent batch's outcome, as the finish statement takes it.
type tally struct {
	okIDs, badIDs, badEpochs []int64
	okEvents, badEvents      []pgtype.UUID     // the rows' event ids, beside okIDs and badIDs (finishSQL)
	okTopics                 map[string]uint64 // published rows per topic
	badErrs                  []string
	badWaits                 []bool // the topic does not exist: parked after UnknownTopicWindow
	res                      passResult
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
			t.okEvents = append(t.okEvents, pgtype.UUID{Bytes: rows[i].eventID, Valid: true})
			if t.okTopics == nil {
				t.okTopics = map[string]uint64{}
			}
			t.okTopics[rows[i].topic]++
		case classify(e).fate != fateTransient:
			waits := r.cfg.UnknownTopicWindow > 0 && classify(e).fate == fateMissingTopic
			t.badIDs = append(t.badIDs, rows[i].id)
			t.badEvents = append(t.badEvents, pgtype.UUID{Bytes: rows[i].eventID, Valid: true})
			t.badEpochs = append(t.badEpochs, rows[i].epoch)
			t.badErrs = append(t.badErrs, e.Error())
			t.badWaits = append(t.badWaits, waits)
			r.failures.Add(1)
			// One line when a row starts failing; its later attempts are
			// counted in the periodic summary, and parking logs once more.
			level := slog.LevelDebug
			if rows[i].attempts == 0 {
				level = slog.LevelWarn
			}
			msg := "publish failed permanently; retrying up to max_attempts before parking the row"
			if waits {
				msg = "topic does not exist; retrying until the unknown-topic window has passed"
			}
			r.log.Log(context.Background(), level, msg, "topic", rows[i].topic, "row_id", rows[i].id,
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

// okSet is the set of published ids.
func (t *tally) okSet() map[int64]bool {
	m := make(map[int64]bool, len(t.okIDs))
	for _, id := range t.okIDs {
		m[id] = true
	}
	return m
}

// finishedBatch is a sent batch on its way to the finish statement.
type finishedBatch struct {
	tally
	rows                 int
	start, claimed, sent time.Time
}

// finishTimeout bounds the finish statement while the relay runs. It is
// far longer than any lease: a delete slowed by a checkpoint or an I/O stall
// that were cancelled at the lease's end would make the batch's rows be sent
// again, thousands of duplicates for one slow statement. Letting it finish
// costs nothing in order (its records are in Kafka) and duplicates at most
// what another owner claims meanwhile, which only happens if this instance
// also lost its lease: one batch. Once the relay is stopping, the statement
// gets StopTimeout more.
const finishTimeout = 2 * time.Minute

// finish records a batch's outcome in one statement (delete the published
// rows, count the failed ones' attempts) and updates the counters. It
// returns the statement's transaction id (floor.go).
func (r *Relay) finish(ctx context.Context, b *finishedBatch) (int64, error) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	stopping := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.StopTimeout, cancel)
		context.AfterFunc(fctx, func() { t.Stop() })
	})
	defer stopping()
	var deleted int
	var parkedIDs []int64
	var held int // failed rows parked by someone else while the batch was out
	var xid int64
	if err := r.db.queryRow(fctx, finishSQL, []any{b.okIDs, b.badIDs, b.badEpochs, b.badErrs, r.cfg.MaxAttempts,
		b.badWaits, max(r.cfg.UnknownTopicWindow, 0), nonNil(b.okEvents), nonNil(b.badEvents)}, &deleted, &parkedIDs, &held, &xid, nil); err != nil {
		// The records went out but the rows stay: they will be sent again
		// (same event ids). That is the at-least-once window.
		return 0, fmt.Errorf("record outcome of %d rows: %w", b.rows, err)
	}
	if deleted < len(b.okIDs) {
		r.log.Info("some of the batch's rows were gone when it finished: another instance took the lane during the batch (and may have sent them again), or they were deleted outside the relay (a discard, a DELETE or TRUNCATE)",
			"sent", len(b.okIDs), "deleted", deleted)
	}
	lat := time.Since(b.start)
	r.log.Debug("batch", "rows", b.rows, "published", len(b.okIDs), "claim", b.claimed.Sub(b.start), "send", b.sent.Sub(b.claimed), "finish", time.Since(b.sent))
	parked := len(parkedIDs)
	r.published.Add(uint64(len(b.okIDs)))
	r.countPublished(b.okTopics)
	r.retried.Add(uint64(len(b.badIDs) - parked - held))
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
	r.logParked(b, parkedIDs)
	return xid, nil
}

// logParked says, once per parked row, why it was parked: its topic did not
// exist for the whole unknown-topic window, or it failed MaxAttempts times.
func (r *Relay) logParked(b *finishedBatch, ids []int64) {
	if len(ids) == 0 {
		return
	}
	at := make(map[int64]int, len(b.badIDs))
	for i, id := range b.badIDs {
		at[id] = i
	}
	for _, id := range ids {
		i := at[id]
		reason := fmt.Sprintf("failed permanently %d times (max_attempts)", r.cfg.MaxAttempts)
		if b.badWaits[i] {
			reason = fmt.Sprintf("the topic did not exist for the whole unknown-topic window (%s)", r.cfg.UnknownTopicWindow)
		}
		r.log.Error("row parked; it holds its key's later rows until retried or discarded (relay parked)",
			"row_id", id, "reason", reason, "error", b.badErrs[i])
	}
}

// summaryEvery is how often the heartbeat sums up publish failures.
const summaryEvery = time.Minute

// summarize logs, at most every summaryEvery, how many permanent publish
// failures and parkings happened since the last summary: rows that keep
// failing are logged once when they start (tally) and once when parked, and
// counted here in between.
func (r *Relay) summarize(ctx context.Context) {
	if time.Since(r.summaryAt) < summaryEvery {
		return
	}
	r.summaryAt = time.Now()
	failures, parked := r.failures.Swap(0), r.parked.Load()
	if failures > 0 || parked > r.summaryParked {
		r.log.WarnContext(ctx, "publish failures since the last summary", "failed_attempts", failures,
			"parked", parked-r.summaryParked, "every", summaryEvery)
	}
	r.summaryParked = parked
}

// finishJob is a batch whose rows are being deleted in the background.
type finishJob struct {
	done      chan struct{}
	claim     *claimed
	published map[int64]bool // set once the outcome is recorded
	xid       int64          // the recording statement's transaction id
}

// waitFinish waits for the background delete, if any, and then moves the
// floors of the slots its claim probed.
func (r *Relay) waitFinish() {
	if r.fin != nil {
		<-r.fin.done
		if r.fin.published != nil {
			r.floors.recorded(r.fin.claim, r.fin.xid, r.fin.published)
		}
		r.fin = nil
	}
}
