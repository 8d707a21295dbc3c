package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"math/rand/v2"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for migrations.Up

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/migrations"
)

// exampleDB creates a schema of its own on DATABASE_URL, migrated, and returns
// a pool bound to it and a func that drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	server := os.Getenv("DATABASE_URL")
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		log.Fatal("set DATABASE_URL (make test does): ", err)
	}
	schema := fmt.Sprintf("example_inbox_%d", rand.Uint32())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	// pgx passes unknown URL parameters, like search_path, to the server.
	u, err := url.Parse(server)
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	sqlDB, err := sql.Open("pgx", u.String())
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	}
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
		Headers: []inbox.Header{{Key: "event-id", Value: []byte("evt-1")}},
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
