// Package testdb gives every test its own freshly migrated PostgreSQL schema, so
// tests run with t.Parallel() against one real server and nothing leaks between
// them. The server comes from DATABASE_URL, which `make test` provides (starting
// a private cluster when the variable is unset).
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for goose

	"github.com/pgbox/pgbox/migrations"
)

// DB is one test's private schema.
type DB struct {
	// Pool's connections have search_path set to Schema.
	Pool *pgxpool.Pool
	// Schema is the schema's name.
	Schema string
	// URL connects to the same database with search_path set to Schema; hand it
	// to subprocesses or to sql.Open("pgx", URL).
	URL string
}

// ServerURL returns DATABASE_URL, failing the test with instructions when unset.
func ServerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("DATABASE_URL")
	if u == "" {
		t.Fatal("DATABASE_URL is not set: run the tests with `make test`, which starts a private PostgreSQL, " +
			"or set DATABASE_URL to a database where this user may create schemas")
	}
	return u
}

// New creates a schema, applies every pgbox migration to it and returns a pool
// bound to it. The schema is dropped when the test ends.
func New(t testing.TB) *DB {
	t.Helper()
	db := Empty(t)
	sqlDB := db.SQL(t)
	p, err := migrations.NewProvider(sqlDB, migrations.Options{LockID: lockID(db.Schema)})
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("testdb: migrate schema %s: %v", db.Schema, err)
	}
	return db
}

// Empty creates a schema without running migrations (for migration tests).
func Empty(t testing.TB) *DB {
	t.Helper()
	server := ServerURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	schema := "t_" + randHex(6)
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("testdb: connect to DATABASE_URL: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("testdb: create schema: %v", err)
	}

	u, err := WithSearchPath(server, schema)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("testdb: parse url: %v", err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: pool: %v", err)
	}
	db := &DB{Pool: pool, Schema: schema, URL: u}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Logf("testdb: drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		// Subprocesses a test killed may still hold connections for a moment.
		_, _ = c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND query ILIKE '%'||$1||'%'`, schema)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("testdb: drop schema %s: %v", schema, err)
		}
	})
	return db
}

// SQL opens a database/sql handle on the test's schema, closed at cleanup.
func (db *DB) SQL(t testing.TB) *sql.DB {
	t.Helper()
	s, err := sql.Open("pgx", db.URL)
	if err != nil {
		t.Fatalf("testdb: sql.Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// WithSearchPath returns rawURL with search_path set to schema; pgx passes
// unknown URL parameters to the server as run-time parameters.
func WithSearchPath(rawURL, schema string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func lockID(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(schema))
	return int64(h.Sum64() >> 1)
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
