package main

import (
	"context"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

func init() {
	flagChecks["force"] = flagCheck{check: checkMigrateForce, bad: "maybe"}
}

// rollBackTo rolls back, through the library and confirmed, until source is
// the newest applied migration.
func rollBackTo(t *testing.T, db *testdb.DB, source string) {
	t.Helper()
	sqlDB := db.SQL(t)
	for {
		plan, err := migrations.PlanDown(context.Background(), sqlDB)
		require.NoError(t, err)
		require.NotZero(t, plan.Version, "%s is not applied", source)
		if plan.Source == source {
			return
		}
		_, err = migrations.Down(context.Background(), sqlDB, migrations.DownConfig{Yes: true, Force: true})
		require.NoError(t, err)
	}
}

func registerRelay(t *testing.T, db *testdb.DB, instance string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO pgbox_relay_instances (instance, expires_at) VALUES ($1, now() + interval '1 hour')`, instance)
	require.NoError(t, err)
}

// `migrate down` refuses a step while a relay runs and a step that drops
// rows, says what would be lost, and changes nothing; --force and --yes
// confirm each.
func TestMigrateDownRefuses(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	writeRows(t, db, "payments", 0, 3)
	rollBackTo(t, db, "00003_relay.sql")
	registerRelay(t, db, "relay-7")
	env := []string{"DATABASE_URL=" + db.URL}

	r := runRelay(t, time.Minute, env, "migrate", "down", "--yes")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "relay-7")
	require.Contains(t, r.Stderr, "--force")
	require.True(t, tableExists(t, db, "pgbox_relay_instances"), "nothing rolled back")

	r = runRelay(t, time.Minute, env, "migrate", "down", "--force")
	require.Equal(t, 2, r.Code, "the step drops the relay's registrations: %s", r.Stderr)
	require.Contains(t, r.Stderr, "1 relay instance (pgbox_relay_instances)")
	require.Contains(t, r.Stderr, "--yes")
	require.True(t, tableExists(t, db, "pgbox_relay_instances"))

	r = runRelay(t, time.Minute, env, "migrate", "down", "--force", "--yes")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "rolled back 00003_relay.sql")
	require.False(t, tableExists(t, db, "pgbox_relay_instances"))

	// The outbox holds 3 unpublished rows: one line says so and exits 2.
	r = runRelay(t, time.Minute, env, "migrate", "down")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "rolling back 00002_outbox.sql would drop 3 outbox rows (pgbox_outbox): add --yes to confirm")
	require.Equal(t, 3, outboxCount(t, db))

	r = runRelay(t, time.Minute, env, "migrate", "down", "--yes")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "dropped 3 outbox rows")
	require.False(t, tableExists(t, db, "pgbox_outbox"))
	require.True(t, tableExists(t, db, "pgbox_inbox"), "one step per run")
}

// A --schema that does not exist is named as missing, and nothing is created.
func TestMigrateMissingSchema(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_SCHEMA=pgbox_no_such_schema"}
	for _, action := range []string{"status", "up", "down"} {
		r := runRelay(t, time.Minute, env, "migrate", action)
		require.Equal(t, 1, r.Code, r.Stderr)
		require.Contains(t, r.Stderr, `schema "pgbox_no_such_schema" (PGBOX_SCHEMA, --schema) does not exist`, action)
	}
}

func checkMigrateForce(t *testing.T, set setFn) {
	db := testdb.New(t)
	registerRelay(t, db, "relay-live")
	env := []string{"DATABASE_URL=" + db.URL}
	r := runWith(t, set, "false", env, "migrate", "down", "--yes")
	require.Equal(t, 2, r.Code, "a live relay refuses the step: %s", r.Stderr)
	r = runWith(t, set, "true", env, "migrate", "down", "--yes")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "rolled back "+newestMigration(t))
}

// newestMigration is the file name of the newest migration: the step
// `relay migrate down` rolls back first.
func newestMigration(t *testing.T) string {
	t.Helper()
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	sort.Strings(names)
	return names[len(names)-1]
}

// migrationVersions are the versions of the migration files, oldest first.
func migrationVersions(t *testing.T) []int64 {
	t.Helper()
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	var vs []int64
	for _, n := range names {
		v, err := strconv.ParseInt(n[:strings.IndexByte(n, '_')], 10, 64)
		require.NoError(t, err, n)
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// `relay run` and `relay cleanup` refuse a schema one migration behind the
// binary's, saying to run `relay migrate up` and naming the migration
// missing; after `relay migrate up` the same cleanup runs.
func TestRefuseOlderSchema(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	names, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	sort.Strings(names)
	rollBackTo(t, db, names[len(names)-2])
	c := kafkatest.New(t)
	env := []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ","), "PGBOX_HTTP_ADDR="}
	for _, args := range [][]string{{"run"}, {"cleanup", "--dry-run"}} {
		r := runRelay(t, time.Minute, env, args...)
		require.Equal(t, 1, r.Code, "%v: %s", args, r.Stderr)
		require.Contains(t, r.Stderr, "run `relay migrate up`", args)
		require.Contains(t, r.Stderr, names[len(names)-1]+" not applied", args)
	}
	r := runRelay(t, time.Minute, env, "migrate", "up")
	require.Equal(t, 0, r.Code, r.Stderr)
	r = runRelay(t, time.Minute, env, "cleanup", "--dry-run")
	require.Equal(t, 0, r.Code, r.Stderr)
}
