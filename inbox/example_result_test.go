package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// A handler keeps what it created with [SetResult], in the same transaction
// as its writes; a duplicate gets it back in Result.Stored, so the consumer
// can answer a resent request ("which payment did my order create?") the
// way the first delivery did, without a second effect.
func ExampleSetResult() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id bigint GENERATED ALWAYS AS IDENTITY, order_id text)`); err != nil {
		log.Fatal(err)
	}

	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("request-id")})
	if err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO payments (order_id) VALUES ($1) RETURNING id`, string(m.Key)).Scan(&id); err != nil {
			return err
		}
		return inbox.SetResult(ctx, fmt.Appendf(nil, "payment %d", id))
	}

	request := inbox.Message{Topic: "charge-requests", Partition: 2, Offset: 40, Key: []byte("order-7"),
		Value: []byte(`{"amount":250}`), Headers: []outbox.Header{{Key: "request-id", Value: []byte("req-7")}}}
	for _, offset := range []int64{40, 41} { // the client resent its request: a new offset, the same request id
		request.Offset = offset
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := ib.Process(ctx, tx, request, charge)
			if err != nil {
				return err
			}
			fmt.Printf("offset %d: duplicate=%v answer=%q\n", offset, res.Duplicate, res.Stored)
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// offset 40: duplicate=false answer="payment 1"
	// offset 41: duplicate=true answer="payment 1"
}
