// Package migrations holds pgbox's database schema as goose SQL files embedded in
// the package, and runs them through a goose Provider: no goose globals, pgbox's
// own version table, and a session lock so that two processes migrating at once
// is safe (the second waits, then finds nothing to do).
//
// The same files work from the goose CLI:
//
//	goose -dir migrations -table pgbox_migrations postgres "$DATABASE_URL" up
//
// Tables are created unqualified, in the first schema of the connection's
// search_path; the library's queries find them the same way.
//
// [Down] rolls back one version per call, as goose's Down does, and guards
// the step: it refuses while a relay instance is registered with an unexpired
// lease, and when the step would drop a table holding rows (unpublished
// outbox rows, inbox keys, dead letters), until [DownConfig] confirms it.
// [Status] writes nothing.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// TableName is the goose version table pgbox records its migrations in.
const TableName = "pgbox_migrations"

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files (for callers that run goose themselves).
func FS() fs.FS { return files }

// LockIDDefault is [Config].LockID's default: a key derived from
// [TableName] (the FNV-1a hash of "pgbox:pgbox_migrations", shifted to a
// positive int64), so every pgbox process migrating one database waits for
// the others.
const LockIDDefault int64 = 3142831831076409947

// Config tunes how migrations run. The zero value is what most callers want.
type Config struct {
	// LockID is the advisory lock key that serializes concurrent migrators.
	// Defaults to [LockIDDefault].
	LockID int64
}

// NewProvider returns a goose Provider over pgbox's migrations for db (a
// *sql.DB from github.com/jackc/pgx/v5/stdlib).
func NewProvider(db *sql.DB, cfg Config) (*goose.Provider, error) {
	if db == nil {
		return nil, errors.New("migrations: nil *sql.DB (open one with sql.Open(\"pgx\", url) after importing github.com/jackc/pgx/v5/stdlib)")
	}
	if cfg.LockID == 0 {
		cfg.LockID = LockIDDefault
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(cfg.LockID))
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithTableName(TableName),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration. It fails with [ErrNoSchema] when no
// schema of the connection's search_path exists.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := NewProvider(db, Config{})
	if err != nil {
		return err
	}
	if _, err := currentSchema(ctx, db); err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Status reports each migration and whether it is applied. It writes
// nothing: on a database pgbox never migrated every migration is pending and
// goose's version table is not created. It fails with [ErrNoSchema] when no
// schema of the connection's search_path exists.
func Status(ctx context.Context, db *sql.DB) ([]*goose.MigrationStatus, error) {
	p, err := NewProvider(db, Config{})
	if err != nil {
		return nil, err
	}
	schema, err := currentSchema(ctx, db)
	if err != nil {
		return nil, err
	}
	migrated, err := tableExists(ctx, db, schema, TableName)
	if err != nil {
		return nil, err
	}
	if !migrated {
		// goose's Status would create its version table first.
		var st []*goose.MigrationStatus
		for _, s := range p.ListSources() {
			st = append(st, &goose.MigrationStatus{Source: s, State: goose.StatePending})
		}
		return st, nil
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	return st, nil
}
