package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/pressly/goose/v3"

	"github.com/pgbox/pgbox"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// ErrSchemaBehind is what errors.Is finds in [Check]'s error when a
// migration this build of pgbox ships is not applied to the database.
var ErrSchemaBehind = errors.New("the pgbox schema is older than this code")

// Check returns nil when every migration this build ships is applied to the
// database (in the first schema of the connection's search_path), and writes
// nothing. Otherwise its error wraps [ErrSchemaBehind] and the
// ErrNeedsOperator that inbox, relay and cleanup export, names the schema's
// version and the migrations missing, and says what to do: run `relay
// migrate up` (or [Up]).
//
// Migrations applied beyond the ones this build ships pass: the binaries
// of the previous release keep working on the schema the next release
// migrated to, so the deploy order is migrate first, then roll the
// binaries (docs/upgrading.md). `relay run` and `relay cleanup` call Check
// before they start; a service that embeds pgbox calls it at start-up.
func Check(ctx context.Context, db *sql.DB) error {
	st, err := Status(ctx, db)
	if err != nil {
		return err
	}
	var at, newest int64
	var missing []string
	for _, s := range st {
		newest = max(newest, s.Source.Version)
		if s.State == goose.StateApplied {
			at = max(at, s.Source.Version)
			continue
		}
		missing = append(missing, path.Base(s.Source.Path))
	}
	if len(missing) == 0 {
		return nil
	}
	schema := fmt.Sprintf("it is at version %d", at)
	if at == 0 {
		schema = "it was never migrated"
	}
	return fmt.Errorf("migrations: %w: %s, pgbox %s needs version %d (%s not applied): run `relay migrate up` (or migrations.Up) against this database, then start again: %w",
		ErrSchemaBehind, schema, pgbox.Version, newest, strings.Join(missing, ", "), pgerr.ErrNeedsOperator)
}
