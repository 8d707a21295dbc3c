package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/migrations"
)

// openPool connects to --database-url (--schema as search_path) and checks
// that the database answers.
func (a *app) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	o := a.opts
	cfg, err := dbconf.Config(o.DatabaseURL, o.Schema, o.DBMaxConns, "pgbox-relay")
	if err != nil {
		return nil, usageError("invalid value %q for DATABASE_URL (--database-url): %v", dbconf.RedactDSN(o.DatabaseURL), err)
	}
	pool, err := dbconf.Open(ctx, cfg, o.DatabaseURL)
	if err != nil || o.Schema == "" {
		return pool, err
	}
	// PostgreSQL skips a search_path schema that does not exist: name it
	// here, before a command reports pgbox's tables missing.
	var exists bool
	if err := pool.QueryRow(ctx, schemaExistsSQL, o.Schema).Scan(&exists); err != nil {
		pool.Close()
		return nil, fmt.Errorf("look up schema %q: %w", o.Schema, err)
	}
	if !exists {
		pool.Close()
		return nil, fmt.Errorf("schema %q (PGBOX_SCHEMA, --schema) does not exist in database %s: create it (CREATE SCHEMA %s) or correct the setting",
			o.Schema, dbconf.RedactDSN(o.DatabaseURL), pgx.Identifier{o.Schema}.Sanitize())
	}
	return pool, nil
}

// poolConfig is dbconf.Config with the binary's application_name, for the
// pools of a target list's databases.
func poolConfig(dsn, schema string, maxConns int) (*pgxpool.Config, error) {
	return dbconf.Config(dsn, schema, maxConns, "pgbox-relay")
}

const schemaExistsSQL = `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`

// sqlDB wraps a pool as a *sql.DB for goose.
func sqlDB(pool *pgxpool.Pool) *sql.DB { return stdlib.OpenDBFromPool(pool) }

// refuseOlderSchema refuses, before a command that works on pgbox's tables
// starts, a schema that lacks a migration this binary ships: the error says
// to run `relay migrate up` (migrations.Check). A newer schema passes.
func refuseOlderSchema(ctx context.Context, pool *pgxpool.Pool) error {
	db := sqlDB(pool)
	defer db.Close()
	return migrations.Check(ctx, db)
}
