package cleanup_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/internal/testdb"
)

// One pass over an inbox holding the keys of three "payments" records. Kafka
// has dropped the first two (retention, compaction or DeleteRecords alike:
// the partition's log start offset is now 2), so their keys go; the third
// can still be redelivered, so its key stays, however old it is.
func Example() {
	ctx := context.Background()
	pool, done := exampleSchema(ctx) // a migrated schema of DATABASE_URL
	defer done()

	kafka, err := kfake.NewCluster(kfake.NumBrokers(1)) // any Kafka cluster
	if err != nil {
		log.Fatal(err)
	}
	defer kafka.Close()
	kcfg := sarama.NewConfig()
	kcfg.Version = sarama.V3_6_0_0
	kcfg.Producer.Return.Successes = true
	client, err := sarama.NewClient(kafka.ListenAddrs(), kcfg)
	if err != nil {
		log.Fatal(err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close() // closes client too
	day, hour := "86400000", "3600000"
	err = admin.CreateTopic("payments", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"retention.ms": &day, "segment.ms": &hour}}, false)
	if err != nil {
		log.Fatal(err)
	}
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: "payments", Value: sarama.StringEncoder("paid")}); err != nil {
			log.Fatal(err)
		}
	}
	_ = producer.Close()
	if err := admin.DeleteRecords("payments", map[int32]int64{0: 2}); err != nil {
		log.Fatal(err)
	}

	// What inbox.Process leaves behind: the three records' keys, two days old.
	_, err = pool.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
		SELECT 'payments-svc', 'payments-0-' || o, 'payments', 0, o, now() - interval '2 days', now() - interval '2 days'
		FROM generate_series(0, 2) o`)
	if err != nil {
		log.Fatal(err)
	}

	c, err := cleanup.New(cleanup.Config{Pool: pool, Admin: cleanupsarama.New(admin), Buffer: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	report, err := c.RunOnce(ctx) // or c.Run(ctx): a pass every Interval
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range report.Topics {
		fmt.Printf("%s: log start offsets %v; exact rule deleted %d, time rule deleted %d; oldest left %v old\n",
			t.Topic, t.LogStarts, t.ExactDeleted, t.TimeDeleted, t.OldestAge.Round(time.Hour))
	}
	// Output:
	// payments: log start offsets map[0:2]; exact rule deleted 2, time rule deleted 0; oldest left 48h0m0s old
}

// exampleSchema creates a schema in DATABASE_URL, migrates it and returns a
// pool bound to it, and a func that drops it.
func exampleSchema(ctx context.Context) (*pgxpool.Pool, func()) {
	db, drop := testdb.Example(ctx)
	return db.Pool, drop
}
