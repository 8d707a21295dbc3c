package relay_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// A Fleet's targets send over one Kafka client: a request to a broker
// carries the record batches of every target waiting for it, one per
// partition. Four targets, three of which publish to the same one-partition
// topic (their batches can never share a request: sarama's request keeps
// one batch per partition, a second would replace the first and be lost
// while the broker acknowledged the partition). Rows wait in every outbox
// when the Fleet starts, and the broker holds its first request for a
// second: every target's first batch gathers behind it, at least two on
// the one partition. Later requests are answered 20 ms late.
//
// Must hold: every event arrives once, each key's events in order; some
// request carried several targets' batches; no request carried two
// batches of one partition.
func TestFleetSendsShareRequests(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	kafkatest.CreateTopic(t, addrs, "shared", 1, nil)
	kafkatest.CreateTopic(t, addrs, "own", 3, nil)
	topics := []string{"shared", "shared", "shared", "own"}

	var (
		mu        sync.Mutex
		requests  int
		mixed     int    // requests holding batches of several producers
		twice     string // a partition with two batches in one request
		producers = map[int64]bool{}
	)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		pids := map[int64]bool{}
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range tp.Partitions {
				n, pid := batchesIn(t, p.Records)
				if n > 1 {
					mu.Lock()
					twice = fmt.Sprintf("%s/%d: %d batches", tp.Topic, p.Partition, n)
					mu.Unlock()
				}
				pids[pid] = true
			}
		}
		mu.Lock()
		requests++
		first := requests == 1
		if len(pids) > 1 {
			mixed++
		}
		for pid := range pids {
			producers[pid] = true
		}
		mu.Unlock()
		if first {
			time.Sleep(time.Second)
		} else {
			time.Sleep(20 * time.Millisecond)
		}
		return nil, nil, false
	})

	ts := &tenants{addrs: addrs, decoy: testdb.New(t)}
	var targets []relay.Target
	for i := range topics {
		db := testdb.New(t)
		ts.schemas = append(ts.schemas, db)
		targets = append(targets, relay.Target{Name: "t" + strconv.Itoa(i), Pool: db.Pool, Schema: db.Schema})
	}
	const keys, rounds = 5, 30
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Notify: true})
	require.NoError(t, err)
	write := func(round int) {
		for i, db := range ts.schemas {
			msgs := make([]outbox.Message, keys)
			for k := range msgs {
				msgs[k] = outbox.Message{Topic: topics[i], Key: []byte(fmt.Sprintf("t%d-key-%d", i, k)), Value: []byte(strconv.Itoa(round))}
			}
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))
		}
	}
	write(0)
	cfg := ts.relayConfig("shared-send")
	cfg.BatchSize = 20
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets})
	require.NoError(t, err)
	runFleet(t, f)
	for round := 1; round < rounds; round++ {
		write(round)
		time.Sleep(10 * time.Millisecond)
	}

	want := map[string]int{"shared": 3 * keys * rounds, "own": keys * rounds}
	for topic, n := range want {
		got := kafkatest.ReadAll(t, addrs, topic, n, 60*time.Second)
		require.Equal(t, n, len(got), "topic %s: every event, once", topic)
		next := map[string]int{}
		for _, m := range got {
			key, round := string(m.Key), string(m.Value)
			require.Equal(t, strconv.Itoa(next[key]), round, "topic %s key %s: out of order", topic, key)
			next[key]++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, twice, "a request carried two batches of one partition")
	require.Len(t, producers, len(topics), "each target sends as a producer of its own")
	require.Positive(t, mixed, "no request carried several targets' batches (%d requests)", requests)
	t.Logf("%d produce requests, %d of them with several targets' batches", requests, mixed)
}

// batchesIn counts the record batches in a partition's records and returns
// the producer id of the last.
func batchesIn(t *testing.T, records []byte) (n int, pid int64) {
	for len(records) > 0 {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(records); err != nil {
			t.Errorf("a produce request's records do not parse: %v", err)
			return n, pid
		}
		n++
		pid = b.ProducerID
		size := 12 + int(b.Length)
		if size > len(records) {
			break
		}
		records = records[size:]
	}
	return n, pid
}
