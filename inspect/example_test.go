package inspect_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A service reads the snapshot `relay status` prints with [Read]: here,
// the backlog three committed outbox rows leave before a relay runs.
func ExampleRead() {
	ctx := context.Background()
	db, drop := testdb.Example(ctx) // a migrated schema of DATABASE_URL
	defer drop()
	pool := db.Pool

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx,
			outbox.Message{Topic: "payments.v1", Key: []byte("order-1"), Value: []byte("charged")},
			outbox.Message{Topic: "payments.v1", Key: []byte("order-2"), Value: []byte("charged")},
			outbox.Message{Topic: "refunds.v1", Key: []byte("order-1"), Value: []byte("refunded")})
	})
	if err != nil {
		log.Fatal(err)
	}

	// The zero Config reads with the defaults (16 lanes, relay.LanesDefault;
	// [ExactLimitDefault], [StatementTimeoutDefault]); it writes nothing.
	snap, err := inspect.Read(ctx, pool, inspect.Config{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("unpublished:", snap.Outbox.Unpublished, "estimated:", snap.Outbox.Estimated)
	perTopic := map[string]int64{}
	for _, b := range snap.Topics {
		perTopic[b.Topic] += b.Unpublished
	}
	fmt.Println("payments.v1:", perTopic["payments.v1"], "refunds.v1:", perTopic["refunds.v1"])
	fmt.Println("parked:", snap.Outbox.Parked, "relays:", len(snap.Instances))
	// Output:
	// unpublished: 3 estimated: false
	// payments.v1: 2 refunds.v1: 1
	// parked: 0 relays: 0
}

// An operator (or the service) lists parked rows with [ListParked] and,
// once the cause is fixed, writes them back to the relays with
// [RetryParked]; [DiscardParked] would delete them instead.
func ExampleRetryParked() {
	ctx := context.Background()
	db, drop := testdb.Example(ctx)
	defer drop()
	pool := db.Pool

	// A row the relay gave up on: its topic did not exist.
	_, err := pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		VALUES (gen_random_uuid(), 1, 'payouts.v1', 'order-9', 'v', 5, 'unknown topic payouts.v1', now())`)
	if err != nil {
		log.Fatal(err)
	}

	f := inspect.ParkedFilter{Topic: "payouts.v1"}
	rows, err := inspect.ListParked(ctx, pool, f)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rows {
		fmt.Printf("parked: %s key=%s attempts=%d error=%q\n", r.Topic, r.Key, r.Attempts, r.LastError)
	}

	// The topic now exists: unpark the rows; running relays publish them.
	n, err := inspect.RetryParked(ctx, pool, f)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retried:", n)
	left, err := inspect.CountParked(ctx, pool, f)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("still parked:", left)
	// Output:
	// parked: payouts.v1 key=order-9 attempts=5 error="unknown topic payouts.v1"
	// retried: 1
	// still parked: 0
}
