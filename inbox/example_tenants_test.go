package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// Schema per tenant: the inbox and the outbox write in the caller's
// transaction and name their tables unqualified, so one pool serves every
// tenant's schema when each transaction sets its search_path (set_config
// with is_local, i.e. SET LOCAL: it ends with the transaction, so a pooled
// connection never carries one tenant's path into the next transaction).
// Each schema holds its own pgbox tables, migrated to the same version
// (migrations.Up once per schema): a key is deduplicated per tenant, and each
// tenant's events wait in its own pgbox_outbox for a relay serving that
// schema (`relay run --schema`). One connection serves both tenants here,
// statements prepared once: PostgreSQL plans them again for each path.
func Example_schemaPerTenant() {
	ctx := context.Background()
	acme, dropAcme := testdb.Example(ctx) // two migrated schemas: two tenants
	defer dropAcme()
	globex, dropGlobex := testdb.Example(ctx)
	defer dropGlobex()
	cfg := acme.Pool.Config()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tenants := map[string]string{"acme": acme.Schema, "globex": globex.Schema}

	ib, err := inbox.New(inbox.Config{Consumer: "billing", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}
	bill := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "invoices", Key: m.Key, Value: []byte("invoice for " + string(m.Key))})
	}
	// inTenant runs fn in a transaction on tenant's schema.
	inTenant := func(tenant string, fn func(pgx.Tx) error) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.Identifier{tenants[tenant]}.Sanitize()); err != nil {
				return err
			}
			return fn(tx)
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	m := inbox.Message{Topic: "orders", Partition: 0, Offset: 1, Key: []byte("order-1"),
		Headers: []outbox.Header{{Key: "event-id", Value: []byte("evt-1")}}}
	// The same event id in two tenants, then again in the first.
	for _, tenant := range []string{"acme", "globex", "acme"} {
		inTenant(tenant, func(tx pgx.Tx) error {
			res, err := ib.Process(ctx, tx, m, bill)
			fmt.Printf("%s: duplicate=%v\n", tenant, res.Duplicate)
			return err
		})
	}
	for _, tenant := range []string{"acme", "globex"} {
		inTenant(tenant, func(tx pgx.Tx) error {
			var keys, events int
			err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgbox_inbox), (SELECT count(*) FROM pgbox_outbox)`).Scan(&keys, &events)
			fmt.Printf("%s: %d inbox key, %d outbox event\n", tenant, keys, events)
			return err
		})
	}
	// Output:
	// acme: duplicate=false
	// globex: duplicate=false
	// acme: duplicate=true
	// acme: 1 inbox key, 1 outbox event
	// globex: 1 inbox key, 1 outbox event
}
