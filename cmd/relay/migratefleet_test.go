package main

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// migrateSchemaTo creates schema in the database of dbURL and applies
// pgbox's migrations up to version, through goose as an older release
// would have.
func migrateSchemaTo(t *testing.T, dbURL, schema string, version int64) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	u, err := testdb.WithSearchPath(dbURL, schema)
	require.NoError(t, err)
	db, err := sql.Open("pgx", u)
	require.NoError(t, err)
	defer db.Close()
	p, err := migrations.NewProvider(db, migrations.Config{LockID: targetLockID(schema)})
	require.NoError(t, err)
	_, err = p.UpTo(ctx, version)
	require.NoError(t, err)
}

// schemaTables counts the pgbox tables of a schema of the database.
func schemaTables(t *testing.T, dbURL, schema string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	var n int
	require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename IN ('pgbox_outbox', 'pgbox_inbox', 'pgbox_relay_lanes')`, schema).Scan(&n))
	return n
}

// targetRow returns the columns after NAME, SCHEMA and DATABASE of the
// target's line of a migrate table.
func targetRow(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+\S+\s+\S+\s+(.*?)\s*$`).FindStringSubmatch(out)
	require.NotNil(t, m, "no line for %s:\n%s", name, out)
	return m[1]
}

// `migrate up` over a target list: every target migrated (schema created
// when missing, an older one brought up) but one on a database that fails,
// which is reported, makes the run exit 1, and does not stop the others; a
// second run finds them at the head; status compares each with the binary.
func TestMigrateTargets(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.CreateDatabase(t, "t_targets_")
	vs := migrationVersions(t)
	head, older := vs[len(vs)-1], vs[len(vs)-2]
	migrateSchemaTo(t, dbURL, "s_b", older)
	broken, err := url.Parse(dbURL)
	require.NoError(t, err)
	broken.User = url.UserPassword(broken.User.Username(), "hunter2")
	broken.Path = "/t_targets_no_such_database"
	file := writeFile(t, "targets.txt", fmt.Sprintf("acme s_a\nglobex s_b\nbroken s_x %s\ninitech s_c %s\n", broken, dbURL))
	env := []string{"DATABASE_URL=" + dbURL, "PGBOX_TARGETS=" + file, "PGBOX_MIGRATE_CONCURRENCY=2"}

	r := runRelay(t, time.Minute, env, "migrate", "status")
	require.Equal(t, 1, r.Code, "a target could not be read: %s", r.Stderr)
	require.Regexp(t, "^-\\s+behind: no schema \\(`relay migrate up` with the target list creates it\\)$", targetRow(t, r.Stdout, "acme"))
	require.Regexp(t, fmt.Sprintf(`^%d\s+behind: 1 of this relay's migrations pending \(it ships %d\)$`, older, head), targetRow(t, r.Stdout, "globex"))
	require.Regexp(t, `^-\s+failed: database postgres://pgbox:xxxxx@\S+/t_targets_no_such_database\S* unreachable: .*does not exist`, targetRow(t, r.Stdout, "broken"))
	require.Contains(t, r.Stderr, "migrate status: 1 of 4 targets could not be read")
	require.Zero(t, schemaTables(t, dbURL, "s_a"), "status creates nothing")

	r = runRelay(t, time.Minute, env, "migrate", "up")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Equal(t, fmt.Sprintf("migrated to %d (schema created)", head), targetRow(t, r.Stdout, "acme"))
	require.Equal(t, fmt.Sprintf("migrated to %d (from %d)", head, older), targetRow(t, r.Stdout, "globex"))
	require.Equal(t, fmt.Sprintf("migrated to %d (schema created)", head), targetRow(t, r.Stdout, "initech"))
	require.Regexp(t, `^failed: database postgres://pgbox:xxxxx@`, targetRow(t, r.Stdout, "broken"))
	require.Regexp(t, `(?m)^NAME\s+SCHEMA\s+DATABASE\s+RESULT$`, r.Stdout)
	require.Contains(t, r.Stderr, "migrate up: 1 of 4 targets failed (see the table); the others are migrated: run `relay migrate up` again to resume")
	require.NotContains(t, r.Stdout+r.Stderr, "hunter2")
	for _, s := range []string{"s_a", "s_b", "s_c"} {
		require.Equal(t, 3, schemaTables(t, dbURL, s), s)
	}

	r = runRelay(t, time.Minute, env, "migrate", "up")
	require.Equal(t, 1, r.Code, r.Stderr)
	for _, name := range []string{"acme", "globex", "initech"} {
		require.Equal(t, fmt.Sprintf("already at %d", head), targetRow(t, r.Stdout, name))
	}

	// Without the broken target: status exits 0; a newer release's
	// migration applied to one target is "ahead".
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, `INSERT INTO s_c.pgbox_migrations (version_id, is_applied) VALUES ($1, true)`, head+10)
	require.NoError(t, err)
	rewrite(t, file, "acme s_a\nglobex s_b\ninitech s_c\n")
	r = runRelay(t, time.Minute, env, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^NAME\s+SCHEMA\s+DATABASE\s+VERSION\s+STATE$`, r.Stdout)
	require.Regexp(t, fmt.Sprintf(`^%d\s+current$`, head), targetRow(t, r.Stdout, "acme"))
	require.Regexp(t, fmt.Sprintf(`^%d\s+current$`, head), targetRow(t, r.Stdout, "globex"))
	require.Regexp(t, fmt.Sprintf(`^%d\s+ahead: this relay ships %d and works on it$`, head+10, head), targetRow(t, r.Stdout, "initech"))
	require.Equal(t, 3, strings.Count(r.Stdout, "\n")-1, "one line per target:\n%s", r.Stdout)
}

// An empty target list migrates nothing and says so.
func TestMigrateTargetsEmptyList(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "targets.txt", "# no tenant yet\n")
	r := runRelay(t, time.Minute, []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db", "PGBOX_TARGETS=" + file}, "migrate", "up")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "no targets: PGBOX_TARGETS (--targets) lists none\n", r.Stdout)
}

// checkTarget refuses a target behind the binary's migrations, or without
// pgbox's tables, or without its schema, naming it, through a pool of the
// target's own or one shared by every schema of the database; for the
// unnamed target of --schema its error is refuseOlderSchema's, as before.
func TestCheckTarget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	shared, err := pgxpool.New(ctx, testdb.ServerURL(t)) // no search_path of its own
	require.NoError(t, err)
	defer shared.Close()

	current, behind, empty := testdb.New(t), testdb.New(t), testdb.Empty(t)
	names := migrationFiles(t)
	rollBackTo(t, behind, names[len(names)-2])

	for _, pool := range []*pgxpool.Pool{shared, current.Pool} {
		require.NoError(t, checkTarget(ctx, pool, targetSpec{Name: "acme", Schema: current.Schema}, 0))
		require.NoError(t, checkTarget(ctx, pool, targetSpec{Name: "acme", Schema: current.Schema}, checkLockTimeout))
	}
	for _, pool := range []*pgxpool.Pool{shared, behind.Pool} {
		err := checkTarget(ctx, pool, targetSpec{Name: "globex", Schema: behind.Schema}, 0)
		require.ErrorIs(t, err, migrations.ErrSchemaBehind)
		require.ErrorContains(t, err, fmt.Sprintf(`target "globex" (schema %s): migrations: the pgbox schema is older than this code`, behind.Schema))
		require.ErrorContains(t, err, "run `relay migrate up`")
		require.ErrorContains(t, err, newestMigration(t)+" not applied")
	}
	for _, pool := range []*pgxpool.Pool{shared, empty.Pool} {
		for _, wait := range []time.Duration{0, checkLockTimeout} {
			err := checkTarget(ctx, pool, targetSpec{Name: "initech", Schema: empty.Schema}, wait)
			require.ErrorIs(t, err, inspect.ErrSchemaMissing)
			require.ErrorContains(t, err, fmt.Sprintf(`target "initech" (schema %s): check pgbox tables:`, empty.Schema))
		}
	}
	err = checkTarget(ctx, shared, targetSpec{Name: "hooli", Schema: "t_no_such_schema"}, 0)
	require.ErrorContains(t, err, `target "hooli" (schema t_no_such_schema): schema "t_no_such_schema" does not exist in database`)

	// The single target of --database-url/--schema: the error run gave.
	want := refuseOlderSchema(ctx, behind.Pool)
	require.Error(t, want)
	require.EqualError(t, checkTarget(ctx, behind.Pool, targetSpec{Schema: behind.Schema}, 0), want.Error())
	require.Equal(t, int32(0), shared.Stat().AcquiredConns())
}

// migrationFiles are the names of the migration files, oldest first.
func migrationFiles(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	sort.Strings(names)
	return names
}
