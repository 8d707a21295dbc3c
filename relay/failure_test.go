package relay_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// The broker goes away (every connection is dropped) while events are
// written. The relay backs off and retries without marking anything; once the
// broker is back, everything arrives in order.
func TestBrokerOutageThenRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	createCounters(t, b, 5)
	a := start(t, b.config("a"))

	for i := range 20 {
		require.NoError(t, writeCounted(ctx, b, keyed(i%5)))
	}
	require.Len(t, readTopic(t, b, b.topic, 20), 20)

	var down atomic.Bool
	var refused atomic.Int64
	down.Store(true)
	b.cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return nil, errors.New("broker down"), true // closes the connection
	})
	for i := range 30 {
		require.NoError(t, writeCounted(ctx, b, keyed(i%5)))
	}
	waitFor(t, "relay retrying against the dead broker", func() bool { return a.r.Stats().Retried >= 30 && refused.Load() > 10 })
	// Nothing was marked while the broker was down.
	require.Equal(t, 30, b.outboxCount(t, "attempts = 0 AND parked_at IS NULL AND last_error IS NULL"))

	down.Store(false)
	got := readEvents(t, b, 50)
	require.GreaterOrEqual(t, len(got), 50)
	checkOrder(t, b, got)
	waitFor(t, "outbox emptied", func() bool { return b.outboxCount(t, "true") == 0 })
	require.Zero(t, a.r.Stats().Parked)
}

// Rows that can never be published — unknown topic (auto-create off), larger
// than the producer allows — are parked with their error (after the
// unknown-topic window, or MaxAttempts); other keys keep flowing; later rows
// of the poison row's own topic and key wait behind it, parked or not, so a
// key's order is never broken.
func TestPoisonRowsAreParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("a")
	cfg.MaxAttempts = 3
	cfg.UnknownTopicWindow = relay.NoUnknownTopicWindow
	cfg.Kafka = kafkaConfig()
	cfg.Kafka.Producer.MaxMessageBytes = 4000
	cfg.MaxMessageBytes = 4000 // below what the writers (outbox.Write's default) accept
	a := start(t, cfg)

	b.write(t, msg(b.topic, "good-0", "before"))
	b.write(t, outbox.Message{Topic: "no-such-topic", Key: []byte("poison"), Value: []byte("lost topic")})
	b.write(t, outbox.Message{Topic: b.topic, Key: []byte("huge"), Value: []byte(strings.Repeat("x", 5000))})
	b.write(t, msg(b.topic, "poison", "same key, later"))         // another topic: not held
	b.write(t, msg(b.topic, "huge", "same topic and key, later")) // held behind the huge row
	for i := range 10 {
		b.write(t, msg(b.topic, "good-"+strconv.Itoa(i+1), "after"))
	}

	got := readTopic(t, b, b.topic, 12)
	require.Len(t, got, 12, "every good row arrives, the poison rows and the huge key's later row never")
	require.Empty(t, valuesOf(got, "huge"))
	require.Equal(t, []string{"same key, later"}, valuesOf(got, "poison"))
	waitFor(t, "both poison rows parked", func() bool { return b.outboxCount(t, "parked_at IS NOT NULL") == 2 })
	waitFor(t, "published counted", func() bool { return a.r.Stats().Published == 12 })
	require.Equal(t, 1, b.outboxCount(t, "parked_at IS NULL"), "the huge row's later row is held (poison's went out: another topic)")
	require.Equal(t, 1, b.outboxCount(t, "topic = 'no-such-topic' AND attempts = 3 AND last_error ILIKE '%topic%'"))
	require.Equal(t, 1, b.outboxCount(t, "key = 'huge' AND attempts = 3 AND last_error ILIKE '%MaxMessageBytes%'"))
	require.Equal(t, 1, b.outboxCount(t, "key = 'huge' AND parked_at IS NULL AND attempts = 0"))
	waitFor(t, "parked counted", func() bool { return a.r.Stats().Parked == 2 })
	require.Len(t, readTopic(t, b, b.topic, 13), 12, "still held")
}

// With NOTIFY from the writer, a relay that would otherwise poll once an
// hour publishes at once: the notification is the wake-up.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config("a")
	cfg.PollInterval = 1 << 62 // never polls again after the first pass
	cfg.BusyPollInterval = 1 << 62
	a := start(t, cfg)
	waitFor(t, "lanes held", func() bool { return a.r.Stats().Lanes == 8 })

	w, err := outbox.NewWriter(outbox.Config{Notify: true, Channel: b.channel})
	require.NoError(t, err)
	for i := range 3 {
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, w.Write(ctx, tx, msg(b.topic, keyed(i), "notified")))
		require.NoError(t, tx.Commit(ctx))
		require.Len(t, readTopic(t, b, b.topic, i+1), i+1)
	}
	waitFor(t, "published counted", func() bool { return a.r.Stats().Published == 3 })
	_ = relay.EventIDHeader
}

// Many records of one key are in flight at once (whole batches per
// partition), so a failure in the middle of a key's run must cut it cleanly:
// nothing after the failed batch may reach Kafka before it. The broker fails
// one partition's produce requests (more often than the producer retries,
// so batches fail and wait for the next pass), answers another's with
// REQUEST_TIMED_OUT after writing them (the retry must be deduplicated, not
// written twice), and hides a third partition's leader for a while; the
// backlog holds hundreds of rows per key. Every event arrives, in order per
// key, without duplicates.
func TestFailureMidPipelineReordersNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const keys, perKey = 9, 150
	createCounters(t, b, keys)
	for range perKey {
		for k := range keys {
			require.NoError(t, writeCounted(ctx, b, keyed(k)))
		}
	}
	produce := []kmsg.Key{kmsg.Produce}
	notLeader := b.cluster.Fault(kfake.Fault{Keys: produce, Topic: b.topic, Partitions: []int32{0}, Err: kerr.NotLeaderForPartition, Count: 7})
	timedOut := b.cluster.Fault(kfake.Fault{Keys: produce, Topic: b.topic, Partitions: []int32{1}, Err: kerr.RequestTimedOut, Count: 2})
	noLeader := b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Metadata}, Topic: b.topic, Partitions: []int32{2}, Err: kerr.LeaderNotAvailable, Count: 6})
	cfg := b.config("a")
	cfg.BatchSize = 400 // several passes, each with many rows per key
	cfg.Kafka = kafkaConfig()
	cfg.Kafka.Producer.MaxMessageBytes = 4096               // a partition's rows take several record batches per pass
	cfg.MaxMessageBytes = 4096 + outbox.RecordBatchOverhead // no row here comes near it
	a := start(t, cfg)

	got := readEvents(t, b, keys*perKey)
	dups := checkOrder(t, b, got)
	require.Zero(t, dups, "a retried batch is deduplicated by the broker (same producer id and sequence)")
	require.Len(t, got, keys*perKey)
	waitFor(t, "outbox emptied", func() bool { return b.outboxCount(t, "true") == 0 })
	require.Equal(t, 7, notLeader.Hits())
	require.Equal(t, 2, timedOut.Hits())
	require.Positive(t, noLeader.Hits())
	require.Positive(t, a.r.Stats().Retried, "some batches failed and were sent again in a later pass")
	require.Zero(t, a.r.Stats().Parked)
}

// The broker rejects a record batch for what it holds (here: larger than
// the topic's max.message.bytes, which is below the producer's limit). The
// relay sends that partition's rows one per batch to find the bad row: only
// it fails (and is parked at MaxAttempts), every other row goes out, in
// order, and the bad row's key's later row is held behind it.
func TestBatchRejectedByBrokerFindsTheBadRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	limit := "1200"
	kafkatest.CreateTopic(t, b.addrs, "small", 3, map[string]*string{"max.message.bytes": &limit})
	b.topic = "small"
	const keys = 4
	createCounters(t, b, keys)
	for range 5 {
		for k := range keys {
			require.NoError(t, writeCounted(ctx, b, keyed(k)))
		}
	}
	b.write(t, msg(b.topic, "big", strings.Repeat("x", 1500)))
	for range 5 {
		for k := range keys {
			require.NoError(t, writeCounted(ctx, b, keyed(k)))
		}
	}
	b.write(t, msg(b.topic, "big", "after"))
	cfg := b.config("a")
	cfg.MaxAttempts = 2
	a := start(t, cfg)

	got := readEvents(t, b, 10*keys)
	require.Empty(t, valuesOf(got, "big"), "the oversized row never arrives, nor its key's later row")
	require.Len(t, got, 10*keys)
	require.Zero(t, checkOrder(t, b, got))
	waitFor(t, "only the parked row and the row it holds remain", func() bool {
		return b.outboxCount(t, "true") == 2 && b.outboxCount(t, "parked_at IS NOT NULL") == 1
	})
	require.Equal(t, 1, b.outboxCount(t, "key = 'big' AND parked_at IS NOT NULL AND attempts = 2 AND last_error ILIKE '%too large%'"))
	waitFor(t, "parked counted", func() bool { return a.r.Stats().Parked == 1 })
}
