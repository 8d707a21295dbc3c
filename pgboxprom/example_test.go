package pgboxprom_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/pgboxprom"
)

// A service registers pgbox's metrics in its own registry, next to its own
// metrics, and reads the same status snapshot that `relay status
// --json` prints, without running the binary.
func Example() {
	ctx := context.Background()
	db, drop := testdb.Example(ctx) // a migrated schema of DATABASE_URL
	defer drop()
	pool := db.Pool

	// What the service's own transactions left: two unpublished outbox rows
	// and one processed key.
	_, err := pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) VALUES
		(gen_random_uuid(), 1, 'payments.v1', 'a'), (gen_random_uuid(), 2, 'payments.v1', 'b');
		INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset") VALUES ('payments-svc', 'orders-0-7', 'orders', 0, 7)`)
	if err != nil {
		log.Fatal(err)
	}

	// Metrics: the service's registry, not a global one. Pass the relay,
	// cleaner, inbox or consumer adapter the service runs, if any.
	reg := prometheus.NewRegistry()
	c, err := pgboxprom.New(pgboxprom.Config{DB: pool})
	if err != nil {
		log.Fatal(err)
	}
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "pgbox_scrape_database_up", "pgbox_outbox_unpublished_rows_estimated", "pgbox_inbox_keys":
			for _, m := range mf.GetMetric() {
				fmt.Print(mf.GetName())
				for _, l := range m.GetLabel() {
					fmt.Printf(" %s=%s", l.GetName(), l.GetValue())
				}
				fmt.Println(":", m.GetGauge().GetValue())
			}
		}
	}

	// Status: the snapshot `relay status --json` prints.
	snap, err := inspect.Read(ctx, pool, inspect.Config{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("unpublished:", snap.Outbox.Unpublished, "estimated:", snap.Outbox.Estimated)
	js, err := json.Marshal(snap.Inbox[0].Keys)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("inbox %s/%s keys: %s\n", snap.Inbox[0].Consumer, snap.Inbox[0].Topic, js)
	// Output:
	// pgbox_inbox_keys consumer=payments-svc topic=orders: 1
	// pgbox_outbox_unpublished_rows_estimated: 0
	// pgbox_scrape_database_up: 1
	// unpublished: 2 estimated: false
	// inbox payments-svc/orders keys: 1
}
