package inboxfranz

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/consume"
)

// maxQueued is how many records a partition's queue holds before its
// fetching is paused (a record being retried holds its partition; the
// others go on).
const maxQueued = 4096

// chanBuffer is how many of a partition's queued records wait in the
// channel its loop reads: a batch takes what is buffered without waiting,
// so an unbuffered channel would hand each record over on its own and make
// the loop wait BatchWait for records already fetched (sarama's claims
// buffer Config.ChannelBufferSize, 256 by default, the same way).
const chanBuffer = 256

// part is one partition being processed: its queue, fed by the poll loop,
// and the shared loop reading it (it implements consume.Claim).
type part struct {
	c     *Consumer
	tp    tp
	first int64 // the offset of the first record handed to it
	ctx   context.Context
	stop  context.CancelFunc
	ch    chan *kgo.Record
	done  chan struct{}

	mu     sync.Mutex
	queue  []*kgo.Record
	paused bool
	wake   chan struct{}
}

var _ consume.Claim[*kgo.Record] = (*part)(nil)

// dispatch queues p's records for their partition's loop, starting it if
// needed.
func (c *Consumer) dispatch(ctx context.Context, failed context.CancelFunc, p kgo.FetchTopicPartition) {
	k := tp{p.Topic, p.Partition}
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.parts[k]
	if w == nil {
		w = c.start(ctx, failed, k, p.Records[0].Offset)
		c.parts[k] = w
	}
	w.push(p.Records)
}

// start runs the shared loop over a new partition queue.
func (c *Consumer) start(ctx context.Context, failed context.CancelFunc, k tp, first int64) *part {
	pctx, stop := context.WithCancel(ctx)
	w := &part{c: c, tp: k, first: first, ctx: pctx, stop: stop, ch: make(chan *kgo.Record, chanBuffer), done: make(chan struct{}), wake: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	wg.Go(w.forward)
	wg.Go(func() {
		if err := consume.Run(c.loop, w); err != nil {
			select {
			case c.fatal <- err:
			default:
			}
			failed()
		}
		stop()
	})
	go func() {
		wg.Wait()
		close(w.done)
	}()
	return w
}

// push queues records; past maxQueued the partition's fetching pauses.
func (w *part) push(rs []*kgo.Record) {
	w.mu.Lock()
	w.queue = append(w.queue, rs...)
	pause := len(w.queue) > maxQueued && !w.paused
	if pause {
		w.paused = true
	}
	w.mu.Unlock()
	if pause {
		w.c.cl.PauseFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// forward feeds the queue to the loop, one record at a time, resuming
// fetching once the queue has drained to half.
func (w *part) forward() {
	for {
		w.mu.Lock()
		var r *kgo.Record
		if len(w.queue) > 0 {
			r = w.queue[0]
			w.queue[0] = nil
			w.queue = w.queue[1:]
		}
		resume := w.paused && len(w.queue) <= maxQueued/2
		if resume {
			w.paused = false
		}
		w.mu.Unlock()
		if resume {
			w.c.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
		}
		if r == nil {
			select {
			case <-w.wake:
				continue
			case <-w.ctx.Done():
				return
			}
		}
		select {
		case w.ch <- r:
		case <-w.ctx.Done():
			return
		}
	}
}

func (w *part) Topic() string                       { return w.tp.topic }
func (w *part) Partition() int32                    { return w.tp.partition }
func (w *part) InitialOffset() int64                { return w.first }
func (w *part) Context() context.Context            { return w.ctx }
func (w *part) Records() <-chan *kgo.Record         { return w.ch }
func (w *part) Message(r *kgo.Record) inbox.Message { return Message(r) }
func (w *part) Mark(r *kgo.Record)                  { w.c.mark(w, r) }

func (w *part) TopicID(ctx context.Context) (string, error) {
	if !w.c.cfg.TopicIDs {
		return "", nil
	}
	return fetchTopicID(ctx, w.c.cl, w.tp.topic)
}

// revoke stops the loops of partitions taken from this member and, when
// commit is true (revoked, not lost), commits their committed offsets before
// the rebalance goes on.
func (c *Consumer) revoke(ctx context.Context, m map[string][]int32, commit bool) {
	var ks []tp
	var ws []*part
	c.mu.Lock()
	for topic, ps := range m {
		for _, p := range ps {
			k := tp{topic, p}
			ks = append(ks, k)
			if w := c.parts[k]; w != nil {
				ws = append(ws, w)
				delete(c.parts, k)
			}
		}
	}
	c.mu.Unlock()
	stopParts(ws)
	if len(m) > 0 {
		// A paused partition stays paused across assignments: let its next
		// assignment fetch.
		c.cl.ResumeFetchPartitions(m)
	}
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	// Once Close was called, Run has committed what it could; a commit
	// here would only stretch Close past Config.LeaveTimeout.
	if commit && !c.closing.Load() {
		c.commitLocked(ctx, ks)
	}
	c.mu.Lock()
	for _, k := range ks {
		delete(c.marks, k)
	}
	c.mu.Unlock()
}

// stopAll stops every partition's loop and waits for it.
func (c *Consumer) stopAll() {
	c.mu.Lock()
	ws := make([]*part, 0, len(c.parts))
	for k, w := range c.parts {
		ws = append(ws, w)
		delete(c.parts, k)
	}
	c.mu.Unlock()
	stopParts(ws)
}

// stopParts stops the loops of ws, all at once (their transactions in
// flight drain together), and waits for each to end.
func stopParts(ws []*part) {
	for _, w := range ws {
		w.stop()
	}
	for _, w := range ws {
		<-w.done
	}
}
