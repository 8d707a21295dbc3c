package inboxfranz_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A payments service on franz-go: it consumes orders, records a payment and
// emits a payments event in one transaction per batch. The same order sent
// twice (same event id) is paid once; a crash or rebalance redelivery would
// be skipped the same way.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, brokers, done := consumerExampleEnv(ctx) // a fresh schema and an embedded broker
	defer done()

	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}
	c, err := inboxfranz.NewConsumer(pool, ib, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount) VALUES ($1, $2)`, string(m.Key), string(m.Value)); err != nil {
			return err // retried with backoff, then dead-lettered to orders.v1.dlq
		}
		return outbox.Write(ctx, tx, outbox.Message{Topic: "payments.v1", Key: m.Key, Value: []byte("paid " + string(m.Value))})
	}, inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 100}},
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup("payments-svc"),
		kgo.ConsumeTopics("orders.v1"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx) }()

	produceOrders(ctx, brokers, [][3]string{
		{"evt-1", "order-1", "100"},
		{"evt-2", "order-2", "250"},
		{"evt-1", "order-1", "100"}, // the producer retried: same event id
	})
	for st := c.Stats(); st.Processed+st.Duplicates < 3; st = c.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}

	st := c.Stats()
	fmt.Printf("processed %d, duplicates %d\n", st.Processed, st.Duplicates)
	rows, _ := pool.Query(ctx, `SELECT order_id, amount FROM payments ORDER BY order_id`)
	for rows.Next() {
		var order, amount string
		_ = rows.Scan(&order, &amount)
		fmt.Println("paid", order, amount)
	}
	var events int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox WHERE topic = 'payments.v1'`).Scan(&events)
	fmt.Println("payments.v1 events in the outbox:", events)
	// Output:
	// processed 2, duplicates 1
	// paid order-1 100
	// paid order-2 250
	// payments.v1 events in the outbox: 2
}

func produceOrders(ctx context.Context, brokers []string, orders [][3]string) {
	p, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders.v1"))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	for _, o := range orders {
		r := &kgo.Record{Key: []byte(o[1]), Value: []byte(o[2]), Headers: []kgo.RecordHeader{{Key: "event-id", Value: []byte(o[0])}}}
		if err := p.ProduceSync(ctx, r).FirstErr(); err != nil {
			log.Fatal(err)
		}
	}
}

// consumerExampleEnv gives the example a migrated schema of its own on
// DATABASE_URL (with a payments table) and an embedded Kafka broker with an
// orders.v1 topic. done drops the schema and stops the broker.
func consumerExampleEnv(ctx context.Context) (pool *pgxpool.Pool, brokers []string, done func()) {
	db, drop := testdb.Example(ctx)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE payments (order_id text NOT NULL, amount text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.v1"))
	if err != nil {
		log.Fatal(err)
	}
	return db.Pool, cluster.ListenAddrs(), func() {
		cluster.Close()
		drop()
	}
}
