package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/pgbox/pgbox"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// ErrSchemaBehind is what errors.Is finds in [Check]'s error when a
// migration this build of pgbox ships is not applied to the database.
var ErrSchemaBehind = errors.New("the pgbox schema is older than this code")

// Check returns nil when every migration this build ships is applied to the
// database (in the first schema of the connection's search_path). Otherwise
// its error wraps [ErrSchemaBehind] and the ErrNeedsOperator that inbox,
// relay and cleanup export, names the schema's version and the migrations
// missing, and says what to do: run `relay migrate up` (or [Up]).
//
// Migrations applied beyond the ones this build ships pass: the binaries
// of the previous release keep working on the schema the next release
// migrated to, so the deploy order is migrate first, then roll the
// binaries (docs/upgrading.md). `relay run` and `relay cleanup` call Check
// before they start; a service that embeds pgbox calls it at start-up.
//
// It reads goose's version table and nothing else, writes nothing and takes
// no lock: it works through a pooler in transaction mode, and does not wait
// for a `relay migrate up` that is running.
func Check(ctx context.Context, db *sql.DB) error { return CheckSchema(ctx, db, "") }

// CheckSchema is [Check] for the named schema, whatever the connection's
// search_path (an empty schema is Check's: the search_path's first): a
// relay serving many schemas of one database checks them all on one
// connection.
func CheckSchema(ctx context.Context, db *sql.DB, schema string) error {
	sources, err := shippedSources(db)
	if err != nil {
		return err
	}
	applied, err := appliedVersions(ctx, db, schema)
	if err != nil {
		return err
	}
	var at, newest int64
	var missing []string
	for _, s := range sources {
		newest = max(newest, s.Version)
		if applied[s.Version] {
			at = max(at, s.Version)
			continue
		}
		missing = append(missing, path.Base(s.Path))
	}
	if len(missing) == 0 {
		return nil
	}
	state := fmt.Sprintf("it is at version %d", at)
	if at == 0 {
		state = "it was never migrated"
	}
	return fmt.Errorf("migrations: %w: %s, pgbox %s needs version %d (%s not applied): run `relay migrate up` (or migrations.Up) against this database, then start again: %w",
		ErrSchemaBehind, state, pgbox.Version, newest, strings.Join(missing, ", "), pgerr.ErrNeedsOperator)
}

// shipped holds the migrations this build ships, listed once: a Fleet
// checks every target at start.
var shipped struct {
	sync.Mutex
	sources []*goose.Source
}

// shippedSources lists the migrations this build ships.
func shippedSources(db *sql.DB) ([]*goose.Source, error) {
	shipped.Lock()
	defer shipped.Unlock()
	if shipped.sources == nil {
		p, err := NewProvider(db, Config{})
		if err != nil {
			return nil, err
		}
		shipped.sources = p.ListSources()
	}
	return shipped.sources, nil
}

// appliedVersions reads the versions goose recorded as applied in schema
// (empty: the search_path's first), without goose's lock; none when the
// version table does not exist.
func appliedVersions(ctx context.Context, db *sql.DB, schema string) (map[int64]bool, error) {
	if schema == "" {
		var err error
		if schema, err = currentSchema(ctx, db); err != nil {
			return nil, err
		}
	}
	out := map[int64]bool{}
	if ok, err := tableExists(ctx, db, schema, TableName); err != nil || !ok {
		return out, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf(appliedVersionsSQL, pgx.Identifier{schema, TableName}.Sanitize()))
	if err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", TableName, err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", TableName, err)
		}
		out[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", TableName, err)
	}
	return out, nil
}
