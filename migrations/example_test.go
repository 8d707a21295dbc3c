package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/pressly/goose/v3"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// exampleDB opens a fresh, empty schema of DATABASE_URL (the service's own
// database, in real use) and returns a func that drops it.
func exampleDB(ctx context.Context) (*sql.DB, func()) {
	db, drop, err := testdb.Create(ctx, os.Getenv("DATABASE_URL"), "example_", false)
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := sql.Open("pgx", db.URL)
	if err != nil {
		log.Fatal(err)
	}
	return sqlDB, func() { _ = sqlDB.Close(); _ = drop() }
}

func pending(st []*goose.MigrationStatus) int {
	n := 0
	for _, s := range st {
		if s.State == goose.StatePending {
			n++
		}
	}
	return n
}

// A service applies pgbox's schema at start-up with [Up]; [Status] lists
// what is applied and writes nothing, even on a database pgbox never touched.
func Example() {
	ctx := context.Background()
	db, drop := exampleDB(ctx)
	defer drop()

	st, err := migrations.Status(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending before Up:", pending(st) == len(st))

	if err := migrations.Up(ctx, db); err != nil {
		log.Fatal(err)
	}
	if st, err = migrations.Status(ctx, db); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending after Up:", pending(st))
	fmt.Println("first:", st[0].Source.Path, st[0].State)

	// Up again finds nothing to do (and waits for a concurrent migrator).
	if err := migrations.Up(ctx, db); err != nil {
		log.Fatal(err)
	}
	// Output:
	// pending before Up: true
	// pending after Up: 0
	// first: 00001_inbox.sql applied
}

// [Down] rolls back one version per call and refuses, changing nothing, a
// step that would drop rows until [DownConfig].Yes confirms it (and any
// step while a relay runs, until [DownConfig].Force does).
func ExampleDown() {
	ctx := context.Background()
	db, drop := exampleDB(ctx)
	defer drop()
	if err := migrations.Up(ctx, db); err != nil {
		log.Fatal(err)
	}
	// One unpublished outbox row: a service wrote it, no relay sent it yet.
	if _, err := db.ExecContext(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) VALUES (gen_random_uuid(), 1, 'payments.v1', 'v')`); err != nil {
		log.Fatal(err)
	}

	// Roll back until a step would lose data.
	for {
		plan, err := migrations.Down(ctx, db, migrations.DownConfig{})
		if errors.Is(err, migrations.ErrDataLoss) {
			fmt.Printf("refused: %s would drop %s\n", plan.Source, plan.LossText())
			break
		}
		if err != nil {
			log.Fatal(err)
		}
	}

	plan, err := migrations.Down(ctx, db, migrations.DownConfig{Yes: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rolled back", plan.Source, "confirmed")

	plan, err = migrations.PlanDown(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next:", plan.Source, "loses nothing:", len(plan.Losses) == 0)
	// Output:
	// refused: 00080_relay_parking_kafka.sql would drop stored data of 1 outbox row (columns of pgbox_outbox)
	// rolled back 00080_relay_parking_kafka.sql confirmed
	// next: 00070_inbox_position.sql loses nothing: true
}
