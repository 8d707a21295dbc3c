package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// [Inbox.ProcessBatch] dedups a whole poll of messages in one round trip and
// runs the handler, in order, for each message whose key is new: a key
// processed by an earlier transaction, and a second copy within the batch,
// are duplicates. The batch is all or nothing.
func ExampleInbox_ProcessBatch() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (event_id text, amount bigint)`); err != nil {
		log.Fatal(err)
	}

	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}
	pay := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		id, _ := m.Header("event-id")
		_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, 100)`, string(id))
		return err
	}
	msg := func(offset int64, eventID string) inbox.Message {
		return inbox.Message{Topic: "orders", Partition: 0, Offset: offset, Value: []byte(eventID),
			Headers: []outbox.Header{{Key: "event-id", Value: []byte(eventID)}}}
	}
	batch := func(ms ...inbox.Message) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			results, err := ib.ProcessBatch(ctx, tx, ms, pay)
			for i, r := range results {
				fmt.Printf("offset %d %s: duplicate=%v\n", ms[i].Offset, r.Key, r.Duplicate)
			}
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	batch(msg(1, "evt-a"), msg(2, "evt-b"))
	// The next poll: evt-b again (its producer resent it), two new events,
	// and a copy of evt-d within the same batch.
	batch(msg(3, "evt-b"), msg(4, "evt-c"), msg(5, "evt-d"), msg(6, "evt-d"))

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// offset 1 evt-a: duplicate=false
	// offset 2 evt-b: duplicate=false
	// offset 3 evt-b: duplicate=true
	// offset 4 evt-c: duplicate=false
	// offset 5 evt-d: duplicate=false
	// offset 6 evt-d: duplicate=true
	// payments: 4
}
