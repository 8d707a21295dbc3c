package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/internal/backoff"
	"github.com/pgbox/pgbox/outbox"
)

// Step 2 of a pass: send the claimed rows to Kafka, in order per key, over
// the producer (producer.go).

// maxRoundBytes bounds the record bytes of one round of requests, well below
// sarama.MaxRequestSize; partitions beyond it wait for the next round.
const maxRoundBytes = 16 << 20

// recordBatchOverhead is a record batch's own bytes (its header), counted
// against Producer.MaxMessageBytes like sarama does.
const recordBatchOverhead = 61

// sendBatch publishes one pass's rows so that no record can overtake an
// earlier record of its key, with many records of a key in flight at once.
//
// A key's rows all go to one partition. Each partition's rows (in id order)
// are cut into record batches of up to Producer.MaxMessageBytes, and sent in
// rounds: at most one batch per partition a round, in one request per
// leader broker (a Fleet's request may carry other targets' batches too,
// and a batch whose partition one of theirs fills waits for the next:
// sendQueue), brokers concurrently. The broker writes a batch
// whole or not at all, so within a partition a failure is a clean cut:
// everything before it is written, nothing after it was sent. A batch that
// fails with a retriable error (leader moving or missing, timeout, broken
// connection) is sent again as the same batch with the same sequence (the
// broker drops it if the first try was written), up to Producer.Retry.Max
// times; then its rows fail and the rest of that partition waits for the
// next pass. A batch the broker rejects as such (too large for the broker,
// invalid record, policy) is sent again one row per batch, so that only the
// bad row fails: later rows of its key wait for the next pass (they go once
// it is parked), other keys go on. A row larger than Producer.MaxMessageBytes,
// or whose topic is unknown, fails without being sent, with the same effect.
//
// It returns each tried row's error (nil: acknowledged); rows left out were
// held back. If ctx is canceled it sends nothing more and waits up to
// StopTimeout for the round in flight; if that is not answered by then the
// round's rows are left out and stopped is true. It also sends nothing more
// once the leases the rows were claimed under may have run out.
func (r *Relay) sendBatch(ctx context.Context, p *producer, rows []row, gen int64) (outcome map[int]error, stopped bool) {
	s := r.planSend(ctx, p, rows)
	for {
		if ctx.Err() != nil {
			return s.outcome, true
		}
		if !r.leaseHeld(gen) {
			// Paused or cut off past the lease: another instance may own
			// these lanes now. Send nothing more; the rows stay.
			r.log.Warn("lease may have run out; holding back the rest of the batch", "rows", s.pending())
			return s.outcome, true
		}
		chunks := s.nextChunks()
		if len(chunks) == 0 {
			return s.outcome, false
		}
		if err := p.renew(ctx); err != nil {
			for _, c := range chunks {
				s.fail(c, err)
			}
			continue
		}
		results, ok := r.roundTrip(ctx, p, chunks)
		if !ok {
			p.stale = true // a batch may still land under the old id
			return s.outcome, true
		}
		for _, res := range results {
			if errors.Is(res.err, sarama.ErrOutOfBrokers) {
				p.stale = true // renew reconnects when no broker answers
			}
		}
		if retry := s.apply(results); len(retry) > 0 {
			p.refresh(ctx, retry)
			if !backoff.Sleep(ctx, p.conf.Producer.Retry.Backoff) {
				return s.outcome, true
			}
		}
	}
}

// planSend builds every row's record and partition queue. Rows that cannot
// be sent (too large, topic unknown) fail here, and their keys' later rows
// are held back.
func (r *Relay) planSend(ctx context.Context, p *producer, rows []row) *sendState {
	s := &sendState{p: p, rows: rows, recs: make([]*sarama.Record, len(rows)), sizes: make([]int, len(rows)),
		outcome: make(map[int]error, len(rows)), queues: map[topicPartition]*partQueue{}, blocked: map[string]bool{}}
	type topicParts struct {
		parts []int32
		err   error
	}
	topics := map[string]topicParts{} // each topic's metadata, looked up once per pass
	limit := p.conf.Producer.MaxMessageBytes
	for i := range rows {
		x := &rows[i]
		if s.blocked[keyOf(x, i)] {
			continue
		}
		m := toMessage(x)
		size := m.ByteSize(2)
		if size > limit { // sarama's own producer's check, in sarama's words
			s.failRow(i, sarama.ConfigurationError(fmt.Sprintf(
				"Attempt to produce message larger than configured Producer.MaxMessageBytes: %d > %d", size, limit)))
			continue
		}
		tps, seen := topics[x.topic]
		if !seen {
			tps.parts, tps.err = p.partitions(ctx, x.topic)
			topics[x.topic] = tps
		}
		part, err := int32(-1), tps.err
		if err == nil {
			part, err = p.partition(m, tps.parts)
		}
		if err != nil {
			s.failRow(i, fmt.Errorf("topic %s: %w", x.topic, err))
			continue
		}
		s.recs[i], s.sizes[i] = toRecord(m), size
		tp := topicPartition{x.topic, part}
		q := s.queues[tp]
		if q == nil {
			q = &partQueue{}
			s.queues[tp] = q
			s.order = append(s.order, tp)
		}
		q.rows = append(q.rows, i)
	}
	return s
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

func toRecord(m *sarama.ProducerMessage) *sarama.Record {
	rec := &sarama.Record{Headers: make([]*sarama.RecordHeader, len(m.Headers))}
	for i := range m.Headers {
		rec.Headers[i] = &m.Headers[i]
	}
	if m.Key != nil {
		rec.Key, _ = m.Key.Encode()
	}
	if m.Value != nil {
		rec.Value, _ = m.Value.Encode()
	}
	return rec
}

// keyOf names a row's order domain: its topic and key (keyless rows have no
// order to keep).
func keyOf(x *row, i int) string {
	if x.key == nil {
		return "\x00nokey" + strconv.Itoa(i)
	}
	return x.topic + "\x00" + string(x.key)
}

func (s *sendState) failRow(i int, err error) {
	s.outcome[i] = err
	s.blocked[keyOf(&s.rows[i], i)] = true
}

// sendState is one sendBatch's bookkeeping.
type sendState struct {
	p       *producer
	rows    []row
	recs    []*sarama.Record
	sizes   []int
	outcome map[int]error
	queues  map[topicPartition]*partQueue
	order   []topicPartition // partitions in first-seen order
	blocked map[string]bool  // keys with a failed row: their later rows wait
}

// partQueue is one partition's rows not yet written.
type partQueue struct {
	rows   []int  // pending rows, id order
	head   *chunk // the batch in flight or being retried
	tries  int    // failed tries of head
	single bool   // the broker rejected a batch: one row per batch from now on
	done   bool   // a batch failed: the rest waits for the next pass
}

// nextChunks returns the next batch of every partition with rows left (the
// batch being retried, if any), up to maxRoundBytes in all.
func (s *sendState) nextChunks() []*chunk {
	var out []*chunk
	total := 0
	limit := s.p.conf.Producer.MaxMessageBytes
	for _, tp := range s.order {
		q := s.queues[tp]
		if q.done {
			continue
		}
		if q.head == nil {
			q.head = s.cut(tp, q, limit)
		}
		if q.head == nil {
			continue
		}
		if total > 0 && total+q.head.bytes > maxRoundBytes {
			break
		}
		total += q.head.bytes
		out = append(out, q.head)
	}
	return out
}

// cut takes the next batch off q: rows in order, skipping (holding back)
// rows of blocked keys, until the batch would exceed limit bytes.
func (s *sendState) cut(tp topicPartition, q *partQueue, limit int) *chunk {
	c := &chunk{tp: tp, bytes: recordBatchOverhead}
	n := 0
	for _, i := range q.rows {
		if s.blocked[keyOf(&s.rows[i], i)] {
			n++
			continue
		}
		if len(c.rows) > 0 && (q.single || c.bytes+s.sizes[i] > limit) {
			break
		}
		c.rows = append(c.rows, i)
		c.recs = append(c.recs, s.recs[i])
		c.bytes += s.sizes[i]
		n++
	}
	q.rows = q.rows[n:]
	if len(c.rows) == 0 {
		return nil
	}
	return c
}

// roundTrip sends chunks and waits for every answer; once ctx is canceled it
// waits at most StopTimeout more (ok is false if it gave up).
func (r *Relay) roundTrip(ctx context.Context, p *producer, chunks []*chunk) (results []chunkResult, ok bool) {
	out := make(chan chunkResult, len(chunks))
	p.produce(chunks, out)
	results = make([]chunkResult, 0, len(chunks))
	done := ctx.Done()
	var stopTimer <-chan time.Time
	for len(results) < len(chunks) {
		select {
		case res := <-out:
			results = append(results, res)
		case <-done:
			done = nil
			t := time.NewTimer(r.cfg.StopTimeout)
			defer t.Stop()
			stopTimer = t.C
		case <-stopTimer:
			n := 0
			for _, c := range chunks {
				n += len(c.rows)
			}
			r.log.Warn("stop: gave up waiting for records in flight; their rows stay in the outbox", "rows", n)
			return nil, false
		}
	}
	return results, true
}

// apply records a round's answers and returns the topics of batches to
// send again.
func (s *sendState) apply(results []chunkResult) (retry []string) {
	for _, res := range results {
		c := res.c
		q := s.queues[c.tp]
		switch {
		case res.err == nil:
			s.p.seq[c.tp] += int32(len(c.rows))
			for _, i := range c.rows {
				s.outcome[i] = nil
			}
			q.head, q.tries = nil, 0
		case retriable(res) && q.tries < s.p.conf.Producer.Retry.Max:
			q.tries++
			if classify(res.err).newID {
				s.p.stale = true
			}
			retry = append(retry, c.tp.topic)
		case len(c.rows) > 1 && classify(res.err).split:
			// Nothing of it was written: send its rows one per batch to find
			// the bad one(s).
			q.rows = append(c.rows, q.rows...)
			q.head, q.tries, q.single = nil, 0, true
			s.p.stale = true
		default:
			s.fail(c, res.err)
		}
	}
	return retry
}

// fail records a batch that will not be written in this pass. After a
// permanent failure (one bad row) the partition's other keys go on; after
// a transient one the whole partition waits for the next pass.
func (s *sendState) fail(c *chunk, err error) {
	err = fmt.Errorf("topic %s partition %d: %w", c.tp.topic, c.tp.partition, err)
	for _, i := range c.rows {
		s.failRow(i, err)
	}
	q := s.queues[c.tp]
	q.head, q.tries = nil, 0
	if classify(err).fate == fateTransient {
		q.done = true
	}
	s.p.stale = true
}

// pending counts rows not yet answered.
func (s *sendState) pending() int {
	n := 0
	for _, q := range s.queues {
		if !q.done {
			n += len(q.rows)
			if q.head != nil {
				n += len(q.head.rows)
			}
		}
	}
	return n
}
