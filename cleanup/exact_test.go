package cleanup

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
)

// produce writes n records to partition 0 of topic, each with its own Kafka
// key (so compaction keeps them all) and the record timestamp at.
func (b *testBundle) produce(t *testing.T, topic string, n int, at time.Time) {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(b.cluster.ListenAddrs(), cfg)
	require.NoError(t, err)
	defer func() { _ = p.Close() }()
	for i := range n {
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0, Timestamp: at,
			Key: sarama.StringEncoder(topic + "-" + string(rune('a'+i))), Value: sarama.StringEncoder("v")})
		require.NoError(t, err)
	}
}

// produceOneBatch writes one record per timestamp to partition 0 of topic,
// all in one record batch, as Kafka's log cleaner leaves a group of cleaned
// segments: Kafka's retention then goes by the newest of them. The producer
// holds the records until it has all of them (Flush.Messages, no timer), so
// they go in one request and one batch whatever the metadata's timing: a
// client that drains as records arrive (franz-go flushing while the topic's
// partitions load) can send the first one alone.
func (b *testBundle) produceOneBatch(t *testing.T, topic string, stamps ...time.Time) {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Flush.Messages = len(stamps)
	cfg.Producer.Flush.Frequency = 0
	p, err := sarama.NewAsyncProducer(b.cluster.ListenAddrs(), cfg)
	require.NoError(t, err)
	defer func() { _ = p.Close() }()
	for i, at := range stamps {
		p.Input() <- &sarama.ProducerMessage{Topic: topic, Partition: 0, Timestamp: at,
			Key: sarama.ByteEncoder{byte('a' + i)}, Value: sarama.StringEncoder("v")}
	}
	for range stamps {
		select {
		case <-p.Successes():
		case perr := <-p.Errors():
			require.NoError(t, perr.Err)
		case <-time.After(10 * time.Second):
			t.Fatal("the batch was not acknowledged within 10s")
		}
	}
}

// logStart asks Kafka for partition 0's log start offset, as the cleaner does.
func (b *testBundle) logStart(t *testing.T, topic string) int64 {
	t.Helper()
	got, err := b.admin.LogStarts(context.Background(), []string{topic})
	require.NoError(t, err)
	start, ok := got[topic].Offsets[0]
	require.True(t, ok, "%+v", got[topic])
	return start
}

// TestExactRuleCompactDelete: on a compact,delete topic the log cleaner
// rewrites segments in groups without regard to their time span, and
// retention deletes a group by its newest record, so Kafka can hold a record
// far longer than retention.ms + segment.ms. Here three records stamped two
// days ago share a batch with a fresh one, are compacted and put through
// retention (retention.ms one hour), and Kafka still holds them: the time
// rule would have deleted their keys, and a rewind would then charge them
// twice. The exact rule keeps them until Kafka's log
// start offset passes them (DeleteRecords here; the log cleaner or retention
// alike), and then deletes exactly those.
func TestExactRuleCompactDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const retention, segment, buffer = time.Hour, time.Minute, time.Minute
	b.topic(t, "ledger", map[string]string{"cleanup.policy": "compact,delete", "retention.ms": ms(retention), "segment.ms": ms(segment)})
	twoDaysAgo := time.Now().Add(-48 * time.Hour).Truncate(time.Millisecond)
	b.produceOneBatch(t, "ledger", twoDaysAgo, twoDaysAgo, twoDaysAgo, time.Now())
	b.cluster.Compact()
	b.cluster.ApplyRetention()
	require.Equal(t, int64(0), b.logStart(t, "ledger"), "Kafka still holds every record")
	held := kafkatest.ReadAll(t, b.cluster.ListenAddrs(), "ledger", 4, 10*time.Second)
	require.Len(t, held, 4)
	require.True(t, held[0].Timestamp.Equal(twoDaysAgo), "%v", held[0].Timestamp)

	for o := range int64(3) {
		b.insertAt(t, "ledger", "k"+string(rune('0'+o)), 0, o, twoDaysAgo)
	}
	oldWindow := retention + segment + buffer // what the time rule kept a key for
	require.Greater(t, time.Since(twoDaysAgo), oldWindow, "the time rule would have deleted every key")

	c := b.cleaner(t, Config{Buffer: buffer})
	rep, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"k0", "k1", "k2"}, b.keys(t, "ledger"), "Kafka can redeliver every record: every key stays")
	tr, _ := rep.Topic("ledger")
	require.True(t, tr.Exact)
	require.False(t, tr.Timed, "no time rule for compact,delete")
	require.Equal(t, ReasonCompactDelete, tr.Reason)
	require.Zero(t, tr.Deleted)

	// Kafka's log start moves past the first two records.
	require.NoError(t, b.sadmin.DeleteRecords("ledger", map[int32]int64{0: 2}))
	require.Equal(t, int64(2), b.logStart(t, "ledger"))
	rep, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"k2"}, b.keys(t, "ledger"), "the record at the log start can still come back")
	tr, _ = rep.Topic("ledger")
	require.Equal(t, int64(2), tr.ExactDeleted)
	require.Zero(t, tr.TimeDeleted)
	require.Equal(t, map[int32]int64{0: 2}, tr.LogStarts)
	require.NotEmpty(t, tr.TopicID, "the broker gives the topic id")
}

// TestExactRuleEveryPolicy: the exact rule is the same for every
// cleanup.policy and retention.ms: keys behind the log start go, the key at it
// stays, and a key younger than the buffer stays even behind it (a copy may
// still be on its way). The time rule (keys of unknown position) applies to
// delete alone. The log start moves by DeleteRecords, and by retention.bytes.
func TestExactRuleEveryPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Now()
	old := now.Add(-30 * 24 * time.Hour)
	topics := map[string]map[string]string{
		"delete":         {"cleanup.policy": "delete"},
		"compact":        {"cleanup.policy": "compact"},
		"compact-delete": {"cleanup.policy": "compact,delete"},
		"empty":          {"cleanup.policy": ""},
		"tiered":         {"cleanup.policy": "delete,tiered"},
		"infinite":       {"cleanup.policy": "delete", "retention.ms": "-1"},
	}
	for topic, cfg := range topics {
		cfg["segment.ms"] = ms(time.Hour)
		if cfg["retention.ms"] == "" {
			cfg["retention.ms"] = ms(24 * time.Hour)
		}
		b.topic(t, topic, cfg)
		b.produce(t, topic, 4, now)
		require.NoError(t, b.sadmin.DeleteRecords(topic, map[int32]int64{0: 2}))
		b.insertAt(t, topic, "o0", 0, 0, old)
		b.insertAt(t, topic, "o1", 0, 1, old)
		b.insertAt(t, topic, "o1-young", 0, 1, now.Add(-time.Minute)) // another key whose copy is at offset 1, seen a minute ago
		b.insertAt(t, topic, "o2", 0, 2, old)
		b.insertKey(t, topic, "unknown", old, nil)
	}
	// retention.bytes moves the log start too (a record batch is about 70
	// bytes: 100 keeps the last one).
	b.topic(t, "bytes", map[string]string{"retention.bytes": "100", "segment.ms": ms(time.Hour)})
	b.produce(t, "bytes", 3, now)
	b.cluster.ApplyRetention()
	require.Equal(t, int64(2), b.logStart(t, "bytes"))
	b.insertAt(t, "bytes", "o1", 0, 1, old)
	b.insertAt(t, "bytes", "o2", 0, 2, old)

	// A dry run says what each rule would delete.
	rep, err := b.cleaner(t, Config{Buffer: time.Hour, DryRun: true}).RunOnce(ctx)
	require.NoError(t, err)
	for topic := range topics {
		tr, _ := rep.Topic(topic)
		require.Equal(t, int64(2), tr.ExactWouldDelete, topic)
		require.Equal(t, map[bool]int64{true: 1, false: 0}[topic == "delete"], tr.TimeWouldDelete, topic)
		require.Zero(t, tr.Deleted, topic)
	}
	require.Equal(t, 5, len(b.keys(t, "compact")), "a dry run deletes nothing")

	rep, err = b.cleaner(t, Config{Buffer: time.Hour}).RunOnce(ctx)
	require.NoError(t, err)
	for topic := range topics {
		want := []string{"o1-young", "o2", "unknown"}
		if topic == "delete" {
			want = []string{"o1-young", "o2"}
		}
		require.Equal(t, want, b.keys(t, topic), topic)
		tr, _ := rep.Topic(topic)
		require.Equal(t, int64(2), tr.ExactDeleted, topic)
		require.Equal(t, topic == "delete", tr.Timed, topic)
	}
	require.Equal(t, []string{"o2"}, b.keys(t, "bytes"))
}

// TestExactRuleFollowsLastCopy: a duplicate delivery moves its key's position
// to its own offset, so the key stays while Kafka holds the later copy (a
// relay's resend); a rewind redelivering an older copy never moves it back; a
// copy on another partition makes the position unknown (the time rule then
// decides, here: never, on compact,delete). Through inbox.Process and
// ProcessBatch, against the real broker's log start.
func TestExactRuleFollowsLastCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kafkatest.CreateTopic(t, b.cluster.ListenAddrs(), "orders", 2, map[string]*string{"cleanup.policy": ptr("compact,delete")})
	b.produce(t, "orders", 10, time.Now())
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: inbox.ByHeader("event-id")})
	require.NoError(t, err)
	ev := func(id string, partition int32, offset int64) inbox.Message {
		return inbox.Message{Topic: "orders", Partition: partition, Offset: offset, Value: []byte(id),
			Headers: []outbox.Header{{Key: "event-id", Value: []byte(id)}}}
	}
	nop := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	process := func(ms ...inbox.Message) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if len(ms) == 1 {
				_, err := ib.Process(ctx, tx, ms[0], nop)
				return err
			}
			_, err := ib.ProcessBatch(ctx, tx, ms, nop)
			return err
		}))
	}
	// First copies at offsets 1 and 2; resends at 6 and 7 (one by Process,
	// one by ProcessBatch); rewinds redeliver the first copies again; "moved"
	// has a copy on partition 1 too.
	process(ev("single", 0, 1))
	process(ev("batched", 0, 2), ev("moved", 0, 3))
	process(ev("single", 0, 6))
	process(ev("batched", 0, 7), ev("moved", 1, 0))
	process(ev("single", 0, 1))
	process(ev("batched", 0, 2), ev("other", 0, 4))
	// Two copies within one batch: the later offset counts; copies on two
	// partitions make the position unknown.
	process(ev("inbatch", 0, 5), ev("split", 0, 6), ev("inbatch", 0, 8), ev("split", 1, 1))

	keys := func() []string {
		rows, err := b.db.Pool.Query(ctx, `SELECT key FROM pgbox_inbox ORDER BY key`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	type pos struct {
		Offset int64
		Known  bool
	}
	position := func(key string) pos {
		var p pos
		require.NoError(t, b.db.Pool.QueryRow(ctx,
			`SELECT "offset", COALESCE(position_at >= received_at, false) FROM pgbox_inbox WHERE key = $1`, key).Scan(&p.Offset, &p.Known))
		return p
	}
	require.Equal(t, pos{6, true}, position("single"), "the duplicate moved the position forward; the rewind did not move it back")
	require.Equal(t, pos{7, true}, position("batched"))
	require.Equal(t, pos{3, false}, position("moved"), "copies on two partitions: position unknown")
	require.Equal(t, pos{8, true}, position("inbatch"), "the batch's later copy counts")
	require.Equal(t, pos{6, false}, position("split"))

	// Everything older than the buffer: only Kafka's log start decides.
	_, err = b.db.Pool.Exec(ctx, `UPDATE pgbox_inbox SET received_at = received_at - interval '2 days',
		position_at = position_at - interval '2 days', record_at = NULL`)
	require.NoError(t, err)
	c := b.cleaner(t, Config{Buffer: time.Hour})

	require.NoError(t, b.sadmin.DeleteRecords("orders", map[int32]int64{0: 5}))
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"batched", "inbatch", "moved", "single", "split"}, keys(),
		"the first copies are gone from Kafka, the resends are not: keys kept (\"other\", at offset 4, went)")

	require.NoError(t, b.sadmin.DeleteRecords("orders", map[int32]int64{0: 8}))
	rep, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"inbatch", "moved", "split"}, keys(), "position unknown: kept (no time rule on compact,delete)")
	tr, _ := rep.Topic("orders")
	require.Equal(t, int64(2), tr.ExactDeleted)

	require.NoError(t, b.sadmin.DeleteRecords("orders", map[int32]int64{0: 9}))
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"moved", "split"}, keys())
}

// TestExactRuleKafkaUnreachable: without log start offsets nothing is
// deleted by the exact rule, and the report says why; a broker that never
// answers ListOffsets does not hold the pass past KafkaTimeout; a Kafka that
// is down is reported as unreachable, not as "never pruned".
func TestExactRuleKafkaUnreachable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-365 * 24 * time.Hour)
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour)})
	b.produce(t, "t", 3, time.Now())
	require.NoError(t, b.sadmin.DeleteRecords("t", map[int32]int64{0: 2}))
	b.insertAt(t, "t", "behind", 0, 0, old)
	b.insertKey(t, "t", "unknown", old, nil)

	b.cluster.ControlKey(int16(kmsg.ListOffsets), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		return nil, nil, true // swallow the request
	})
	t0 := time.Now()
	rep, err := b.cleaner(t, Config{KafkaTimeout: 500 * time.Millisecond}).RunOnce(ctx)
	require.NoError(t, err)
	require.Less(t, time.Since(t0), 10*time.Second)
	require.Equal(t, []string{"behind"}, b.keys(t, "t"), "no log start: the key of known position stays; the time rule took the other")
	tr, _ := rep.Topic("t")
	require.False(t, tr.Exact)
	require.True(t, tr.Timed)
	require.ErrorContains(t, tr.OffsetsErr, string(ReasonKafkaUnreachable))
	require.ErrorContains(t, tr.OffsetsErr, "no answer within")
	require.Contains(t, tr.Note(), "exact rule unavailable")

	b.cluster.Close()
	rep, err = b.cleaner(t, Config{}).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"behind"}, b.keys(t, "t"))
	tr, _ = rep.Topic("t")
	require.True(t, tr.Skipped)
	require.Equal(t, ReasonKafkaUnreachable, tr.Reason)
	require.Contains(t, tr.Note(), "not pruned this pass: kafka_unreachable")
	require.NotContains(t, tr.Note(), "never")
}

// TestExactRuleTopicRecreated: a topic deleted and recreated under the same
// name restarts its offsets at 0. Its keys are judged against the new
// incarnation's log start only (the pass reads Kafka after its clock, so no
// key newer than the read is judged at all): old keys above it are kept
// longer, never deleted early. The report names the incarnation (topic id).
func TestExactRuleTopicRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-30 * 24 * time.Hour)
	b.topic(t, "t", nil)
	b.produce(t, "t", 5, time.Now())
	require.NoError(t, b.sadmin.DeleteRecords("t", map[int32]int64{0: 4}))
	b.insertAt(t, "t", "young", 0, 4, time.Now()) // within the buffer: kept throughout
	c := b.cleaner(t, Config{Buffer: time.Hour})
	rep, err := c.RunOnce(ctx)
	require.NoError(t, err)
	first, _ := rep.Topic("t")
	require.NotEmpty(t, first.TopicID)

	b.insertAt(t, "t", "o1", 0, 1, old)
	b.insertAt(t, "t", "o3", 0, 3, old)
	require.NoError(t, b.sadmin.DeleteTopic("t"))
	testutil.Eventually(t, 10*time.Second, "the topic recreated", func() bool {
		return b.sadmin.CreateTopic("t", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false) == nil
	})
	b.produce(t, "t", 2, time.Now())

	rep, err = c.RunOnce(ctx)
	require.NoError(t, err)
	second, _ := rep.Topic("t")
	require.NotEqual(t, first.TopicID, second.TopicID, "a new incarnation")
	require.Equal(t, map[int32]int64{0: 0}, second.LogStarts)
	require.Equal(t, []string{"o1", "o3", "young"}, b.keys(t, "t"), "nothing is behind the new log start")

	require.NoError(t, b.sadmin.DeleteRecords("t", map[int32]int64{0: 2}))
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"o3", "young"}, b.keys(t, "t"))
}
