package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A service on database/sql (sqlc generated for database/sql, or an ORM on
// pgx's stdlib driver) dedups a consumed message and publishes its reply in
// its own transaction: the payment, the inbox key and the outbox row commit
// together or not at all. (The example runs against DATABASE_URL in a schema
// of its own.)
func ExampleInbox_ProcessSQL() {
	ctx := context.Background()
	schema, drop := testdb.Example(ctx)
	defer drop()
	db, err := sql.Open("pgx", schema.URL) // pgx's stdlib driver: what ProcessSQL needs
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (order_id text PRIMARY KEY, amount bigint)`); err != nil {
		log.Fatal(err)
	}

	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}
	// The handler gets the caller's *sql.Tx: hand it to sqlc's New(tx), or
	// to the ORM's transaction it came from.
	charge := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments VALUES ($1, 100)`, string(m.Key)); err != nil {
			return err
		}
		err := outbox.WriteSQL(ctx, tx, outbox.Message{Topic: "payments.v1", Key: m.Key, Value: []byte(`{"status":"charged"}`)})
		if err != nil {
			return err
		}
		return inbox.SetResult(ctx, []byte("charged "+string(m.Key)))
	}
	consume := func(m inbox.Message) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // after Commit: sql.ErrTxDone
		res, err := ib.ProcessSQL(ctx, tx, m, charge)
		if err != nil {
			return err
		}
		fmt.Printf("key=%s duplicate=%v stored=%q\n", res.Key, res.Duplicate, res.Stored)
		return tx.Commit() // then mark the offset
	}

	msg := inbox.Message{
		Topic: "orders", Partition: 0, Offset: 7,
		Key: []byte("order-1"), Value: []byte(`{"amount":100}`),
		Headers: []outbox.Header{{Key: "event-id", Value: []byte("evt-1")}},
	}
	for range 2 { // delivered twice: a crash came before the offset commit
		if err := consume(msg); err != nil {
			log.Fatal(err)
		}
		msg.Offset++
	}

	var payments, events int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM payments), (SELECT count(*) FROM pgbox_outbox)`).
		Scan(&payments, &events); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", payments, "events:", events)
	// Output:
	// key=evt-1 duplicate=false stored="charged order-1"
	// key=evt-1 duplicate=true stored="charged order-1"
	// payments: 1 events: 1
}
