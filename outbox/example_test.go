package outbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// Write an event in the business transaction; it exists only if the
// transaction commits. (The example runs against DATABASE_URL in a schema of
// its own.)
func ExampleWrite() {
	ctx := context.Background()
	pool, cleanup := exampleDB(ctx)
	defer cleanup()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business writes of order 42 ...
		return outbox.Write(ctx, tx, outbox.Message{
			Topic:   "orders.v1",
			Key:     []byte("order-42"),
			Value:   []byte(`{"status":"paid"}`),
			Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}},
		})
	})
	fmt.Println("write:", err)

	err = outbox.Write(ctx, pool, outbox.Message{Topic: "orders v1", Key: []byte("order-43")})
	fmt.Println("bad topic:", err)

	var topic, key string
	var n int
	_ = pool.QueryRow(ctx, `SELECT topic, convert_from(key, 'UTF8'), count(*) OVER () FROM pgbox_outbox`).Scan(&topic, &key, &n)
	fmt.Println(n, "row:", topic, key)
	// Output:
	// write: <nil>
	// bad topic: outbox: invalid message: message 0 (topic "orders v1", key "order-43"): topic has character ' ' at byte 6; Kafka allows only [a-zA-Z0-9._-]
	// 1 row: orders.v1 order-42
}

// exampleDB migrates a fresh schema on DATABASE_URL and returns a pool bound to it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	db, drop := testdb.Example(ctx)
	return db.Pool, drop
}
