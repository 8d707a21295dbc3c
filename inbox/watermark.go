package inbox

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// partitionKey names one partition of one topic.
type partitionKey struct {
	topic     string
	partition int32
}

// wmPlan is a ProcessBatch call's watermark step: one row per partition of
// the batch, carrying its highest offset, and what the update returned.
type wmPlan struct {
	index      map[partitionKey]int
	topics     []string
	partitions []int32
	topicIDs   []string
	offsets    []int64
	// moved holds, per partition whose watermark moved, the offset it held
	// before (NULL for a new row or topic incarnation). A partition absent
	// from it did not move: every message of it is at or below the
	// watermark.
	moved map[partitionKey]pgtype.Int8
}

// planWatermark collects the batch's partitions. Each partition's messages
// must come in offset order (repeats allowed): a watermark cannot tell a
// message that went back from one already processed.
func (ib *Inbox) planWatermark(ms []Message) (*wmPlan, error) {
	w := &wmPlan{index: map[partitionKey]int{}, moved: map[partitionKey]pgtype.Int8{}}
	for i, m := range ms {
		k := partitionKey{m.Topic, m.Partition}
		j, ok := w.index[k]
		if !ok {
			w.index[k] = len(w.topics)
			w.topics, w.partitions = append(w.topics, m.Topic), append(w.partitions, m.Partition)
			w.topicIDs, w.offsets = append(w.topicIDs, m.TopicID), append(w.offsets, m.Offset)
			continue
		}
		if m.Offset < w.offsets[j] {
			ib.stats.invalid.Add(1)
			return nil, ib.msgErr(i, m, "", fmt.Errorf("%w: offset %d comes after offset %d of the same partition in the batch "+
				"(with %v each partition's messages must be in offset order)", ErrInvalidMessage, m.Offset, w.offsets[j], DedupWatermark))
		}
		w.offsets[j], w.topicIDs[j] = m.Offset, m.TopicID
	}
	return w, nil
}

func (w *wmPlan) queue(b *pgx.Batch, consumer string) {
	b.Queue(sqlWatermarkMany, consumer, w.topics, w.partitions, w.topicIDs, w.offsets)
}

// scan records the partitions whose watermark moved.
func (w *wmPlan) scan(r pgx.Rows) error {
	for r.Next() {
		var k partitionKey
		var prev pgtype.Int8
		if err := r.Scan(&k.topic, &k.partition, &prev); err != nil {
			r.Close()
			return err
		}
		w.moved[k] = prev
	}
	return r.Err()
}

// decide marks, per message, whether it is at or below its partition's
// watermark (or an earlier message of the batch), and the gap before it.
func (w *wmPlan) decide(ms []Message) (dup []bool, gap []int64) {
	dup, gap = make([]bool, len(ms)), make([]int64, len(ms))
	last := make(map[partitionKey]int64, len(w.topics))
	for i, m := range ms {
		k := partitionKey{m.Topic, m.Partition}
		prev, moved := w.moved[k]
		if !moved {
			dup[i] = true
			continue
		}
		before, seen := last[k]
		if !seen && prev.Valid {
			before, seen = prev.Int64, true
		}
		switch {
		case seen && m.Offset <= before:
			dup[i] = true
			continue
		case seen && m.Offset > before+1:
			gap[i] = m.Offset - before - 1
		}
		last[k] = m.Offset
	}
	return dup, gap
}
