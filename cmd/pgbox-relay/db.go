package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// poolConfig parses the database settings; --schema becomes the connections'
// search_path.
func poolConfig(databaseURL, schema string, maxConns int) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		// pgx's parse errors can echo the DSN: name the setting, not the value.
		return nil, usageError("invalid value %q for DATABASE_URL (--database-url): %v", redactDSN(databaseURL), redactErr(err, databaseURL))
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" { // the DSN's own name wins
		cfg.ConnConfig.RuntimeParams["application_name"] = "pgbox-relay"
	}
	return cfg, nil
}

// redactErr returns err's text with the DSN's password masked wherever the
// whole DSN appears.
func redactErr(err error, dsn string) string {
	msg := err.Error()
	if dsn == "" {
		return msg
	}
	return strings.ReplaceAll(msg, dsn, redactDSN(dsn))
}

// openPool connects to the database and checks it answers.
func (a *app) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(a.opts.DatabaseURL, a.opts.Schema, a.opts.DBMaxConns)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database %s: %s", redactDSN(a.opts.DatabaseURL), redactErr(err, a.opts.DatabaseURL))
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s unreachable: %s", redactDSN(a.opts.DatabaseURL), redactErr(err, a.opts.DatabaseURL))
	}
	return pool, nil
}

// sqlDB wraps a pool as a *sql.DB for goose.
func sqlDB(pool *pgxpool.Pool) *sql.DB { return stdlib.OpenDBFromPool(pool) }
