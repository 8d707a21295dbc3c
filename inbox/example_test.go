package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for migrations.Up

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// exampleDB creates a schema of its own on DATABASE_URL, migrated, and returns
// a pool bound to it and a func that drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	db, drop := testdb.Example(ctx)
	return db.Pool, drop
}

func Example() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id text PRIMARY KEY, amount bigint)`); err != nil {
		log.Fatal(err)
	}

	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, 100)`, string(m.Key))
		if err != nil {
			return err
		}
		return inbox.SetResult(ctx, []byte("charged "+string(m.Key)))
	}

	msg := inbox.Message{
		Topic: "orders", Partition: 0, Offset: 7,
		Key: []byte("order-1"), Value: []byte(`{"amount":100}`),
		Headers: []outbox.Header{{Key: "event-id", Value: []byte("evt-1")}},
	}
	// The same event delivered twice, e.g. after a crash before the offset commit.
	for range 2 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := ib.Process(ctx, tx, msg, charge)
			if err != nil {
				return err
			}
			fmt.Printf("key=%s duplicate=%v stored=%q\n", res.Key, res.Duplicate, res.Stored)
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
		msg.Offset++ // a redelivery may come at another offset; the event id is the same
	}

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// key=evt-1 duplicate=false stored="charged order-1"
	// key=evt-1 duplicate=true stored="charged order-1"
	// payments: 1
}
