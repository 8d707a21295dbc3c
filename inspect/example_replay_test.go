package inspect_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// An operator replays a dead letter with [ReplayDead] once its cause is
// fixed: the record goes back to its topic through the outbox, with
// [inbox.ReplayHeader] set, and the consumer's inbox processes the replay
// under a key of its own, once, while the original record's key still
// dedupes a rewind over the original.
func ExampleReplayDead() {
	ctx := context.Background()
	db, drop := testdb.Example(ctx)
	defer drop()
	pool := db.Pool
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id text)`); err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}
	pay := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1)`, string(m.Key))
		return err
	}
	process := func(m inbox.Message, h inbox.HandlerFunc) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := ib.Process(ctx, tx, m, h)
			if err == nil {
				fmt.Printf("offset %d: key=%s duplicate=%v\n", m.Offset, res.Key, res.Duplicate)
			}
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	original := inbox.Message{Topic: "orders", Partition: 0, Offset: 12, Key: []byte("order-12"), Value: []byte(`{"amount":90}`),
		Headers: []outbox.Header{{Key: "event-id", Value: []byte("evt-12")}}}

	// What the consumer adapter did when order-12's handler kept failing
	// (the account was blocked): it recorded the key with no effect, so a
	// redelivery is a duplicate, and the record as a dead letter.
	process(original, func(context.Context, pgx.Tx, inbox.Message) error { return nil })
	headers, err := json.Marshal(original.Headers) // outbox.Header's storage format
	if err != nil {
		log.Fatal(err)
	}
	var id int64
	err = pool.QueryRow(ctx, `INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic,
		record_stored, record_key, record_value, record_headers)
		VALUES ('payments-svc', 'orders', 0, 12, 'evt-12', 5, 'account blocked', 'orders.dlq', true, 'order-12', '{"amount":90}', $1)
		RETURNING id`, headers).Scan(&id)
	if err != nil {
		log.Fatal(err)
	}

	// The account is unblocked: replay the dead letter.
	replays, err := inspect.ReplayDead(ctx, pool, []int64{id}, inspect.ReplayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("replayed to %s, replay id %s\n", replays[0].Topic, replays[0].ReplayOf)

	// A relay publishes the outbox row to orders; the consumer receives it
	// at a new offset.
	replay := inbox.Message{Partition: 0, Offset: 31}
	err = pool.QueryRow(ctx, `SELECT topic, key, value, headers FROM pgbox_outbox`).Scan(&replay.Topic, &replay.Key, &replay.Value, &replay.Headers)
	if err != nil {
		log.Fatal(err)
	}
	process(replay, pay)
	process(replay, pay)   // its own redelivery
	process(original, pay) // a rewind over the original

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// offset 12: key=evt-12 duplicate=false
	// replayed to orders, replay id 1
	// offset 31: key=evt-12/replay/1 duplicate=false
	// offset 31: key=evt-12/replay/1 duplicate=true
	// offset 12: key=evt-12 duplicate=true
	// payments: 1
}
