package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A service on database/sql writes its event in the business transaction,
// a *sql.Tx on pgx's stdlib driver; it exists only if the transaction
// commits. (The example runs against DATABASE_URL in a schema of its own.)
func ExampleWriteSQL() {
	ctx := context.Background()
	schema, drop := testdb.Example(ctx)
	defer drop()
	db, err := sql.Open("pgx", schema.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	for _, commit := range []bool{true, false} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		// ... the business writes of order 42, through tx ...
		err = outbox.WriteSQL(ctx, tx, outbox.Message{Topic: "orders.v1", Key: []byte("order-42"), Value: []byte(`{"status":"paid"}`)})
		fmt.Println("write:", err)
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			log.Fatal(err)
		}
	}

	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows:", n)
	// Output:
	// write: <nil>
	// write: <nil>
	// rows: 1
}
