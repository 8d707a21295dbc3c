package main

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbox/pgbox/internal/dbconf"
)

// openPool connects to --database-url (--schema as search_path) and checks
// that the database answers.
func (a *app) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	o := a.opts
	cfg, err := dbconf.Config(o.DatabaseURL, o.Schema, o.DBMaxConns, "pgbox-relay")
	if err != nil {
		return nil, usageError("invalid value %q for DATABASE_URL (--database-url): %v", dbconf.RedactDSN(o.DatabaseURL), err)
	}
	return dbconf.Open(ctx, cfg, o.DatabaseURL)
}

// sqlDB wraps a pool as a *sql.DB for goose.
func sqlDB(pool *pgxpool.Pool) *sql.DB { return stdlib.OpenDBFromPool(pool) }
