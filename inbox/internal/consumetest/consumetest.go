// Package consumetest is the world of the consumer adapters' tests (the
// guarantee suite in inbox/internal/consume and inbox/inboxsarama's own
// tests): a private schema with a business table, a private embedded
// broker, records that name their event, and readers of what came of them.
// Only _test files import it (internal/archtest checks).
package consumetest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// EventHeader carries the producer-assigned event id of a test record.
const EventHeader = "event-id"

// World is one test's world: a private schema with a business table
// (effects, deliberately without a unique constraint, so a double effect
// shows as two rows), and a private broker whose topic Topic the test
// consumes.
type World struct {
	DB    *testdb.DB
	Kafka *kfake.Cluster
	Addrs []string
	Topic string
}

// Setup makes a World whose topic "events" (and moreTopics) has partitions
// partitions.
func Setup(t testing.TB, partitions int32, moreTopics ...string) *World {
	t.Helper()
	db := testdb.New(t)
	CreateEffects(t, db)
	c := kafkatest.New(t, kfake.SeedTopics(partitions, append([]string{"events"}, moreTopics...)...),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	return &World{DB: db, Kafka: c, Addrs: c.ListenAddrs(), Topic: "events"}
}

// PoolWithAppName opens a pool on db's schema whose connections carry
// application_name app, so a test can find (and kill) exactly them.
func PoolWithAppName(t testing.TB, db *testdb.DB, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// CreateEffects creates the business table Effect writes to in db.
func CreateEffects(t testing.TB, db *testdb.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE effects (
		id bigserial PRIMARY KEY, event text NOT NULL, topic text NOT NULL,
		partition int NOT NULL, "offset" bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
}

// GroupConfig is a sarama consumer-group config with short group timings.
func GroupConfig() *sarama.Config {
	cfg := kafkatest.Config()
	cfg.Consumer.Group.Session.Timeout = 2 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	cfg.Consumer.Group.Rebalance.Timeout = 5 * time.Second
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	return cfg
}

// Record is one record to produce: an event id (key, header and value).
func Record(topic, event string) *sarama.ProducerMessage {
	return &sarama.ProducerMessage{
		Topic:   topic,
		Key:     sarama.StringEncoder(event),
		Value:   sarama.StringEncoder("payload of " + event),
		Headers: []sarama.RecordHeader{{Key: []byte(EventHeader), Value: []byte(event)}},
	}
}

// Produce sends msgs, acknowledged by the broker, in order.
func (w *World) Produce(t testing.TB, msgs ...*sarama.ProducerMessage) {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(w.Addrs, cfg)
	require.NoError(t, err)
	defer p.Close()
	for len(msgs) > 0 {
		n := min(len(msgs), 500)
		require.NoError(t, p.SendMessages(msgs[:n]))
		msgs = msgs[n:]
	}
}

// Resends builds n records of which about a fifth resend an earlier event id
// (same payload, a different record key, so resends land on other partitions
// and race their originals across members). It returns the records and the
// number of distinct events.
func Resends(topic, prefix string, n int, rng *rand.Rand) ([]*sarama.ProducerMessage, int) {
	msgs := make([]*sarama.ProducerMessage, n)
	unique := 0
	for i := range msgs {
		ev := fmt.Sprintf("%s-%05d", prefix, unique)
		if unique > 0 && rng.IntN(5) == 0 {
			ev = fmt.Sprintf("%s-%05d", prefix, rng.IntN(unique))
		} else {
			unique++
		}
		m := Record(topic, ev)
		m.Key = sarama.StringEncoder(fmt.Sprintf("send-%d", i))
		msgs[i] = m
	}
	return msgs, unique
}

// ProduceEvents sends one Record per event to Topic.
func (w *World) ProduceEvents(t testing.TB, events ...string) {
	t.Helper()
	msgs := make([]*sarama.ProducerMessage, len(events))
	for i, e := range events {
		msgs[i] = Record(w.Topic, e)
	}
	w.Produce(t, msgs...)
}

// Events are n event ids: prefix-00000, prefix-00001...
func Events(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
}

// Effect is the business handler: one row per event it processes.
func Effect(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	ev, _ := m.Header(EventHeader)
	_, err := tx.Exec(ctx, `INSERT INTO effects (event, topic, partition, "offset") VALUES ($1, $2, $3, $4)`,
		string(ev), m.Topic, m.Partition, m.Offset)
	return err
}

// NewInbox is an inbox of consumer with key.
func NewInbox(t testing.TB, consumer string, key inbox.KeyStrategy) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Consumer: consumer, Key: key})
	require.NoError(t, err)
	return ib
}

// Count runs q, which counts something.
func (w *World) Count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, w.DB.Pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// Effects returns the business rows and the distinct events among them.
func (w *World) Effects(t testing.TB) (rows, distinct int) {
	t.Helper()
	require.NoError(t, w.DB.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT event) FROM effects`).Scan(&rows, &distinct))
	return rows, distinct
}

// Committed is group's committed offset of partition of Topic (-1 when
// none, or while the broker cannot answer: a rebalance in progress).
func (w *World) Committed(t testing.TB, group string, partition int32) int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(w.Addrs, kafkatest.Config())
	if err != nil {
		return -1
	}
	defer admin.Close()
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{w.Topic: {partition}})
	if err != nil {
		return -1
	}
	if blk := resp.GetBlock(w.Topic, partition); blk != nil && blk.Err == sarama.ErrNoError {
		return blk.Offset
	}
	return -1
}

// ResetOffset commits offset as group's position on partition 0 of Topic
// (the group has no running member), as `kafka-consumer-groups
// --reset-offsets` does.
func (w *World) ResetOffset(t testing.TB, group string, offset int64) {
	t.Helper()
	client, err := sarama.NewClient(w.Addrs, kafkatest.Config())
	require.NoError(t, err)
	defer client.Close()
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	require.NoError(t, err)
	pom, err := om.ManagePartition(w.Topic, 0)
	require.NoError(t, err)
	pom.ResetOffset(offset, "") // moves backwards only...
	pom.MarkOffset(offset, "")  // ...and this forwards only
	require.NoError(t, pom.Close())
	om.Commit()
	require.NoError(t, om.Close())
	require.Equal(t, offset, w.Committed(t, group, 0))
}

// DLQRow is a dead-letter record as the outbox holds it.
type DLQRow struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers map[string]string
}

// OutboxDLQ reads the outbox rows of topic (the dead-letter records not
// yet published by a relay).
func (w *World) OutboxDLQ(t testing.TB, topic string) []DLQRow {
	t.Helper()
	rows, err := w.DB.Pool.Query(context.Background(),
		`SELECT topic, key, value, coalesce(headers, '[]') FROM pgbox_outbox WHERE topic = $1 ORDER BY id`, topic)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DLQRow, error) {
		var d DLQRow
		var hs []byte
		if err := r.Scan(&d.Topic, &d.Key, &d.Value, &hs); err != nil {
			return d, err
		}
		var list []struct {
			K string `json:"k"`
			V []byte `json:"v"`
		}
		if err := json.Unmarshal(hs, &list); err != nil {
			return d, err
		}
		d.Headers = map[string]string{}
		for _, h := range list {
			d.Headers[h.K] = string(h.V)
		}
		return d, nil
	})
	require.NoError(t, err)
	return out
}
