package consume_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// handmade is the consumer a team writes instead of pgbox, on either
// client: with dedup, its own table and INSERT … ON CONFLICT DO NOTHING
// (batched: = ANY, then insert); without, the business INSERTs alone. With
// batchWrite, a batch's business rows go in one statement.
//
// It is written as a competent team writes it, not slowed down: the
// batched form checks and inserts a batch's keys in two statements (not
// one per key) and, with batchWrite, writes the business rows in one; it
// does not pipeline BEGIN with the first statement (pgx.BeginFunc, as
// services do), which the adapters do: one round trip per transaction is
// theirs to win.
type handmade struct {
	env        *benchEnv
	group      string
	batch      int
	dedup      bool
	batchWrite bool
}

// handmade is the hand-written consumer of kind: "handwritten",
// "handwritten-batchwrite", "price-of-exactly-once" or
// "nodedup-batchwrite" (no dedup, a batch's rows in one statement).
func (env *benchEnv) handmade(kind, group string, batch int) *handmade {
	return &handmade{env: env, group: group, batch: batch,
		dedup:      kind != "price-of-exactly-once" && kind != "nodedup-batchwrite",
		batchWrite: kind == "handwritten-batchwrite" || kind == "nodedup-batchwrite"}
}

// rec is a record of either client, as the hand-written consumer uses it.
type rec struct {
	event, topic string
	partition    int32
	offset       int64
}

// process commits one batch (one record at batch 1).
func (h *handmade) process(ctx context.Context, rs []rec) error {
	if !h.dedup && len(rs) == 1 {
		r := rs[0]
		_, err := h.env.pool.Exec(ctx, benchInsert, r.event, r.topic, r.partition, r.offset)
		return err
	}
	return pgx.BeginFunc(ctx, h.env.pool, func(tx pgx.Tx) error {
		fresh := rs
		switch {
		case h.dedup && len(rs) == 1:
			tag, err := tx.Exec(ctx, benchDedupOne, h.group+":"+rs[0].event)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				fresh = nil
			}
		case h.dedup:
			var err error
			if fresh, err = h.dedupBatch(ctx, tx, rs); err != nil {
				return err
			}
		}
		if h.batchWrite {
			return insertMany(ctx, tx, fresh)
		}
		for _, r := range fresh {
			if _, err := tx.Exec(ctx, benchInsert, r.event, r.topic, r.partition, r.offset); err != nil {
				return err
			}
		}
		return nil
	})
}

// insertMany writes the business rows of rs in one statement.
func insertMany(ctx context.Context, tx pgx.Tx, rs []rec) error {
	if len(rs) == 0 {
		return nil
	}
	evs, topics := make([]string, len(rs)), make([]string, len(rs))
	parts, offs := make([]int32, len(rs)), make([]int64, len(rs))
	for i, r := range rs {
		evs[i], topics[i], parts[i], offs[i] = r.event, r.topic, r.partition, r.offset
	}
	_, err := tx.Exec(ctx, benchInsertMany, evs, topics, parts, offs)
	return err
}

// dedupBatch is the batched check: the keys seen = ANY, then the new ones
// inserted; it returns the records not seen before.
func (h *handmade) dedupBatch(ctx context.Context, tx pgx.Tx, rs []rec) ([]rec, error) {
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = h.group + ":" + r.event
	}
	rows, _ := tx.Query(ctx, benchDedupSeen, keys)
	seen, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	old := make(map[string]bool, len(seen))
	for _, k := range seen {
		old[k] = true
	}
	var fresh []rec
	var freshKeys []string
	for i, r := range rs {
		if !old[keys[i]] {
			fresh = append(fresh, r)
			freshKeys = append(freshKeys, keys[i])
		}
	}
	if _, err := tx.Exec(ctx, benchDedupInsert, freshKeys); err != nil {
		return nil, err
	}
	return fresh, nil
}

// sarama: one ConsumeClaim per partition, as any sarama consumer.

func (h *handmade) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handmade) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handmade) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	for {
		var batch []*sarama.ConsumerMessage
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			batch = append(batch, m)
		}
		if h.batch > 1 {
			batch = fill(batch, claim.Messages(), h.batch)
		}
		rs := make([]rec, len(batch))
		for i, m := range batch {
			rs[i] = rec{topic: m.Topic, partition: m.Partition, offset: m.Offset}
			for _, hd := range m.Headers {
				if string(hd.Key) == eventHeader {
					rs[i].event = string(hd.Value)
				}
			}
		}
		if err := h.process(ctx, rs); err != nil {
			return fmt.Errorf("handmade consumer: %w", err)
		}
		sess.MarkMessage(batch[len(batch)-1], "")
	}
}

// fill adds what arrives within 10ms (the adapters' BatchWaitDefault) up
// to n messages.
func fill(batch []*sarama.ConsumerMessage, ch <-chan *sarama.ConsumerMessage, n int) []*sarama.ConsumerMessage {
	timer := time.NewTimer(10 * time.Millisecond)
	defer timer.Stop()
	for len(batch) < n {
		select {
		case m, ok := <-ch:
			if !ok {
				return batch
			}
			batch = append(batch, m)
		case <-timer.C:
			return batch
		}
	}
	return batch
}

// franz-go: poll, one goroutine per partition of the poll (as franz-go's
// own examples do), mark after each commit, autocommit of the marks.
func (h *handmade) pollLoop(ctx context.Context, cl *kgo.Client) {
	for ctx.Err() == nil {
		fs := cl.PollRecords(ctx, 10000)
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Go(func() {
				for recs := p.Records; len(recs) > 0; {
					n := min(h.batch, len(recs))
					rs := make([]rec, n)
					for i, r := range recs[:n] {
						rs[i] = rec{topic: r.Topic, partition: r.Partition, offset: r.Offset}
						for _, hd := range r.Headers {
							if hd.Key == eventHeader {
								rs[i].event = string(hd.Value)
							}
						}
					}
					if err := h.process(ctx, rs); err != nil {
						return // redelivered after the next rebalance
					}
					cl.MarkCommitRecords(recs[n-1])
					recs = recs[n:]
				}
			})
		})
		wg.Wait()
		cl.AllowRebalance()
	}
}
