package relay_test

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// Run a relay beside the writers: the events they commit reach Kafka, in
// commit order per key, each with its event id. (The example runs against
// DATABASE_URL in a schema of its own, and an embedded Kafka broker.)
func Example() {
	ctx := context.Background()
	db, drop := testdb.Example(ctx)
	defer drop()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.v1"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	// The writers: each event in its business transaction.
	for _, status := range []string{"placed", "paid", "shipped"} {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			// ... the business writes of order 42 ...
			return outbox.Write(ctx, tx, outbox.Message{Topic: "orders.v1", Key: []byte("order-42"), Value: []byte(status)})
		})
		if err != nil {
			panic(err)
		}
	}

	// The relay, usually the binary `relay run`.
	kcfg := relay.NewKafkaConfig()
	kcfg.Version = kafkatest.Version // your cluster's version
	r, err := relay.New(relay.Config{Pool: db.Pool, Brokers: cluster.ListenAddrs(), Kafka: kcfg})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	// A consumer of the topic sees them in order, with their event ids.
	for _, m := range consumeExample(cluster.ListenAddrs(), "orders.v1", 3) {
		var id string
		for _, h := range m.Headers {
			if string(h.Key) == relay.EventIDHeader {
				id = string(h.Value)
			}
		}
		fmt.Printf("%s %s (event id: %d characters)\n", m.Key, m.Value, len(id))
	}
	stop()
	fmt.Println("run:", <-done)
	// Output:
	// order-42 placed (event id: 36 characters)
	// order-42 paid (event id: 36 characters)
	// order-42 shipped (event id: 36 characters)
	// run: <nil>
}

// consumeExample reads n records from partition 0 of topic, from the start.
func consumeExample(addrs []string, topic string, n int) []*sarama.ConsumerMessage {
	c, err := sarama.NewConsumer(addrs, kafkatest.Config())
	if err != nil {
		panic(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		panic(err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	for len(out) < n {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case <-time.After(time.Minute):
			panic("no records within a minute")
		}
	}
	return out
}
