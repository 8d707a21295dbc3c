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
	"log"
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
	return newT(t, true)
}

// Empty creates a schema without running migrations (for migration tests).
func Empty(t testing.TB) *DB {
	t.Helper()
	return newT(t, false)
}

func newT(t testing.TB, migrate bool) *DB {
	t.Helper()
	server := ServerURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, drop, err := Create(ctx, server, "t_", migrate)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Logf("testdb: %v", err)
		}
	})
	return db
}

// NewDatabase is New in a database of its own (CreateDatabase). For tests
// that hold a snapshot open: VACUUM's horizon is per database, so a hold
// there does not keep other tests' dead rows (in the shared database's
// schemas) from being removed.
func NewDatabase(t testing.TB) *DB {
	t.Helper()
	_, u := CreateDatabase(t, "t_db_")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, drop, err := Create(ctx, u, "t_", true)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() { _ = drop() }) // runs before the database is dropped
	return db
}

// CreateDatabase creates an empty database named prefix plus a random
// suffix on DATABASE_URL's server and returns its name and URL. It is
// dropped (WITH FORCE: a pooler may keep idle connections to it) when the
// test ends.
func CreateDatabase(t testing.TB, prefix string) (name, dbURL string) {
	t.Helper()
	server := ServerURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name = prefix + randHex(6)
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("testdb: connect to DATABASE_URL: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Logf("testdb: drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("testdb: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		t.Fatalf("testdb: parse DATABASE_URL: %v", err)
	}
	u.Path = "/" + name
	return name, u.String()
}

// Example is New for runnable examples, which have no testing.T: it exits the
// program on failure and returns the func that drops the schema.
func Example(ctx context.Context) (*DB, func()) {
	server := os.Getenv("DATABASE_URL")
	if server == "" {
		log.Fatal("DATABASE_URL is not set: run the examples with `make test`")
	}
	db, drop, err := Create(ctx, server, "example_", true)
	if err != nil {
		log.Fatalf("testdb: %v", err)
	}
	return db, func() { _ = drop() }
}

// Create makes a schema named prefix plus a random suffix on server,
// migrated when migrate is set, and returns it with a func that closes its
// pool and drops it.
func Create(ctx context.Context, server, prefix string, migrate bool) (_ *DB, drop func() error, err error) {
	schema := prefix + randHex(6)
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, nil, fmt.Errorf("create schema: %w", err)
	}
	dropSchema := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			return fmt.Errorf("drop schema %s: %w", schema, err)
		}
		defer c.Close(ctx)
		// Subprocesses a test killed may still hold connections for a moment.
		_, _ = c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND query ILIKE '%'||$1||'%'`, schema)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", schema, err)
		}
		return nil
	}
	fail := func(err error) (*DB, func() error, error) {
		_ = dropSchema()
		return nil, nil, err
	}

	u, err := WithSearchPath(server, schema)
	if err != nil {
		return fail(err)
	}
	if migrate {
		if err := migrateSchema(ctx, u, schema); err != nil {
			return fail(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return fail(fmt.Errorf("parse url: %w", err))
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(fmt.Errorf("pool: %w", err))
	}
	return &DB{Pool: pool, Schema: schema, URL: u}, func() error {
		pool.Close()
		return dropSchema()
	}, nil
}

// migrateSchema applies every pgbox migration to the schema url points at,
// under a lock of that schema's own, so parallel tests don't queue.
func migrateSchema(ctx context.Context, u, schema string) error {
	sqlDB, err := sql.Open("pgx", u)
	if err != nil {
		return fmt.Errorf("sql.Open: %w", err)
	}
	defer sqlDB.Close()
	p, err := migrations.NewProvider(sqlDB, migrations.Config{LockID: lockID(schema)})
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return nil
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

// HoldSnapshot opens a connection to the test's schema as application app,
// begins a REPEATABLE READ transaction and reads pgbox_outbox, as pg_dump
// does, so the session holds back the xmin horizon, idle in transaction,
// until release (or the test's cleanup) rolls it back: rows deleted from
// then on stay for VACUUM, their index entries too. It returns the
// session's pid.
func (db *DB) HoldSnapshot(t testing.TB, app string) (pid int, release func()) {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("testdb: connect as %s: %v", app, err)
	}
	release = func() { _ = conn.Close(context.Background()) }
	t.Cleanup(release)
	for _, sql := range []string{`BEGIN ISOLATION LEVEL REPEATABLE READ`, `SELECT count(*) FROM pgbox_outbox`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("testdb: hold a snapshot: %s: %v", sql, err)
		}
	}
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return pid, release
}
