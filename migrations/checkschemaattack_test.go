package migrations_test

// Hostile review of migrations.CheckSchema (c024f14): schema names that
// need quoting, case, a decoy search_path, and concurrent first calls
// (the shipped-migration cache).

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// openPath opens dbURL with search_path the quoted schema.
func openPath(t *testing.T, dbURL, schema string) *sql.DB {
	t.Helper()
	return openSearchPath(t, dbURL, pgx.Identifier{schema}.Sanitize())
}

// openSearchPath opens dbURL with its search_path set to path, as written
// (`"$user",public`, a quoted schema).
func openSearchPath(t *testing.T, dbURL, path string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = path
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// migrateQuoted creates schema (quoted) and applies the migrations up to
// version (0: all).
func migrateQuoted(t *testing.T, dbURL, schema string, version int64) {
	t.Helper()
	ctx := context.Background()
	db := openPath(t, dbURL, schema)
	_, err := db.ExecContext(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	p, err := migrations.NewProvider(db, migrations.Config{LockID: int64(len(schema)) + 4242})
	require.NoError(t, err)
	if version == 0 {
		_, err = p.Up(ctx)
	} else {
		_, err = p.UpTo(ctx, version)
	}
	require.NoError(t, err)
}

func shippedVersions(t *testing.T) []int64 {
	t.Helper()
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	var vs []int64
	for _, n := range names {
		v, err := strconv.ParseInt(n[:strings.IndexByte(n, '_')], 10, 64)
		require.NoError(t, err)
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

func TestCheckSchemaAttackQuotingAndCase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testdb.CreateDatabase(t, "t_cs_")
	vs := shippedVersions(t)
	weird := `We "ird".s p`
	migrateQuoted(t, dbURL, weird, 0)
	migrateQuoted(t, dbURL, "MiXed", 0)
	migrateQuoted(t, dbURL, "Be.hind", vs[len(vs)-2])
	migrateQuoted(t, dbURL, "decoy", 0)
	from := openPath(t, dbURL, "decoy") // a complete schema first on the search_path

	require.NoError(t, migrations.CheckSchema(ctx, from, weird))
	require.NoError(t, migrations.CheckSchema(ctx, from, "MiXed"))
	err := migrations.CheckSchema(ctx, from, "mixed") // no folding: another (missing) schema
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
	require.ErrorContains(t, err, "never migrated")
	err = migrations.CheckSchema(ctx, from, "Be.hind")
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
	require.ErrorContains(t, err, fmt.Sprintf("it is at version %d", vs[len(vs)-2]))
	err = migrations.CheckSchema(ctx, from, "Be") // a prefix of the dotted name
	require.ErrorIs(t, err, migrations.ErrSchemaBehind)
	// The behind schema's own connection, named or not, is refused too.
	require.ErrorIs(t, migrations.CheckSchema(ctx, openPath(t, dbURL, "Be.hind"), ""), migrations.ErrSchemaBehind)
	require.NoError(t, migrations.CheckSchema(ctx, openPath(t, dbURL, "Be.hind"), weird))
}

// Many goroutines check at once on one pool, the first calls racing to
// fill the shipped-migration cache. Run with -race.
func TestCheckSchemaAttackConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testdb.CreateDatabase(t, "t_csc_")
	vs := shippedVersions(t)
	migrateQuoted(t, dbURL, "good", 0)
	migrateQuoted(t, dbURL, "old", vs[0])
	db := openPath(t, dbURL, "good")
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Go(func() {
			schema := "good"
			if i%2 == 1 {
				schema = "old"
			}
			err := migrations.CheckSchema(ctx, db, schema)
			switch {
			case schema == "good" && err != nil:
				errs <- fmt.Errorf("good: %w", err)
			case schema == "old" && err == nil:
				errs <- fmt.Errorf("old passed")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
