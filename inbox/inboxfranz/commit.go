package inboxfranz

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// commitTimeout bounds one offset commit.
const commitTimeout = 10 * time.Second

// mark is a partition's offset to commit: the one after the last record
// whose transaction committed.
type mark struct {
	next      kgo.EpochOffset
	committed int64 // next.Offset as last committed to Kafka, -1 if not yet
}

// mark records that r's transaction committed; with Config.CommitOffsets
// the offset is committed at once.
func (c *Consumer) mark(w *part, r *kgo.Record) {
	c.mu.Lock()
	m := c.marks[w.tp]
	if m == nil {
		m = &mark{committed: -1}
		c.marks[w.tp] = m
	}
	m.next = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
	c.mu.Unlock()
	if c.cfg.CommitOffsets {
		c.commitMu.Lock()
		defer c.commitMu.Unlock()
		c.commitLocked(w.ctx, []tp{w.tp})
	}
}

// commitEvery commits the marked offsets every CommitInterval until ctx ends.
func (c *Consumer) commitEvery(ctx context.Context) {
	t := time.NewTicker(c.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.commitAll(ctx)
		}
	}
}

// commitAll commits every partition's marked offset not yet committed.
func (c *Consumer) commitAll(ctx context.Context) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.commitLocked(ctx, nil)
}

// commitLocked commits the marked offsets of ks (all partitions when nil)
// that are not committed yet. The caller holds commitMu.
func (c *Consumer) commitLocked(ctx context.Context, ks []tp) {
	todo := map[string]map[int32]kgo.EpochOffset{}
	add := func(k tp, m *mark) {
		if m == nil || m.next.Offset == m.committed {
			return
		}
		if todo[k.topic] == nil {
			todo[k.topic] = map[int32]kgo.EpochOffset{}
		}
		todo[k.topic][k.partition] = m.next
	}
	c.mu.Lock()
	if ks == nil {
		for k, m := range c.marks {
			add(k, m)
		}
	} else {
		for _, k := range ks {
			add(k, c.marks[k])
		}
	}
	c.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	c.cl.CommitOffsetsSync(ctx, todo, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			c.log.WarnContext(ctx, "pgbox: offset commit failed (the records are redelivered and deduplicated if it is not retried in time)", "error", err)
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					c.log.WarnContext(ctx, "pgbox: offset commit failed", "topic", t.Topic, "partition", p.Partition, "error", err)
					continue
				}
				if m := c.marks[tp{t.Topic, p.Partition}]; m != nil {
					m.committed = todo[t.Topic][p.Partition].Offset
				}
			}
		}
	})
}
