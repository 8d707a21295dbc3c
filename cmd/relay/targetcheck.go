package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// checkTarget refuses, before a command works on a target, a schema whose
// pgbox tables are missing (inspect.ErrSchemaMissing's advice) or older than
// this binary's migrations (migrations.Check: "run `relay migrate up`"): the
// errors `relay run` gives for --schema, prefixed with the target's name
// when it has one.
//
// pool may serve other schemas too (one pool per database): when its
// connections' search_path is not t.Schema, the check runs on a connection
// of its own with t.Schema as search_path, opened with the pool's settings
// and closed before checkTarget returns (`relay run` passes a one-connection
// pool with t.Schema as search_path: no other is opened). An empty t.Schema
// is the pool's own search_path.
func checkTarget(ctx context.Context, pool *pgxpool.Pool, t targetSpec) error {
	err := checkPgboxTables(ctx, pool, t.Schema)
	if err == nil || t.Name == "" {
		return err
	}
	return fmt.Errorf("target %q (schema %s): %w", t.Name, t.Schema, err)
}

func checkPgboxTables(ctx context.Context, pool *pgxpool.Pool, schema string) error {
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
	if schema != "" && pool.Config().ConnConfig.RuntimeParams["search_path"] != schema {
		cfg := pool.Config()
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 2, 0, 0
		own, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("check schema %q: %w", schema, err)
		}
		defer own.Close()
		pool = own
	}
	if _, err := pool.Exec(ctx, checkSchemaSQL); err != nil {
		return schemaHint(fmt.Errorf("check pgbox tables: %w", err))
	}
	return refuseOlderSchema(ctx, pool)
}
