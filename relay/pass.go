package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/outbox"
)

// workLoop runs passes until ctx ends.
func (r *Relay) workLoop(ctx context.Context, p *producer) {
	var (
		b         backoff
		busyUntil time.Time
		nextSlot  int
		full      = true // probe every owned slot, not just the ones named
		carry     slotSet
	)
	defer r.waitFinish()
	defer r.dropPrefetch()
	for {
		if ctx.Err() != nil {
			return
		}
		// A pass probes every owned slot, except right after a notification
		// or a non-full batch: then only the slots notifications named plus
		// the slots the last batch found rows in. Every poll probes them all,
		// so rows nobody notified about are found within PollInterval.
		var only *slotSet
		dirty, all := r.takeDirty()
		if !full && !all {
			dirty.union(&carry)
			only = &dirty
		}
		res := r.pass(ctx, p, &nextSlot, only)
		full, carry = true, slotSet{}
		var wait time.Duration
		switch {
		case res.err != nil || (res.failed > 0 && res.published == 0):
			wait = b.next(r.cfg.MaxBackoff)
			if res.err != nil && ctx.Err() == nil {
				r.log.WarnContext(ctx, "pass failed", "error", res.err, "backoff", wait)
			}
		case res.failed > 0:
			b = backoff{}
			wait = backoffMin // some rows went out: retry the rest soon
		case res.claimed > 0:
			b = backoff{}
			busyUntil = time.Now().Add(busyWindow)
			if res.claimed < r.cfg.BatchSize {
				full, carry = false, res.slots
			}
			continue // drain again at once
		default:
			wait = r.cfg.PollInterval
			if time.Now().Before(busyUntil) {
				wait = r.cfg.BusyPollInterval
			}
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
	slots                      slotSet // slots the batch had rows in
	err                        error
}

// pass claims one batch, sends it and records the outcome.
func (r *Relay) pass(ctx context.Context, p *producer, nextSlot *int, only *slotSet) passResult {
	start := time.Now()
	var rows []row
	var err error
	var gen int64
	if pre := r.pre; pre != nil {
		r.pre = nil
		<-pre.done
		rows, err, gen = pre.rows, pre.err, pre.gen
	}
	if err != nil || len(rows) == 0 {
		gen = r.leaseGen.Load()
		slots := allSlots(*nextSlot)
		if only != nil {
			if only.empty() {
				return passResult{}
			}
			slots = only.list(*nextSlot)
		}
		rows, err = r.claim(ctx, slots, r.finishingIDs(nil))
	}
	if err != nil {
		return passResult{err: fmt.Errorf("claim: %w", err)}
	}
	if len(rows) == 0 {
		return passResult{}
	}
	*nextSlot = (int(rows[len(rows)-1].slot) + 1) % outbox.Slots

	// A full-looking batch means a backlog: claim the next batch while this
	// one is sent, skipping this batch's rows (and those still being
	// deleted). It is used only if this batch goes out whole; otherwise a
	// key may have a failed row that its later rows must not overtake.
	if len(rows) >= rowsPerSlot && ctx.Err() == nil {
		exclude := make([]int64, 0, len(rows))
		for i := range rows {
			exclude = append(exclude, rows[i].id)
		}
		exclude = r.finishingIDs(exclude)
		job := &claimJob{done: make(chan struct{}), gen: r.leaseGen.Load()}
		first := *nextSlot
		go func() {
			defer close(job.done)
			job.rows, job.err = r.claim(ctx, allSlots(first), exclude)
		}()
		r.pre = job
	}

	claimed := time.Now()
	msgs := make([]*sarama.ProducerMessage, len(rows))
	for i := range rows {
		msgs[i] = toMessage(&rows[i], i)
	}
	outcome, stopped := r.sendChains(ctx, p, rows, msgs, gen)
	sentAt := time.Now()
	if stopped {
		r.dropPrefetch()
	}
	var (
		okIDs, okEpochs, badIDs, badEpochs []int64
		badErrs                            []string
		transient                          int
		firstErr                           error
	)
	for i := range rows {
		e, tried := outcome[i]
		switch {
		case !tried: // held back behind a failed row of its key, or stopping
		case e == nil:
			okIDs = append(okIDs, rows[i].id)
			okEpochs = append(okEpochs, rows[i].epoch)
		case permanent(e):
			badIDs = append(badIDs, rows[i].id)
			badEpochs = append(badEpochs, rows[i].epoch)
			badErrs = append(badErrs, e.Error())
			r.log.Warn("publish failed permanently", "topic", rows[i].topic, "row_id", rows[i].id,
				"event_id", rows[i].eventID.String(), "attempt", rows[i].attempts+1, "error", e)
		default:
			transient++
			if firstErr == nil {
				firstErr = e
			}
		}
	}
	res := passResult{claimed: len(rows), published: len(okIDs), failed: transient + len(badIDs)}
	for i := range rows {
		res.slots.add(int(rows[i].slot))
	}
	if transient > 0 {
		res.err = fmt.Errorf("send: %d of %d records failed, will retry: %w", transient, len(rows), firstErr)
	}
	r.retried.Add(uint64(transient))
	if len(okIDs) < len(rows) {
		r.dropPrefetch()
	}
	// One finish at a time: wait for the previous batch's.
	if r.fin != nil {
		<-r.fin.done
		r.fin = nil
	}
	if len(okIDs)+len(badIDs) == 0 {
		return res
	}
	// Record the outcome even when stopping: these records are in Kafka.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	finish := func() error {
		defer cancel()
		var deleted, parked int
		if err := r.cfg.Pool.QueryRow(fctx, finishSQL, okIDs, okEpochs, badIDs, badEpochs, badErrs, r.cfg.MaxAttempts).Scan(&deleted, &parked); err != nil {
			// The records went out but the rows stay: they will be sent again
			// (same event ids). That is the at-least-once window.
			return fmt.Errorf("record outcome of %d rows: %w", len(rows), err)
		}
		if deleted < len(okIDs) {
			r.log.Info("lane changed hands during the batch; the new owner may send some rows again", "sent", len(okIDs), "deleted", deleted)
		}
		lat := time.Since(start)
		r.log.Debug("batch", "rows", len(rows), "published", len(okIDs), "claim", claimed.Sub(start), "send", sentAt.Sub(claimed), "finish", time.Since(sentAt))
		r.published.Add(uint64(len(okIDs)))
		r.retried.Add(uint64(len(badIDs) - parked))
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
			r.log.Error("rows parked after repeated permanent failures", "rows", parked, "max_attempts", r.cfg.MaxAttempts)
		}
		return nil
	}
	if res.failed > 0 || ctx.Err() != nil {
		if err := finish(); err != nil {
			res.err = err
		}
		return res
	}
	// All went out: delete in the background while the next batch is claimed
	// and sent. The next claim skips these rows; if the delete fails they
	// are found again later and sent again (same event ids, after their
	// key's earlier records, so a deduping consumer sees the same order).
	job := &finishJob{done: make(chan struct{}), ids: okIDs}
	go func() {
		defer close(job.done)
		if err := finish(); err != nil && ctx.Err() == nil {
			r.log.Warn("recording a batch failed; its rows will be sent again", "error", err)
		}
	}()
	r.fin = job
	return res
}

// claimJob is the next batch, claimed while the current one is sent.
type claimJob struct {
	done chan struct{}
	rows []row
	err  error
	gen  int64 // lease generation at claim time
}

func (r *Relay) dropPrefetch() {
	if r.pre != nil {
		<-r.pre.done
		r.pre = nil
	}
}

// finishingIDs appends the ids whose background delete is still running.
func (r *Relay) finishingIDs(ids []int64) []int64 {
	if r.fin == nil {
		return ids
	}
	select {
	case <-r.fin.done:
		r.fin = nil
		return ids
	default:
		return append(ids, r.fin.ids...) // acknowledged, delete still running
	}
}

// finishJob is a batch whose rows are being deleted in the background.
type finishJob struct {
	done chan struct{}
	ids  []int64
}

// waitFinish waits for the background delete, if any.
func (r *Relay) waitFinish() {
	if r.fin != nil {
		<-r.fin.done
		r.fin = nil
	}
}

// sendChains sends a batch so that no record can overtake an earlier record
// of its key: each (topic, key) is a chain of rows in id order with at most
// one row in flight; a row goes out when the previous row of its key is
// acknowledged, and once a row fails the rest of its key waits for the next
// pass. Different keys' chains run concurrently, so the producer still
// batches. One SendMessages of the whole batch could not promise this:
// sarama fails a message whose partition leader it cannot find at that
// moment and goes on with the next one, which may then succeed.
//
// It returns each tried row's error (nil: acknowledged). If ctx is canceled
// it sends nothing more and waits up to StopTimeout for the rows in flight;
// rows still unanswered then are left out (stopped is true) and stay in the
// outbox. It also sends nothing more once the leases the rows were claimed
// under may have run out (no heartbeat succeeded for LeaseTTL, e.g. the
// process was paused).
func (r *Relay) sendChains(ctx context.Context, p *producer, rows []row, msgs []*sarama.ProducerMessage, gen int64) (outcome map[int]error, stopped bool) {
	outcome = make(map[int]error, len(rows))
	results := make(chan result, len(rows)) // never blocks the router
	keyOf := func(i int) string {
		if rows[i].key == nil {
			return "\x00nokey" + strconv.Itoa(i) // no key, no order to keep
		}
		return rows[i].topic + "\x00" + string(rows[i].key)
	}
	chains := map[string][]int{}
	var ready []int
	for i := range rows {
		msgs[i].Metadata = tag{idx: i, out: results}
		k := keyOf(i)
		if _, ok := chains[k]; !ok {
			ready = append(ready, i) // the head of each chain goes first
			chains[k] = []int{}
			continue
		}
		chains[k] = append(chains[k], i)
	}
	inflight := 0
	leaseLost := false
	var stopTimer <-chan time.Time
	done := ctx.Done()
	for len(ready) > 0 || inflight > 0 {
		var in chan<- *sarama.ProducerMessage
		var next *sarama.ProducerMessage
		if len(ready) > 0 && !leaseLost && !r.leaseHeld(gen) {
			// Paused or cut off past the lease: another instance may own
			// these lanes now. Send nothing more; the rows stay.
			leaseLost = true
			r.log.Warn("lease may have run out; holding back the rest of the batch", "rows", len(ready))
		}
		if len(ready) > 0 && stopTimer == nil && !leaseLost {
			in, next = p.input(), msgs[ready[0]]
		} else if inflight == 0 {
			break // stopping, nothing in flight
		}
		select {
		case in <- next:
			ready = ready[1:]
			inflight++
		case res := <-results:
			inflight--
			outcome[res.idx] = res.err
			if res.err == nil {
				k := keyOf(res.idx)
				if c := chains[k]; len(c) > 0 {
					ready = append(ready, c[0])
					chains[k] = c[1:]
				}
			}
		case <-done:
			done = nil
			t := time.NewTimer(r.cfg.StopTimeout)
			defer t.Stop()
			stopTimer = t.C
		case <-stopTimer:
			r.log.Warn("stop: gave up waiting for records in flight; their rows stay in the outbox", "rows", inflight)
			return outcome, true
		}
	}
	return outcome, stopTimer != nil || leaseLost
}

// producer is a sarama AsyncProducer whose results are routed back to the
// batch that sent each message (ProducerMessage.Metadata holds a tag).
type producer struct {
	ap     sarama.AsyncProducer
	routed chan struct{} // closed when the producer's result channels are drained and closed
}

type tag struct {
	idx int
	out chan<- result
}

type result struct {
	idx int
	err error
}

func newProducer(brokers []string, cfg *sarama.Config) (*producer, error) {
	ap, err := sarama.NewAsyncProducer(brokers, cfg)
	if err != nil {
		return nil, err
	}
	p := &producer{ap: ap, routed: make(chan struct{})}
	go p.route()
	return p, nil
}

func (p *producer) input() chan<- *sarama.ProducerMessage { return p.ap.Input() }

func (p *producer) route() {
	defer close(p.routed)
	succ, errs := p.ap.Successes(), p.ap.Errors()
	for succ != nil || errs != nil {
		select {
		case m, ok := <-succ:
			if !ok {
				succ = nil
				continue
			}
			if t, ok := m.Metadata.(tag); ok {
				t.out <- result{idx: t.idx}
			}
		case e, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			if t, ok := e.Msg.Metadata.(tag); ok {
				t.out <- result{idx: t.idx, err: e.Err}
			}
		}
	}
}

// close flushes what is buffered and stops the producer.
func (p *producer) close() {
	p.ap.AsyncClose()
	<-p.routed
}

func (r *Relay) claim(ctx context.Context, slots []int32, exclude []int64) ([]row, error) {
	if exclude == nil {
		exclude = []int64{}
	}
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, r.id, r.cfg.BatchSize, r.cfg.Lanes, slots, rowsPerSlot, exclude)
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

func toMessage(x *row, i int) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: x.topic, Metadata: i}
	if x.key != nil {
		m.Key = sarama.ByteEncoder(x.key)
	}
	if x.value != nil {
		m.Value = sarama.ByteEncoder(x.value)
	}
	m.Headers = make([]sarama.RecordHeader, 0, len(x.headers)+2)
	for _, h := range x.headers {
		if h.Key == EventIDHeader || h.Key == CreatedAtHeader {
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

// permanent reports whether a send error will not go away by retrying: the
// record or its topic is wrong. Everything else (broker down, leader
// moving, timeouts) is transient and never parks a row.
func permanent(err error) bool {
	var cerr sarama.ConfigurationError
	if errors.As(err, &cerr) { // e.g. larger than Producer.MaxMessageBytes
		return true
	}
	for _, k := range []sarama.KError{
		sarama.ErrMessageSizeTooLarge, sarama.ErrUnknownTopicOrPartition, sarama.ErrInvalidTopic,
		sarama.ErrTopicAuthorizationFailed, sarama.ErrMessageSetSizeTooLarge, sarama.ErrInvalidRecord,
		sarama.ErrPolicyViolation,
	} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

const backoffMin = 100 * time.Millisecond

// backoff is capped exponential backoff with jitter.
type backoff struct{ d time.Duration }

func (b *backoff) next(limit time.Duration) time.Duration {
	if b.d == 0 {
		b.d = backoffMin
	} else {
		b.d = min(2*b.d, limit)
	}
	return b.d/2 + rand.N(b.d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
