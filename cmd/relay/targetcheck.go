package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/migrations"
)

// checkTarget refuses, before a command works on a target, a schema whose
// pgbox tables are missing (inspect.ErrSchemaMissing's advice) or older than
// this binary's migrations (migrations.Check: "run `relay migrate up`"): the
// errors `relay run` gives for --schema, prefixed with the target's name
// when it has one.
//
// pool may serve other schemas too (one pool per database): the check
// names t.Schema in each statement, whatever its connections' search_path,
// so a Fleet checks every schema of a database on one connection. An empty
// t.Schema is the pool's own search_path. A positive lockTimeout bounds how
// long the check waits for a lock on the tables (a Fleet's, which checks
// the others meanwhile; lock_not_available then); 0 waits.
func checkTarget(ctx context.Context, pool *pgxpool.Pool, t targetSpec, lockTimeout time.Duration) error {
	err := checkPgboxTables(ctx, pool, t.Schema, lockTimeout)
	if err == nil || t.Name == "" {
		return err
	}
	return fmt.Errorf("target %q (schema %s): %w", t.Name, t.Schema, err)
}

func checkPgboxTables(ctx context.Context, pool *pgxpool.Pool, schema string, lockTimeout time.Duration) error {
	if schema != "" {
		// PostgreSQL skips a search_path schema that does not exist: name it
		// here, before the tables are reported missing.
		var exists bool
		if err := pool.QueryRow(ctx, schemaExistsSQL, schema).Scan(&exists); err != nil {
			return fmt.Errorf("look up schema %q: %w", schema, err)
		}
		if !exists {
			return fmt.Errorf("schema %q does not exist in database %q: create it (CREATE SCHEMA %s) and run `relay migrate up`, or correct the target",
				schema, pool.Config().ConnConfig.Database, pgx.Identifier{schema}.Sanitize())
		}
	}
	q := checkTablesSQL(schema)
	if lockTimeout > 0 {
		// One simple-protocol query (Exec without arguments): the LOCAL
		// setting holds for its implicit transaction only, through a
		// pooler too.
		q = fmt.Sprintf("SELECT set_config('lock_timeout', '%dms', true); %s", lockTimeout.Milliseconds(), q)
	}
	if _, err := pool.Exec(ctx, q); err != nil {
		return schemaHint(fmt.Errorf("check pgbox tables: %w", err))
	}
	db := sqlDB(pool)
	defer db.Close()
	return migrations.CheckSchema(ctx, db, schema)
}

// checkTablesSQL reads none of pgbox's tables in schema (empty: the
// search_path's), and fails when one is missing or not granted.
func checkTablesSQL(schema string) string {
	q := func(table string) string {
		if schema == "" {
			return table
		}
		return pgx.Identifier{schema, table}.Sanitize()
	}
	return "SELECT 1 FROM " + q("pgbox_outbox") + ", " + q("pgbox_relay_lanes") + ", " + q("pgbox_inbox") + " LIMIT 0"
}
