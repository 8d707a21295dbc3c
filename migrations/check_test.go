package migrations_test

import (
	"context"
	"io/fs"
	"path"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// Check refuses a schema that lacks any migration this build ships, naming
// the fix and what is missing, and accepts the full schema and a newer one
// (the next release's migration applied before this release's binaries
// were replaced).
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Empty(t)
	sqlDB := db.SQL(t)
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	newest := slices.Max(names)

	err = migrations.Check(ctx, sqlDB)
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
	require.ErrorIs(t, err, pgerr.ErrNeedsOperator)
	require.ErrorContains(t, err, "never migrated")
	require.ErrorContains(t, err, "run `relay migrate up`")
	require.Empty(t, pgboxTables(t, db), "Check writes nothing")

	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, migrations.Check(ctx, sqlDB))

	// One release behind: the newest migration rolled back.
	_, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{})
	require.NoError(t, err)
	err = migrations.Check(ctx, sqlDB)
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
	require.ErrorContains(t, err, path.Base(newest)+" not applied")
	require.ErrorContains(t, err, "run `relay migrate up`")

	// A schema ahead of this build: a later release's migration, which this
	// build does not know, is applied too.
	require.NoError(t, migrations.Up(ctx, sqlDB))
	_, err = sqlDB.ExecContext(ctx, `INSERT INTO pgbox_migrations (version_id, is_applied) VALUES (99999, true)`)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, sqlDB))
}

// CheckSchema checks the schema it names, whatever the connection's
// search_path: a behind schema is refused and a current one passes when
// checked from a connection whose search_path is the other.
func TestCheckSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	current, behind := testdb.New(t), testdb.Empty(t)
	fromBehind, fromCurrent := behind.SQL(t), current.SQL(t)

	require.NoError(t, migrations.CheckSchema(ctx, fromBehind, current.Schema))
	err := migrations.CheckSchema(ctx, fromCurrent, behind.Schema)
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
	require.ErrorContains(t, err, "never migrated")
	require.NoError(t, migrations.CheckSchema(ctx, fromCurrent, ""), "empty: the search_path's")
	require.ErrorIs(t, migrations.CheckSchema(ctx, fromBehind, ""), migrations.ErrSchemaBehind)
}

// Check takes no lock: it answers while a migrator holds the migrations'
// session lock (a `relay migrate up` running beneath the relays).
func TestCheckDoesNotWaitForMigrator(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrations.LockIDDefault)
	require.NoError(t, err)
	defer conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, migrations.LockIDDefault) //nolint:errcheck

	// A hang would end with the deadline's error.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, migrations.Check(cctx, db.SQL(t)))
}
