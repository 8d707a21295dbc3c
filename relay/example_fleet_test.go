package relay_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// One relay process for many tenants, each in a schema of its own: the
// targets share one pool (its MaxConns is their connection budget) and one
// Kafka client. Each writer writes in its tenant's schema (search_path
// set per transaction, as inbox's Example_schemaPerTenant does); every
// tenant's events reach Kafka, each from its own tables.
func ExampleFleet() {
	ctx := context.Background()
	acme, dropAcme := testdb.Example(ctx)
	defer dropAcme()
	globex, dropGlobex := testdb.Example(ctx)
	defer dropGlobex()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.v1"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	// One pool for the database; no search_path needed.
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	for _, tenant := range []*testdb.DB{acme, globex} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.Identifier{tenant.Schema}.Sanitize()); err != nil {
				return err
			}
			return outbox.Write(ctx, tx, outbox.Message{Topic: "orders.v1", Key: []byte("order-1"), Value: []byte("placed")})
		})
		if err != nil {
			panic(err)
		}
	}

	kcfg := relay.NewKafkaConfig()
	kcfg.Version = kafkatest.Version
	f, err := relay.NewFleet(relay.FleetConfig{
		Relay: relay.Config{Brokers: cluster.ListenAddrs(), Kafka: kcfg},
		Targets: []relay.Target{
			{Name: "acme", Pool: pool, Schema: acme.Schema},
			{Name: "globex", Pool: pool, Schema: globex.Schema},
		},
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()

	fmt.Println("records:", len(consumeExample(cluster.ListenAddrs(), "orders.v1", 2)))
	stop()
	fmt.Println("run:", <-done)
	for _, t := range f.Targets() {
		fmt.Println(t.Name, t.Stats.Published)
	}
	// Output:
	// records: 2
	// run: <nil>
	// acme 1
	// globex 1
}
