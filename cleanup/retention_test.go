package cleanup

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kfake answers DescribeConfigs for topics with the configs they were created
// with, and sarama's batch DescribeConfigs describes every topic in one
// request. The rest of the suite relies on both.
func TestDescribeTopicsRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "orders", map[string]string{"retention.ms": "3600000", "segment.ms": "600000"})
	b.topic(t, "ledger", map[string]string{"cleanup.policy": "compact,delete"})
	b.topic(t, "audit", map[string]string{"retention.ms": "-1"})
	b.topic(t, "plain", nil)
	seen := b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.DescribeConfigs}, Observe: true, Count: -1})

	got := describeTopics(context.Background(), b.admin, 5*time.Second, []string{"orders", "ledger", "audit", "plain", "ghost"})

	require.Equal(t, 1, seen.Hits(), "all topics must be described in one request")
	require.Equal(t, Reason(""), got["orders"].reason, "%v", got["orders"].err)
	require.Equal(t, int64(3600000), got["orders"].retentionMs)
	require.Equal(t, int64(600000), got["orders"].segmentMs)
	require.Equal(t, time.Hour, got["orders"].retention)
	require.Equal(t, 10*time.Minute, got["orders"].segment)
	require.Equal(t, "delete", got["orders"].policy)

	require.Equal(t, ReasonCompactDelete, got["ledger"].reason, "compact,delete has no time window: %v", got["ledger"].err)
	require.Equal(t, "compact,delete", got["ledger"].policy)
	require.Equal(t, ReasonInfiniteRetention, got["audit"].reason)
	require.Equal(t, Reason(""), got["plain"].reason)
	require.Equal(t, 7*24*time.Hour, got["plain"].retention, "kfake's default retention.ms")
	require.Equal(t, ReasonTopicNotFound, got["ghost"].reason)
}

// rowCase is one inbox key placed relative to its topic's cutoff.
type rowCase struct {
	key      string
	received time.Duration // relative to the cutoff
	record   *time.Duration
	kept     bool
}

func d(v time.Duration) *time.Duration { return &v }

// The rows every prunable topic gets, relative to its own cutoff.
var boundaryRows = []rowCase{
	{key: "a-way-old", received: -30 * 24 * time.Hour, kept: false},
	{key: "b-1us-before", received: -time.Microsecond, kept: false},
	{key: "c-exactly-at-cutoff", received: 0, kept: true},
	{key: "d-1us-after", received: time.Microsecond, kept: true},
	{key: "e-new", received: 20 * time.Hour, kept: true},
	// The producer's clock runs ahead: the record's timestamp keeps it.
	{key: "f-record-ahead", received: -time.Hour, record: d(time.Second), kept: true},
	// A record timestamp behind the receive time does not shorten its life.
	{key: "g-record-behind", received: time.Second, record: d(-48 * time.Hour), kept: true},
	{key: "h-both-old", received: -time.Hour, record: d(-2 * time.Hour), kept: false},
	{key: "i-record-at-cutoff", received: -time.Hour, record: d(0), kept: true},
}

func TestRetentionPerTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	b.topic(t, "short", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(10 * time.Minute)})
	b.topic(t, "long", map[string]string{"retention.ms": ms(7 * 24 * time.Hour), "segment.ms": ms(24 * time.Hour)})
	b.topic(t, "own-buffer", map[string]string{"retention.ms": ms(2 * time.Hour), "segment.ms": ms(time.Minute)})
	b.topic(t, "compacted", map[string]string{"cleanup.policy": "compact"})
	b.topic(t, "compact-delete", map[string]string{"cleanup.policy": "compact,delete", "retention.ms": ms(time.Hour)})
	b.topic(t, "infinite", map[string]string{"retention.ms": "-1"})
	b.topic(t, "forced", map[string]string{"retention.ms": "-1"})
	b.topic(t, "forced-shorter", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	// "missing" is never created in Kafka.

	windows := map[string]time.Duration{
		"short":          time.Hour + 10*time.Minute + 24*time.Hour,
		"long":           7*24*time.Hour + 24*time.Hour + 24*time.Hour,
		"own-buffer":     2*time.Hour + time.Minute + 5*time.Minute,
		"forced":         48 * time.Hour,
		"forced-shorter": time.Hour + time.Hour + 24*time.Hour, // Kafka's window is longer than the forced 1h
	}
	for topic, w := range windows {
		cutoff := now.Add(-w)
		for _, r := range boundaryRows {
			var rec *time.Time
			if r.record != nil {
				rec = ptr(cutoff.Add(*r.record))
			}
			b.insertKey(t, topic, r.key, cutoff.Add(r.received), rec)
		}
	}
	// No time window: keys of unknown position are kept, however old.
	// compact,delete has none either: the time rule is unsafe under
	// compaction (see TestExactRuleCompactDelete).
	skipped := map[string]Reason{
		"compacted":      ReasonCompacted,
		"compact-delete": ReasonCompactDelete,
		"infinite":       ReasonInfiniteRetention,
		"missing":        ReasonTopicNotFound,
	}
	for topic := range skipped {
		b.insertKey(t, topic, "ancient", now.Add(-365*24*time.Hour), nil)
	}

	c := b.cleaner(t, Config{
		Now: func() time.Time { return now },
		Topics: map[string]Topic{
			"own-buffer":     {Buffer: 5 * time.Minute},
			"forced":         {Window: 48 * time.Hour},
			"forced-shorter": {Window: time.Hour},
		},
		BatchSize: 2, // several batches per topic, and keyset paging across them
	})
	describes := b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.DescribeConfigs}, Observe: true, Count: -1})
	rep, err := c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, describes.Hits(), "one DescribeConfigs request for all topics of a pass")
	require.False(t, rep.Locked)
	require.Equal(t, now, rep.Now)
	require.Len(t, rep.Topics, len(windows)+len(skipped))

	for topic, w := range windows {
		var want []string
		for _, r := range boundaryRows {
			if r.kept {
				want = append(want, r.key)
			}
		}
		require.Equal(t, want, b.keys(t, topic), "topic %s", topic)
		tr, ok := rep.Topic(topic)
		require.True(t, ok, topic)
		require.False(t, tr.Skipped, topic)
		require.Equal(t, w, tr.Window, topic)
		requireSameTime(t, now.Add(-w), tr.Cutoff, topic)
		require.Equal(t, int64(3), tr.Deleted, topic)
		requireSameTime(t, tr.Cutoff, tr.Oldest, topic, ": oldest remaining key sits exactly at the cutoff")
		require.Equal(t, time.Duration(0), tr.Margin, topic)
		require.Equal(t, w, tr.OldestAge, topic)
	}
	f, _ := rep.Topic("forced")
	require.True(t, f.Forced)
	require.Equal(t, ReasonInfiniteRetention, f.Reason)
	fs, _ := rep.Topic("forced-shorter")
	require.False(t, fs.Forced, "a forced window never shortens Kafka's")
	s, _ := rep.Topic("short")
	require.Equal(t, int64(3600000), s.RetentionMs)
	require.Equal(t, int64(600000), s.SegmentMs)
	require.Equal(t, "delete", s.CleanupPolicy)

	for topic, reason := range skipped {
		require.Equal(t, []string{"ancient"}, b.keys(t, topic), "topic %s must not be pruned", topic)
		tr, ok := rep.Topic(topic)
		require.True(t, ok, topic)
		require.False(t, tr.Timed, topic)
		require.Equal(t, topic == "missing", tr.Skipped, "%s: skipped only where the exact rule cannot run either", topic)
		require.Equal(t, reason, tr.Reason, topic)
		require.Error(t, tr.Err, topic)
		require.Zero(t, tr.Deleted, topic)
		require.Equal(t, 365*24*time.Hour, tr.OldestAge, topic)
	}
	require.Len(t, rep.Skipped(), 1)
	require.Equal(t, int64(3*len(windows)), rep.Deleted)

	st := c.Stats()
	require.Equal(t, int64(1), st.Passes)
	require.Equal(t, rep.Deleted, st.Deleted)
	require.Equal(t, int64(1), st.TopicsSkipped)
	require.Equal(t, ReasonTopicNotFound, st.Topics["missing"].Reason)
	require.True(t, st.Topics["missing"].Skipped)
	require.Equal(t, int64(3), st.Topics["short"].TimeDeleted)
	require.Equal(t, int64(3), st.Topics["short"].Deleted)

	// A second pass finds nothing more to delete.
	rep, err = c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, rep.Deleted)
}

// The default clock is the database's, the one that stamps received_at.
func TestDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	var dbNow time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&dbNow))
	b.insertKey(t, "t", "old", dbNow.Add(-27*time.Hour), nil)
	b.insertKey(t, "t", "young", dbNow.Add(-25*time.Hour), nil)

	rep, err := b.cleaner(t, Config{}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"young"}, b.keys(t, "t"))
	require.WithinDuration(t, dbNow, rep.Now, time.Minute)
}

func TestKafkaDownDeletesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "t1", map[string]string{"retention.ms": ms(time.Hour)})
	b.topic(t, "t2", map[string]string{"retention.ms": ms(time.Hour)})
	old := time.Now().Add(-365 * 24 * time.Hour)
	b.bulkKeys(t, "t1", 10, old)
	b.bulkKeys(t, "t2", 10, old)
	c := b.cleaner(t, Config{})
	forced := b.cleaner(t, Config{Topics: map[string]Topic{"t2": {Window: 30 * 24 * time.Hour}}})

	b.cluster.Close()

	rep, err := c.RunOnce(context.Background())
	require.NoError(t, err, "Kafka being down is a skip reason, not a pass error")
	require.Equal(t, 20, b.count(t))
	require.Len(t, rep.Skipped(), 2)
	for _, tr := range rep.Topics {
		require.Equal(t, ReasonKafkaUnreachable, tr.Reason, tr.Topic)
		require.Error(t, tr.Err)
	}

	// A forced window is the operator's promise, and holds without Kafka.
	rep, err = forced.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 10, len(b.keys(t, "t1")))
	require.Empty(t, b.keys(t, "t2"))
	tr, _ := rep.Topic("t2")
	require.True(t, tr.Forced)
	require.Equal(t, ReasonKafkaUnreachable, tr.Reason)
}

// A broker that accepts the request and never answers: the pass does not hang
// past KafkaTimeout, and deletes nothing.
func TestKafkaHungDeletesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour)})
	b.bulkKeys(t, "t", 5, time.Now().Add(-365*24*time.Hour))
	b.cluster.ControlKey(int16(kmsg.DescribeConfigs), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		return nil, nil, true // swallow the request
	})
	c := b.cleaner(t, Config{KafkaTimeout: 500 * time.Millisecond})
	rep, err := c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 5, b.count(t))
	tr, _ := rep.Topic("t")
	require.Equal(t, ReasonKafkaUnreachable, tr.Reason)
	require.ErrorContains(t, tr.Err, "no answer within")
}

func TestConfigUnreadable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "denied", map[string]string{"retention.ms": ms(time.Hour)})
	b.topic(t, "garbled", map[string]string{"retention.ms": ms(time.Hour)})
	b.topic(t, "fine", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	old := time.Now().Add(-365 * 24 * time.Hour)
	for _, tp := range []string{"denied", "garbled", "fine"} {
		b.bulkKeys(t, tp, 3, old)
	}
	b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.DescribeConfigs}, Resource: "denied", Err: kerr.TopicAuthorizationFailed, Count: -1})
	// Rewrite the real answer so one topic's retention.ms is not a number.
	b.cluster.ControlKey(int16(kmsg.DescribeConfigs), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, rr := range req.(*kmsg.DescribeConfigsRequest).Resources {
			r := kmsg.NewDescribeConfigsResponseResource()
			r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
			switch rr.ResourceName {
			case "denied":
				r.ErrorCode = kerr.TopicAuthorizationFailed.Code
			default:
				ret := ms(time.Hour)
				if rr.ResourceName == "garbled" {
					ret = "soon"
				}
				for k, v := range map[string]string{"retention.ms": ret, "segment.ms": ms(time.Hour), "cleanup.policy": "delete"} {
					cfg := kmsg.NewDescribeConfigsResponseResourceConfig()
					cfg.Name, cfg.Value = k, ptr(v)
					r.Configs = append(r.Configs, cfg)
				}
			}
			resp.Resources = append(resp.Resources, r)
		}
		return resp, nil, true
	})

	rep, err := b.cleaner(t, Config{}).RunOnce(context.Background())
	require.NoError(t, err)
	for _, tp := range []string{"denied", "garbled"} {
		tr, _ := rep.Topic(tp)
		require.False(t, tr.Timed, tp)
		require.True(t, tr.Exact, "the exact rule needs no config: %s", tp)
		require.Equal(t, ReasonConfigUnreadable, tr.Reason, tp)
		require.Len(t, b.keys(t, tp), 3, tp)
	}
	d, _ := rep.Topic("denied")
	require.ErrorIs(t, d.Err, sarama.ErrTopicAuthorizationFailed)
	g, _ := rep.Topic("garbled")
	require.ErrorContains(t, g.Err, `retention.ms "soon"`)
	require.Empty(t, b.keys(t, "fine"))
}

func TestDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "a", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.topic(t, "b", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	now := fixedNow()
	b.bulkKeys(t, "a", 7, now.Add(-30*time.Hour))
	b.bulkKeys(t, "a", 2, now.Add(-time.Hour))
	b.bulkKeys(t, "b", 4, now.Add(-30*time.Hour))

	rep, err := b.cleaner(t, Config{DryRun: true, Now: func() time.Time { return now }, BatchSize: 2}).RunOnce(context.Background())
	require.NoError(t, err)
	require.True(t, rep.DryRun)
	require.Equal(t, 13, b.count(t), "a dry run deletes nothing")
	require.Zero(t, rep.Deleted)
	require.Zero(t, rep.Batches)
	a, _ := rep.Topic("a")
	require.Equal(t, int64(7), a.WouldDelete)
	require.Zero(t, a.Deleted)
	require.Less(t, a.Margin, time.Duration(0), "keys older than the cutoff remain")
	bb, _ := rep.Topic("b")
	require.Equal(t, int64(4), bb.WouldDelete)
}

func TestNoKeysNoKafka(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seen := b.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.DescribeConfigs}, Observe: true, Count: -1})
	rep, err := b.cleaner(t, Config{}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Empty(t, rep.Topics)
	require.Zero(t, seen.Hits(), "an empty inbox needs no Kafka request")
}

func TestListTopicsUsesLooseIndexScan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, tp := range []string{"c", "a", "b"} {
		b.bulkKeys(t, tp, 2000, time.Now())
	}
	_, err := b.db.Pool.Exec(ctx, `ANALYZE pgbox_inbox`)
	require.NoError(t, err)
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	topics, err := listTopics(ctx, conn, sqlTopics)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, topics)

	plan := explain(t, b, `EXPLAIN (ANALYZE, BUFFERS) `+sqlTopics)
	require.Contains(t, plan, "pgbox_inbox_position_idx", "the one index leading with topic")
	require.NotContains(t, plan, "Seq Scan")

	// The time rule, the oldest key and the dry run's count read a topic's
	// keys by age one consumer at a time (migration 00130).
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{inboxDeleteBatch("", 2), []any{"a", time.Time{}, time.Now(), 10000, false, "svc", "other"}},
		{inboxDeleteBatch(skipLocked, 2), []any{"a", time.Time{}, time.Now(), 10000, true, "svc", "other"}},
		{sqlTopicConsumers, []any{"a"}},
		{sqlOldestInbox, []any{"a", time.Time{}}},
		// A dry run's count: the planner may take the position index's
		// topic instead (it counts, so it reads the keys either way).
		{sqlCountInboxTimed, []any{"a", time.Now(), false, []int32{0}, []int64{5}, time.Now()}},
	} {
		plan = explain(t, b, `EXPLAIN `+q.sql, q.args...)
		if q.sql != sqlCountInboxTimed {
			require.Contains(t, plan, "pgbox_inbox_consumer_topic_age_idx", q.sql)
		}
		if strings.Contains(q.sql, "WITH RECURSIVE c") {
			require.Contains(t, plan, "pgbox_inbox_pkey", "the consumers from the primary key: %s", q.sql)
		}
		require.NotContains(t, plan, "Seq Scan", q.sql)
		require.NotContains(t, plan, "pgbox_inbox_topic_age_idx", q.sql)
	}
	require.Contains(t, explain(t, b, `EXPLAIN `+inboxDeleteBatch("", 1), "a", time.Time{}, time.Now(), 10000, false, "svc"), "Tid")

	// The exact rule reads one partition's keys behind its log start.
	plan = explain(t, b, `EXPLAIN `+sqlDeleteInboxExact, "a", int32(0), int64(0), int64(100), time.Now(), 10000)
	require.Contains(t, plan, "pgbox_inbox_position_idx")
	require.Contains(t, plan, "Tid")
	require.NotContains(t, plan, "Seq Scan")
}

func explain(t *testing.T, b *testBundle, q string, args ...any) string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), q, args...)
	require.NoError(t, err)
	var out string
	for rows.Next() {
		var l string
		require.NoError(t, rows.Scan(&l))
		out += l + "\n"
	}
	require.NoError(t, rows.Err())
	return out
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := New(Config{})
	require.ErrorContains(t, err, "missing Pool")
	require.ErrorContains(t, err, "missing Admin")
	b := setup(t)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{BatchSize: BatchSizeMax + 1}, "BatchSize 100001 is out of range"},
		{Config{Buffer: -time.Second}, "Buffer -1s is negative"},
		{Config{Pause: -time.Second}, "Pause"},
		{Config{Topics: map[string]Topic{"x": {Window: -time.Hour}}}, `Topics["x"].Window`},
	} {
		tc.cfg.Pool, tc.cfg.Admin = b.db.Pool, b.admin
		_, err := New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// Config.Window forces a window for every topic Kafka gives none, and a
// per-topic Window overrides it.
func TestGlobalForcedWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	b.topic(t, "compacted", map[string]string{"cleanup.policy": "compact"})
	for _, tp := range []string{"compacted", "missing", "own"} {
		b.insertKey(t, tp, "old", now.Add(-11*24*time.Hour), nil)
		b.insertKey(t, tp, "mid", now.Add(-5*24*time.Hour), nil)
	}
	rep, err := b.cleaner(t, Config{
		Now:    func() time.Time { return now },
		Window: 10 * 24 * time.Hour,
		Topics: map[string]Topic{"own": {Window: 4 * 24 * time.Hour}},
	}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"mid"}, b.keys(t, "compacted"))
	require.Equal(t, []string{"mid"}, b.keys(t, "missing"))
	require.Empty(t, b.keys(t, "own"))
	for _, tr := range rep.Topics {
		require.True(t, tr.Forced, tr.Topic)
		require.False(t, tr.Skipped, tr.Topic)
	}
	m, _ := rep.Topic("missing")
	require.Equal(t, ReasonTopicNotFound, m.Reason)
	require.Empty(t, rep.Skipped())
}

// Logs: snake_case keys; by-design skips at INFO, others at WARN; a
// cancelled pass is not an error.
func TestLogs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "compacted", map[string]string{"cleanup.policy": "compact"})
	b.insertKey(t, "compacted", "k", time.Now(), nil)
	b.insertKey(t, "missing", "k", time.Now(), nil)
	var buf syncBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, err := b.cleaner(t, Config{Logger: logger}).RunOnce(context.Background())
	require.NoError(t, err)
	out := buf.String()
	require.Contains(t, out, `"level":"INFO","msg":"cleanup: no time window, exact rule only","topic":"compacted","reason":"compacted"`)
	require.Contains(t, out, `"level":"WARN","msg":"cleanup skipped topic","topic":"missing","reason":"topic_not_found"`)
	require.Contains(t, out, `"msg":"cleanup pass done","deleted":0,"topics":2,"skipped":1,"batches":`)
	require.NotContains(t, out, `"msg":"cleanup pruned topic","topic":"missing"`, "not for skipped topics")

	buf.Reset()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = b.cleaner(t, Config{Logger: logger}).RunOnce(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.NotContains(t, buf.String(), `"level":"ERROR"`)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}
