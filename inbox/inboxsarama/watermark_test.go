package inboxsarama_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testutil"
)

// newWatermarkInbox returns an inbox in watermark mode, with keyed dedup on
// key too when key is given.
func newWatermarkInbox(t testing.TB, consumer string, key ...inbox.KeyStrategy) *inbox.Inbox {
	t.Helper()
	cfg := inbox.Config{Consumer: consumer, Dedup: inbox.DedupWatermark}
	if len(key) > 0 {
		cfg.Dedup, cfg.Key = inbox.DedupWatermarkAndKeys, key[0]
	}
	ib, err := inbox.New(cfg)
	require.NoError(t, err)
	return ib
}

// records returns the business rows and the distinct records among them.
func records(t testing.TB, b *cgBundle) (rows, distinct int) {
	t.Helper()
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT (topic, partition, "offset")) FROM effects`).Scan(&rows, &distinct))
	return rows, distinct
}

// Members join and leave one group (partitions move between them, and the
// new owner re-reads what the old one processed but never committed to
// Kafka): in watermark mode every record has exactly one business row,
// with one state row per partition and nothing in pgbox_inbox. With event-id
// keys added, a fifth of the records resend an earlier event, and every
// event has exactly one business row.
func TestConsumerWatermarkRebalances(t *testing.T) {
	t.Parallel()
	for _, withKeys := range []bool{false, true} {
		name := "watermark"
		if withKeys {
			name = "watermark+keys"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := cgSetup(t, 4)
			msgs, unique := sends(b.Topic, "ev", 6000, rand.New(rand.NewPCG(3, 4)))
			ib := newWatermarkInbox(t, "svc")
			if withKeys {
				ib = newWatermarkInbox(t, "svc", inbox.ByHeader(eventHeader))
			}
			var handlers []*inboxsarama.Handler
			// The first two members never commit offsets to Kafka (as if each
			// crashed after its transactions): whoever takes their
			// partitions over reads everything they processed again.
			join := func(batch int, commits bool) *member {
				h := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch, RetryBackoff: 10 * time.Millisecond}})
				handlers = append(handlers, h)
				cfg := cgConfig()
				cfg.Consumer.Offsets.AutoCommit.Enable = commits
				return startMemberConfig(t, cfg, b.Addrs, "svc", []string{b.Topic}, h)
			}
			chunk := func(i int) { b.Produce(t, msgs[i*1000:(i+1)*1000]...) }
			// A twin group with the same inbox consumer reads every record
			// too, concurrently: each record is delivered twice at about the
			// same time, the race of a partition handed over while its old
			// owner's transaction is in flight.
			twin := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 10}})
			handlers = append(handlers, twin)
			tm := startMember(t, b.Addrs, "svc-twin", []string{b.Topic}, twin)
			a := join(50, false)
			chunk(0)
			chunk(1)
			bm := join(1, false)
			chunk(2)
			a.stop()
			cm := join(20, true)
			chunk(3)
			chunk(4)
			bm.stop()
			chunk(5)
			want := len(msgs)
			if withKeys {
				want = unique
			}
			testutil.Eventually(t, 90*time.Second, "every record processed", func() bool {
				_, distinct := b.Effects(t)
				return distinct == unique
			})
			testutil.Eventually(t, 30*time.Second, "every record committed", func() bool {
				n := 0
				for p := range int32(4) {
					n += int(b.Committed(t, "svc", p))
				}
				return n == len(msgs)
			})
			cm.stop()
			testutil.Eventually(t, 30*time.Second, "the twin group done", func() bool {
				st := twin.Stats()
				return st.Processed+st.Duplicates >= uint64(len(msgs))
			})
			tm.stop()

			rows, distinct := b.Effects(t)
			require.Equal(t, unique, distinct)
			if !withKeys {
				rows, distinct = records(t, b)
				require.Equal(t, len(msgs), distinct)
			}
			require.Equal(t, want, rows, "no record (event) has two business rows")
			var processed, dups uint64
			for _, h := range handlers {
				processed += h.Stats().Processed
				dups += h.Stats().Duplicates
			}
			require.EqualValues(t, want, processed)
			require.GreaterOrEqual(t, processed+dups, uint64(2*len(msgs)), "every record was delivered at least twice")
			t.Logf("%d records, %d processed, %d duplicates (redeliveries after rebalances, resends)", len(msgs), processed, dups)
			require.Equal(t, 4, b.Count(t, `SELECT count(*) FROM pgbox_inbox_watermark`))
			if withKeys {
				require.Equal(t, unique, b.Count(t, `SELECT count(*) FROM pgbox_inbox`))
			} else {
				require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_inbox`))
			}
		})
	}
}

// The group's offset reset forwards, past records never processed, is
// logged and counted, not silent. (Reset backwards, it reprocesses
// nothing: inbox/internal/consume.TestSuiteWatermarkRewind.)
func TestConsumerWatermarkOffsetResets(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 1)
	ib := newWatermarkInbox(t, "svc")
	var logs testutil.SyncBuffer
	opts := inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))}}
	b.ProduceEvents(t, events("a", 100)...)
	h := mustHandler(t, b.DB.Pool, ib, effect, opts)
	m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	testutil.Eventually(t, 30*time.Second, "first pass", func() bool { return b.Committed(t, "svc", 0) == 100 })
	m.stop()
	require.Equal(t, 100, b.Count(t, `SELECT count(*) FROM effects`))

	// Jump forward past 50 records nobody processed.
	b.ProduceEvents(t, events("b", 60)...)
	b.ResetOffset(t, "svc", 150)
	h = mustHandler(t, b.DB.Pool, ib, effect, opts)
	m = startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	testutil.Eventually(t, 30*time.Second, "after the jump", func() bool { return b.Committed(t, "svc", 0) == 160 })
	m.stop()
	require.EqualValues(t, 10, h.Stats().Processed)
	require.EqualValues(t, 1, h.Stats().Gaps)
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "gap=50 first_skipped_offset=100")
	require.Equal(t, 110, b.Count(t, `SELECT count(*) FROM effects`))
}

// A topic deleted and recreated under the same name restarts its offsets at
// 0; with topic ids (Config.Client) the watermark row starts over for the
// new topic instead of taking its records for duplicates.
func TestConsumerWatermarkTopicRecreated(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 1)
	client, err := sarama.NewClient(b.Addrs, cgConfig())
	require.NoError(t, err)
	defer client.Close()
	h := mustHandler(t, b.DB.Pool, newWatermarkInbox(t, "svc"), effect, inboxsarama.Config{Client: client})

	b.ProduceEvents(t, "old-0", "old-1", "old-2")
	m := startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	testutil.Eventually(t, 30*time.Second, "old effects", func() bool { n, _ := b.Effects(t); return n == 3 })
	m.stop()

	admin, err := sarama.NewClusterAdmin(b.Addrs, kafkatest.Config())
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.DeleteTopic(b.Topic))
	testutil.Eventually(t, 10*time.Second, "topic deleted", func() bool {
		ts, err := admin.ListTopics()
		require.NoError(t, err)
		_, ok := ts[b.Topic]
		return !ok
	})
	require.NoError(t, admin.CreateTopic(b.Topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false))
	require.NoError(t, admin.DeleteConsumerGroup("svc"))
	b.ProduceEvents(t, "new-0", "new-1")

	m = startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	testutil.Eventually(t, 30*time.Second, "new effects", func() bool { n, _ := b.Effects(t); return n == 5 })
	m.stop()
	rows, distinct := b.Effects(t)
	require.Equal(t, 5, rows)
	require.Equal(t, 5, distinct)
	require.Zero(t, h.Stats().Duplicates)
	require.Zero(t, h.Stats().Gaps)
	require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM pgbox_inbox_watermark WHERE "offset" = 1 AND topic_id <> ''`))
}
