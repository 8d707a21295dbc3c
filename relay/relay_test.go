package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// Every committed row arrives exactly as written — key, value, headers, event
// id, creation time — and rows of rolled-back transactions never do.
func TestPublishesCommittedRowsExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	want := []outbox.Message{
		{Topic: b.topic, Key: []byte("order-1"), Value: []byte(`{"n":1}`),
			Headers: []outbox.Header{{Key: "trace", Value: []byte("t1")}, {Key: "bin", Value: []byte{0, 1, 0xff}}, {Key: "", Value: []byte("e")}, {Key: "nil"}}},
		{Topic: b.topic, Key: []byte("order-1"), Value: []byte(`{"n":2}`)},
		{Topic: b.topic, Key: []byte("order-2"), Value: nil}, // tombstone
		{Topic: b.topic, Key: nil, Value: []byte("keyless")},
		{Topic: b.topic, Key: []byte("order-3"), Value: []byte("spoofed"),
			Headers: []outbox.Header{{Key: relay.EventIDHeader, Value: []byte("not-mine")}}},
	}
	b.write(t, want[:2]...)
	// A rolled-back transaction in between.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx, msg(b.topic, "order-1", "rolled back")))
	require.NoError(t, tx.Rollback(ctx))
	b.write(t, want[2:4]...)
	// outbox.Write refuses a header named like the relay's; a row written
	// by other means gets the relay's header instead of its own.
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, headers)
		VALUES (gen_random_uuid(), $1, $2, $3, $4, $5)`, slot.Of(want[4].Key, outbox.EventID{}), want[4].Topic, want[4].Key, want[4].Value,
		`[{"k": "pgbox-event-id", "v": "bm90LW1pbmU="}]`)
	require.NoError(t, err)

	// The rows' event ids and times, to compare with the headers.
	type stored struct {
		eventID string
		created time.Time
	}
	var ids []stored
	rows, err := b.db.Pool.Query(ctx, `SELECT event_id::text, created_at FROM pgbox_outbox ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var s stored
		require.NoError(t, rows.Scan(&s.eventID, &s.created))
		ids = append(ids, s)
	}
	require.NoError(t, rows.Err())
	require.Len(t, ids, len(want))

	// The relay starts once the rows' ids and times are read (a running
	// relay may publish and delete them before this test reads them).
	start(t, b.config("a"))
	got := kafkaReadAll(t, b, len(want))
	require.Len(t, got, len(want), "exactly the committed rows, once each")
	byEvent := map[string]*sarama.ConsumerMessage{}
	for _, m := range got {
		id, ok := header(m, relay.EventIDHeader)
		require.True(t, ok, "every record carries %s", relay.EventIDHeader)
		byEvent[id] = m
		require.NotEqual(t, "rolled back", string(m.Value))
	}
	for i, w := range want {
		m := byEvent[ids[i].eventID]
		require.NotNil(t, m, "row %d (event %s) published", i, ids[i].eventID)
		require.Equal(t, w.Key == nil, m.Key == nil, "row %d key", i)
		require.Equal(t, string(w.Key), string(m.Key), "row %d key", i)
		require.Equal(t, w.Value == nil, m.Value == nil, "row %d value", i)
		require.Equal(t, string(w.Value), string(m.Value), "row %d value", i)
		var rowHeaders []outbox.Header
		for _, h := range w.Headers {
			if h.Key != relay.EventIDHeader {
				rowHeaders = append(rowHeaders, h)
			}
		}
		require.Len(t, m.Headers, len(rowHeaders)+2, "row %d: row headers + event id + created at", i)
		for j, h := range rowHeaders {
			require.Equal(t, h.Key, string(m.Headers[j].Key))
			require.Equal(t, h.Value, m.Headers[j].Value)
		}
		created, ok := header(m, relay.CreatedAtHeader)
		require.True(t, ok)
		ts, err := time.Parse(time.RFC3339Nano, created)
		require.NoError(t, err)
		require.True(t, ids[i].created.Equal(ts), "row %d created-at header %s, row %s", i, ts, ids[i].created)
	}
	// One key, one partition, in write order.
	require.Equal(t, byEvent[ids[0].eventID].Partition, byEvent[ids[1].eventID].Partition)
	require.Less(t, byEvent[ids[0].eventID].Offset, byEvent[ids[1].eventID].Offset)
	// Published rows are deleted.
	waitFor(t, "outbox emptied", func() bool { return b.outboxCount(t, "true") == 0 })
}

func kafkaReadAll(t *testing.T, b *testBundle, want int) []*sarama.ConsumerMessage {
	t.Helper()
	return readTopic(t, b, b.topic, want)
}

// The sequence-gap race: a transaction that took a lower id commits after
// higher ids were published. Its row must still be published.
func TestSequenceGapRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	start(t, b.config("a"))

	slow, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, slow, msg(b.topic, "k", "late")))
	var slowID int64
	require.NoError(t, slow.QueryRow(ctx, `SELECT max(id) FROM pgbox_outbox`).Scan(&slowID))

	for i := range 20 {
		b.write(t, msg(b.topic, keyed(i%4), "on time")) // same slots as "k" for some
	}
	got := readTopic(t, b, b.topic, 20)
	require.Len(t, got, 20, "the higher ids are published while the lower one is uncommitted")
	var minCommitted int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT coalesce(min(id), 0) FROM pgbox_outbox`).Scan(&minCommitted))
	require.Zero(t, minCommitted, "higher ids already deleted")

	require.NoError(t, slow.Commit(ctx))
	got = readTopic(t, b, b.topic, 21)
	require.Len(t, got, 21)
	var late int
	for _, m := range got {
		if string(m.Value) == "late" {
			late++
		}
	}
	require.Equal(t, 1, late, "the late-committing lower id (%d) is published", slowID)
}

// New rejects a config the relay cannot run with, naming the setting; of
// Config.Kafka, only what the relay's own producer reads.
func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := b.config("v")
	cases := []struct {
		name   string
		mutate func(c *relay.Config)
		want   string
	}{
		{"no pool", func(c *relay.Config) { c.Pool = nil }, "Config.Pool is nil"},
		{"no brokers", func(c *relay.Config) { c.Brokers = nil }, "Config.Brokers is empty"},
		{"acks", func(c *relay.Config) { c.Kafka.Producer.RequiredAcks = sarama.WaitForLocal }, "Producer.RequiredAcks is 1: set it to sarama.WaitForAll (the relay deletes a row as soon as Kafka acknowledges"},
		{"no acks", func(c *relay.Config) { c.Kafka.Producer.RequiredAcks = sarama.NoResponse }, "Producer.RequiredAcks is 0: set it to sarama.WaitForAll"},
		{"version", func(c *relay.Config) { c.Kafka.Version = sarama.V0_10_2_0 }, "Config.Kafka.Version is 0.10.2.0: set it to at least 0.11.0.0"},
		{"sarama's own check", func(c *relay.Config) { c.Kafka.Producer.Retry.Max = -1 }, "Config.Kafka (sarama's own check): "},
		{"lanes", func(c *relay.Config) { c.Lanes = 300 }, "Config.Lanes is 300: use 1..256"},
		{"ttl", func(c *relay.Config) { c.LeaseTTL = 150 * time.Millisecond }, "less than twice Config.HeartbeatInterval"},
		{"attempts", func(c *relay.Config) { c.MaxAttempts = -1 }, "Config.MaxAttempts is -1"},
		{"negative poll", func(c *relay.Config) { c.PollInterval = -time.Second }, "Config.PollInterval is -1s"},
		{"empty broker", func(c *relay.Config) { c.Brokers = []string{c.Brokers[0], ""} }, "Config.Brokers[1] is empty (an unset variable?)"},
		{"blank channel", func(c *relay.Config) { c.Channel = " " }, "Config.Channel is blank"},
		{"unknown-topic window", func(c *relay.Config) { c.UnknownTopicWindow = -2 * time.Second }, "Config.UnknownTopicWindow is -2s"},
		{"outage alert", func(c *relay.Config) { c.KafkaOutageAlert = -time.Second }, "Config.KafkaOutageAlert is -1s"},
	}
	for _, tc := range cases {
		cfg := base
		cfg.Kafka = kafkaConfig()
		tc.mutate(&cfg)
		_, err := relay.New(cfg)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	// The defaults are valid, and New does not modify the caller's sarama config.
	cfg := base
	cfg.Kafka = nil
	_, err := relay.New(cfg)
	require.NoError(t, err)
	k := kafkaConfig()
	cfg.Kafka = k
	_, err = relay.New(cfg)
	require.NoError(t, err)
	require.NotNil(t, k.Producer.Partitioner)
	require.Equal(t, sarama.NewConfig().Producer.Partitioner == nil, k.Producer.Partitioner == nil)
}

// Instances that disagree on Lanes would give one slot two owners: the second
// refuses to start while the first is alive.
func TestLaneCountMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := start(t, b.config("a"))
	waitFor(t, "a holds lanes", func() bool { return a.r.Stats().Lanes == 8 })

	cfg := b.config("b")
	cfg.Lanes = 4
	r, err := relay.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorIs(t, err, relay.ErrLaneCountMismatch)
	require.ErrorContains(t, err, "live instances use 8 lanes, Config.Lanes is 4")

	// Once a is gone, the lane count may change.
	a.stop(t)
	c := start(t, cfg)
	waitFor(t, "b holds its 4 lanes", func() bool { return c.r.Stats().Lanes == 4 })
	b.write(t, msg(b.topic, "k", "v"))
	require.Len(t, readTopic(t, b, b.topic, 1), 1)
}

// Run returns promptly when ctx is canceled, even with a batch in flight
// against a broker that stopped answering, and releases its lanes.
func TestStopIsPrompt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config("a")
	cfg.StopTimeout = 500 * time.Millisecond
	a := start(t, cfg)
	b.write(t, msg(b.topic, "k", "first"))
	require.Len(t, readTopic(t, b, b.topic, 1), 1)

	// The broker swallows produce requests from now on.
	var swallowed = make(chan struct{}, 1)
	b.cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		select {
		case swallowed <- struct{}{}:
		default:
		}
		return nil, nil, true
	})
	b.write(t, msg(b.topic, "k", "stuck"))
	<-swallowed
	stopped := make(chan struct{})
	go func() { a.stop(t); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after ctx was canceled")
	}
	// The stuck row was released, not marked, and the lanes are free.
	require.Equal(t, 1, b.outboxCount(t, "parked_at IS NULL AND attempts = 0"))
	var owned int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL`).Scan(&owned))
	require.Zero(t, owned)
}

// Without the migrations, Run says so instead of retrying forever.
func TestRunWithoutMigrations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Pool.Exec(context.Background(), `DROP TABLE pgbox_relay_lanes`)
	require.NoError(t, err)
	r, err := relay.New(b.config("a"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorIs(t, err, relay.ErrNeedsOperator)
	require.ErrorContains(t, err, "relay migrate up")
	require.NoError(t, ctx.Err())
}

// Two processes given the same Instance name are still two instances: they
// split the lanes instead of both publishing them.
func TestSameInstanceNameTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x, y := start(t, b.config("same")), start(t, b.config("same"))
	require.NotEqual(t, x.r.Instance(), y.r.Instance())
	waitFor(t, "lanes split", func() bool {
		sx, sy := x.r.Stats(), y.r.Stats()
		return sx.Lanes > 0 && sy.Lanes > 0 && sx.Lanes+sy.Lanes == 8
	})
	for i := range 20 {
		b.write(t, msg(b.topic, keyed(i), "v"))
	}
	require.Len(t, readTopic(t, b, b.topic, 20), 20)
}

// The settings of sarama's AsyncProducer do not apply to the relay, which
// writes record batches itself as an idempotent producer: New accepts any
// value of them, and such a relay publishes every row, in order.
func TestAsyncProducerSettingsDoNotApply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("a")
	k := kafkaConfig()
	k.Producer.Idempotent = false
	k.Producer.Return.Successes = false
	k.Producer.Return.Errors = false
	k.Net.MaxOpenRequests = 5
	k.Producer.Retry.Max = 0
	k.Producer.Flush.Messages = 1
	cfg.Kafka = k
	_, err := relay.New(cfg)
	require.NoError(t, err)

	for n := range 10 { // three keys, ten records each, one transaction per round
		b.write(t, msg(b.topic, "a", fmt.Sprint(n)), msg(b.topic, "b", fmt.Sprint(n)), msg(b.topic, "c", fmt.Sprint(n)))
	}
	rr := start(t, cfg)
	waitFor(t, "30 records published", func() bool { return rr.r.Stats().Published == 30 })
	next := map[string]int{}
	for _, m := range readTopic(t, b, b.topic, 30) {
		require.Equal(t, fmt.Sprint(next[string(m.Key)]), string(m.Value), "key %s in order, once", m.Key)
		next[string(m.Key)]++
	}
	require.Equal(t, map[string]int{"a": 10, "b": 10, "c": 10}, next)
	require.Zero(t, b.outboxCount(t, "true"), "every row deleted")
}
