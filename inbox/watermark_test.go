package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// watermark returns the stored watermark of orders/partition, -1 if none.
func (b *testBundle) watermark(t *testing.T, partition int32) int {
	t.Helper()
	return b.count(t, `SELECT coalesce(max("offset"), -1) FROM pgbox_inbox_watermark
		WHERE consumer = 'payments-svc' AND topic = 'orders' AND partition = $1`, partition)
}

func TestWatermarkProcess(t *testing.T) {
	t.Parallel()
	forKinds(t, testWatermarkProcess)
}

func testWatermarkProcess(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermark})

	for off := range int64(3) {
		res, err := b.process(t, ib, msg("orders", 0, off, "v"), pay)
		require.NoError(t, err)
		require.Equal(t, inbox.Result{Key: fmt.Sprintf("orders/0/%d", off)}, res, "offset %d", off)
	}
	require.Equal(t, 2, b.watermark(t, 0))

	// A rewind (redelivery, or the group's offset reset backwards) is a
	// duplicate: the handler does not run.
	for _, off := range []int64{0, 2} {
		res, err := b.process(t, ib, msg("orders", 0, off, "v"), func(context.Context, pgx.Tx, inbox.Message) error {
			t.Fatalf("handler ran for offset %d at or below the watermark", off)
			return nil
		})
		require.NoError(t, err)
		require.True(t, res.Duplicate)
	}

	// A forward jump is processed and reported, never silent.
	res, err := b.process(t, ib, msg("orders", 0, 6, "v"), pay)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.EqualValues(t, 3, res.Gap, "offsets 3, 4 and 5 were never processed")
	require.Equal(t, 6, b.watermark(t, 0))

	// A rolled-back transaction leaves the watermark where it was...
	tx := b.begin(t)
	_, err = process(ctx, ib, tx, msg("orders", 0, 7, "v"), pay)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 6, b.watermark(t, 0))
	// ...and so does a failed handler, whose caller's transaction stays usable.
	tx = b.begin(t)
	boom := errors.New("boom")
	_, err = process(ctx, ib, tx, msg("orders", 0, 7, "v"), func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		require.NoError(t, pay(ctx, tx, m))
		return boom
	})
	require.ErrorIs(t, err, boom)
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err, "the caller's transaction stays usable")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 6, b.watermark(t, 0))
	// The redelivery processes it.
	res, err = b.process(t, ib, msg("orders", 0, 7, "v"), pay)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.Zero(t, res.Gap)

	// Another partition has its own watermark.
	res, err = b.process(t, ib, msg("orders", 1, 0, "v"), pay)
	require.NoError(t, err)
	require.False(t, res.Duplicate)

	require.Equal(t, 6, b.payments(t)) // 0, 1, 2, 6, 7 and partition 1's 0
	require.Zero(t, b.inboxRows(t), "no per-message state")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM pgbox_inbox_watermark`))
	// Processed counts calls: the rolled-back run of offset 7 too.
	require.Equal(t, inbox.Stats{Processed: 7, Duplicates: 2, HandlerErrors: 1, Gaps: 1}, ib.Stats())
}

func TestWatermarkTopicRecreated(t *testing.T) {
	t.Parallel()
	forKinds(t, testWatermarkTopicRecreated)
}

func testWatermarkTopicRecreated(t *testing.T, b *testBundle) {
	ib := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermark})
	withID := func(off int64, id string) inbox.Message {
		m := msg("orders", 0, off, "v")
		m.TopicID = id
		return m
	}
	for off := range int64(5) {
		_, err := b.process(t, ib, withID(off, "id-old"), pay)
		require.NoError(t, err)
	}
	// The topic was deleted and recreated: offsets restart at 0 under a new
	// id. They are new records, not duplicates, and no gap is reported.
	for off := range int64(2) {
		res, err := b.process(t, ib, withID(off, "id-new"), pay)
		require.NoError(t, err)
		require.False(t, res.Duplicate, "offset %d of the new topic", off)
		require.Zero(t, res.Gap)
	}
	require.Equal(t, 1, b.watermark(t, 0))
	res, err := b.process(t, ib, withID(1, "id-new"), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate, "the new topic's own redelivery")
	// A consumer that does not know topic ids compares offsets only.
	res, err = b.process(t, ib, withID(0, ""), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, 7, b.payments(t))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pgbox_inbox_watermark WHERE topic_id = 'id-new'`))
}

func TestWatermarkBatch(t *testing.T) {
	t.Parallel()
	forKinds(t, testWatermarkBatch)
}

func testWatermarkBatch(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermark})
	// Partition 0 has processed up to offset 4.
	_, err := b.process(t, ib, msg("orders", 0, 4, "v"), pay)
	require.NoError(t, err)

	rec := &callLog{}
	batch := []inbox.Message{
		msg("orders", 0, 3, "v"), // below the watermark
		msg("orders", 1, 0, "v"), // a new partition
		msg("orders", 0, 5, "v"),
		msg("orders", 0, 5, "v"), // repeated in the batch
		msg("orders", 1, 1, "v"),
		msg("orders", 0, 9, "v"), // after a gap of 3
	}
	tx := b.begin(t)
	res, err := processBatch(ctx, ib, tx, batch, rec.handler(nil))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var dups []bool
	var gaps []int64
	for _, r := range res {
		dups, gaps = append(dups, r.Duplicate), append(gaps, r.Gap)
	}
	require.Equal(t, []bool{true, false, false, true, false, false}, dups)
	require.Equal(t, []int64{0, 0, 0, 0, 0, 3}, gaps)
	require.Equal(t, []string{"orders/1@0", "orders/0@5", "orders/1@1", "orders/0@9"}, rec.calls)
	require.Equal(t, 9, b.watermark(t, 0))
	require.Equal(t, 1, b.watermark(t, 1))

	// The same batch again: all duplicates.
	rec = &callLog{}
	tx = b.begin(t)
	res, err = processBatch(ctx, ib, tx, batch, rec.handler(nil))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Empty(t, rec.calls)
	for i, r := range res {
		require.True(t, r.Duplicate, i)
	}

	// A partition's messages out of order: rejected, nothing written, the
	// transaction usable.
	tx = b.begin(t)
	_, err = processBatch(ctx, ib, tx, []inbox.Message{msg("orders", 0, 11, "v"), msg("orders", 0, 10, "v")}, pay)
	require.ErrorIs(t, err, inbox.ErrInvalidMessage)
	var me *inbox.MessageError
	require.ErrorAs(t, err, &me)
	require.Equal(t, 1, me.Index)
	require.ErrorContains(t, err, "offset order")
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 9, b.watermark(t, 0))

	// A failing handler rolls the whole batch back, watermarks included.
	tx = b.begin(t)
	_, err = processBatch(ctx, ib, tx, []inbox.Message{msg("orders", 0, 10, "v"), msg("orders", 1, 2, "v")},
		func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			if m.Partition == 1 {
				return errors.New("boom")
			}
			return pay(ctx, tx, m)
		})
	require.Error(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 9, b.watermark(t, 0))
	require.Equal(t, 1, b.watermark(t, 1))
	require.Equal(t, 5, b.payments(t))
	require.Zero(t, b.inboxRows(t))
}

// Two deliveries of one record racing on two connections (a rebalance hands
// the partition over while the old owner's transaction is in flight): the
// watermark row serializes them, exactly one processes.
func TestWatermarkConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	forKinds(t, testWatermarkConcurrentDeliveries)
}

func testWatermarkConcurrentDeliveries(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermark})
	const rounds = 100
	for round := range rounds {
		batchSize := 1 + round%3
		ms := make([]inbox.Message, batchSize)
		for i := range ms {
			ms[i] = msg("orders", 0, int64(round*3+i), "v")
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		processed := make([]int, 2)
		errs := make([]error, 2)
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[w] = b.beginFunc(ctx, t, func(tx pgx.Tx) error {
					count := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
						processed[w]++
						return pay(ctx, tx, m)
					}
					if w == 0 && batchSize == 1 {
						_, err := process(ctx, ib, tx, ms[0], count)
						return err
					}
					_, err := processBatch(ctx, ib, tx, ms, count)
					return err
				})
			}()
		}
		close(start)
		wg.Wait()
		require.NoError(t, errs[0], round)
		require.NoError(t, errs[1], round)
		require.Equal(t, batchSize, processed[0]+processed[1], "round %d: each record processed once", round)
	}
	require.Equal(t, b.count(t, `SELECT count(DISTINCT event) FROM payments`), b.payments(t), "no record processed twice")
}

func TestWatermarkAndKeys(t *testing.T) {
	t.Parallel()
	forKinds(t, testWatermarkAndKeys)
}

func testWatermarkAndKeys(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermarkAndKeys, Key: inbox.ByHeader("event-id")})
	ev := func(id string, offset int64, value string) inbox.Message {
		return msg("orders", 0, offset, value, outbox.Header{Key: "event-id", Value: []byte(id)})
	}
	res, err := b.process(t, ib, ev("A", 0, "a"), pay)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	// The producer sent A twice: a new offset, the same event id.
	res, err = b.process(t, ib, ev("A", 1, "a"), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate, "producer-side duplicate caught by its key")
	require.Equal(t, 1, b.watermark(t, 0), "the watermark moves past it")
	// A redelivery of offset 0 is a duplicate by the watermark.
	res, err = b.process(t, ib, ev("A", 0, "a"), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	// The same event id with another payload is refused, and the watermark
	// stays: the record was not handled.
	_, err = b.process(t, ib, ev("A", 2, "other"), pay)
	require.ErrorIs(t, err, inbox.ErrFingerprintMismatch)
	require.Equal(t, 1, b.watermark(t, 0))

	tx := b.begin(t)
	res2, err := processBatch(ctx, ib, tx, []inbox.Message{ev("A", 0, "a"), ev("B", 3, "b"), ev("A", 4, "a"), ev("C", 5, "c")}, pay)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var dups []bool
	for _, r := range res2 {
		dups = append(dups, r.Duplicate)
	}
	require.Equal(t, []bool{true, false, true, false}, dups)
	require.EqualValues(t, 1, res2[1].Gap, "offset 2 (the refused record) was never processed")
	require.Equal(t, 5, b.watermark(t, 0))
	require.Equal(t, 3, b.payments(t))
	require.Equal(t, 3, b.inboxRows(t))

	// A gap before a producer-side duplicate is reported all the same.
	res, err = b.process(t, ib, ev("A", 7, "a"), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.EqualValues(t, 1, res.Gap)
	require.Equal(t, 7, b.watermark(t, 0))
}

func TestWatermarkConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  inbox.Config
		want string
	}{
		{inbox.Config{Dedup: inbox.DedupWatermark, Key: inbox.ByHeader("id")}, "uses no key"},
		{inbox.Config{Dedup: inbox.DedupWatermarkAndKeys}, "needs Config.Key"},
		{inbox.Config{Dedup: inbox.DedupWatermarkAndKeys, Key: inbox.ByOffset()}, "use DedupWatermark"},
		{inbox.Config{Dedup: inbox.Dedup(7)}, "Dedup(7) is not a known mode"},
	} {
		tc.cfg.Consumer = "svc"
		_, err := inbox.New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}
