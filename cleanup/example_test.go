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
	"github.com/pgbox/pgbox/internal/testdb"
)

// One pass over an inbox with a key past its topic's window and one within.
// Kafka keeps "payments" records for a day, in segments of an hour; with a
// day of buffer, keys are kept 49 hours.
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
	admin, err := sarama.NewClusterAdmin(kafka.ListenAddrs(), kcfg)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	day, hour := "86400000", "3600000"
	err = admin.CreateTopic("payments", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"retention.ms": &day, "segment.ms": &hour}}, false)
	if err != nil {
		log.Fatal(err)
	}

	// What inbox.Process leaves behind: one key received 3 days ago, one 2 days ago.
	_, err = pool.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at) VALUES
		('payments-svc', 'payments-0-1', 'payments', 0, 1, now() - interval '3 days'),
		('payments-svc', 'payments-0-2', 'payments', 0, 2, now() - interval '2 days')`)
	if err != nil {
		log.Fatal(err)
	}

	c, err := cleanup.New(cleanup.Config{Pool: pool, Admin: admin, Buffer: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	report, err := c.RunOnce(ctx) // or c.Run(ctx): a pass every Interval
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range report.Topics {
		fmt.Printf("%s: retention.ms=%d segment.ms=%d, keys kept %v, deleted %d, oldest left %v old\n",
			t.Topic, t.RetentionMs, t.SegmentMs, t.Window, t.Deleted, t.OldestAge.Round(time.Hour))
	}
	// Output:
	// payments: retention.ms=86400000 segment.ms=3600000, keys kept 49h0m0s, deleted 1, oldest left 48h0m0s old
}

// exampleSchema creates a schema in DATABASE_URL, migrates it and returns a
// pool bound to it, and a func that drops it.
func exampleSchema(ctx context.Context) (*pgxpool.Pool, func()) {
	db, drop := testdb.Example(ctx)
	return db.Pool, drop
}
