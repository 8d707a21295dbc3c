package migrations_test

import (
	"context"
	"database/sql"
	"hash/fnv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// pgboxTables lists the tables pgbox owns in a schema, sorted.
func pgboxTables(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT table_name FROM information_schema.tables
		 WHERE table_schema = $1 AND table_name LIKE 'pgbox\_%' AND table_name <> 'pgbox_migrations'
		 ORDER BY table_name`, db.Schema)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Empty(t)
	sqlDB := db.SQL(t)

	require.NoError(t, migrations.Up(ctx, sqlDB))
	tables := pgboxTables(t, db)
	require.Contains(t, tables, "pgbox_inbox")

	st, err := migrations.Status(ctx, sqlDB)
	require.NoError(t, err)
	require.NotEmpty(t, st)
	for _, s := range st {
		require.Equal(t, "applied", string(s.State), "migration %s", s.Source.Path)
	}

	// Down goes one version per call, newest first; empty tables need no
	// confirmation.
	for i := len(st) - 1; i >= 0; i-- {
		plan, err := migrations.Down(ctx, sqlDB, migrations.DownConfig{})
		require.NoError(t, err)
		require.Equal(t, st[i].Source.Path, plan.Source)
		require.Empty(t, plan.Losses)
		require.Equal(t, i, appliedCount(t, sqlDB), "after rolling back %s", plan.Source)
	}
	_, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{})
	require.ErrorIs(t, err, migrations.ErrNothingToRollBack)
	require.Empty(t, pgboxTables(t, db), "down must drop every pgbox table")

	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.Equal(t, tables, pgboxTables(t, db))

	// Up again is a no-op.
	require.NoError(t, migrations.Up(ctx, sqlDB))
}

func appliedCount(t *testing.T, db *sql.DB) int {
	t.Helper()
	st, err := migrations.Status(context.Background(), db)
	require.NoError(t, err)
	n := 0
	for _, s := range st {
		if s.State == goose.StateApplied {
			n++
		}
	}
	return n
}

// downTo rolls back (confirmed) until source is the newest applied migration.
func downTo(t *testing.T, db *sql.DB, source string) {
	t.Helper()
	for {
		plan, err := migrations.PlanDown(context.Background(), db)
		require.NoError(t, err)
		require.NotZero(t, plan.Version, "%s is not applied", source)
		if plan.Source == source {
			return
		}
		_, err = migrations.Down(context.Background(), db, migrations.DownConfig{Yes: true, Force: true})
		require.NoError(t, err)
	}
}

func count(t *testing.T, db *testdb.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// A step that would drop a table holding rows (or columns of one) is refused
// without Yes, names what would be lost, and changes nothing.
func TestDownRefusesDataLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	sqlDB := db.SQL(t)
	exec := func(q string) {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	exec(`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value) SELECT gen_random_uuid(), 1, 'orders', 'k', 'v' FROM generate_series(1, 3)`)
	exec(`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset") SELECT 'svc', 'k' || i, 'orders', 0, i FROM generate_series(1, 2) i`)
	exec(`INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic, dead_at)
		VALUES ('svc', 'orders', 0, 9, 'orders/0/9', 5, 'poison', 'orders.dlq', now())`)

	for _, step := range []struct {
		source, lost, table string
		rows                int
	}{
		{"00040_ops.sql", "stored data of 1 dead letter (columns of pgbox_consumer_dead)", "pgbox_consumer_dead", 1},
		{"00010_consumer.sql", "1 dead letter (pgbox_consumer_dead)", "pgbox_consumer_dead", 1},
		{"00002_outbox.sql", "3 outbox rows (pgbox_outbox)", "pgbox_outbox", 3},
		{"00001_inbox.sql", "2 inbox keys (pgbox_inbox)", "pgbox_inbox", 2},
	} {
		downTo(t, sqlDB, step.source)
		plan, err := migrations.Down(ctx, sqlDB, migrations.DownConfig{})
		require.ErrorIs(t, err, migrations.ErrDataLoss, step.source)
		require.ErrorContains(t, err, step.lost)
		require.Equal(t, step.source, plan.Source)
		require.Equal(t, step.lost, plan.LossText())
		require.Equal(t, step.rows, count(t, db, step.table), "a refused step changes nothing")
		plan, err = migrations.PlanDown(ctx, sqlDB)
		require.NoError(t, err)
		require.Equal(t, step.source, plan.Source, "still applied")

		plan, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{Yes: true})
		require.NoError(t, err, step.source)
		require.Equal(t, step.source, plan.Source)
	}
	require.Empty(t, pgboxTables(t, db))
}

// A relay instance with an unexpired lease blocks every step unless Force;
// an expired registration (a relay that died) does not.
func TestDownRefusesWhileRelayRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	sqlDB := db.SQL(t)
	// The steps below are about 00060 (it drops a column of
	// pgbox_relay_instances): undo the newer ones, which touch other tables.
	p, err := migrations.NewProvider(sqlDB, migrations.Config{})
	require.NoError(t, err)
	_, err = p.DownTo(ctx, 60)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_relay_instances (instance, expires_at)
		VALUES ('relay-a', now() + interval '1 hour'), ('relay-dead', now() - interval '1 minute')`)
	require.NoError(t, err)
	before := appliedCount(t, sqlDB)

	plan, err := migrations.Down(ctx, sqlDB, migrations.DownConfig{Yes: true})
	require.ErrorIs(t, err, migrations.ErrRelayRunning)
	require.ErrorContains(t, err, "relay-a")
	require.Equal(t, []string{"relay-a"}, plan.LiveInstances)
	require.Equal(t, before, appliedCount(t, sqlDB), "nothing rolled back")

	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_relay_instances SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	// Only dead registrations left: the step goes, though it drops a column of
	// a table holding (their) rows, once confirmed.
	_, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{})
	require.ErrorIs(t, err, migrations.ErrDataLoss)
	require.ErrorContains(t, err, "2 relay instances")
	_, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{Yes: true})
	require.NoError(t, err)
	require.Equal(t, before-1, appliedCount(t, sqlDB))

	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_relay_instances SET expires_at = now() + interval '1 hour'`)
	require.NoError(t, err)
	_, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{Force: true})
	require.NoError(t, err, "Force rolls back under a live relay")
	require.Equal(t, before-2, appliedCount(t, sqlDB))
}

// Status and Down on a database pgbox never migrated create nothing, not
// even goose's version table.
func TestStatusOnEmptyDatabaseCreatesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Empty(t)
	sqlDB := db.SQL(t)
	st, err := migrations.Status(ctx, sqlDB)
	require.NoError(t, err)
	files, err := fs.Glob(migrations.FS(), "*.sql")
	require.NoError(t, err)
	require.Len(t, st, len(files))
	for _, s := range st {
		require.Equal(t, goose.StatePending, s.State, s.Source.Path)
	}
	_, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{Yes: true, Force: true})
	require.ErrorIs(t, err, migrations.ErrNothingToRollBack)
	require.ErrorIs(t, err, goose.ErrNoNextVersion)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, db.Schema).Scan(&n))
	require.Zero(t, n, "status and down created something in %s", db.Schema)
}

// A search_path none of whose schemas exists is named, for each call.
func TestMissingSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, err := testdb.WithSearchPath(testdb.ServerURL(t), "pgbox_no_such_schema")
	require.NoError(t, err)
	sqlDB, err := sql.Open("pgx", u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })

	_, err = migrations.Status(ctx, sqlDB)
	require.ErrorIs(t, err, migrations.ErrNoSchema)
	require.ErrorContains(t, err, "pgbox_no_such_schema")
	_, err = migrations.Down(ctx, sqlDB, migrations.DownConfig{})
	require.ErrorIs(t, err, migrations.ErrNoSchema)
	err = migrations.Up(ctx, sqlDB)
	require.ErrorIs(t, err, migrations.ErrNoSchema)
}

// Two processes migrating the same database at once: the session lock makes
// the second wait, and both succeed.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Empty(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A handle of its own, as a separate process would have.
			errs[i] = migrations.Up(ctx, db.SQL(t))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "migrator %d", i)
	}
	require.Contains(t, pgboxTables(t, db), "pgbox_inbox")
}

func TestNilDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.ErrorContains(t, migrations.Up(ctx, nil), "nil *sql.DB")
	_, err := migrations.Status(ctx, nil)
	require.ErrorContains(t, err, "nil *sql.DB")
	_, err = migrations.Down(ctx, nil, migrations.DownConfig{Yes: true})
	require.ErrorContains(t, err, "nil *sql.DB")
	_, err = migrations.PlanDown(ctx, nil)
	require.ErrorContains(t, err, "nil *sql.DB")
	_, err = migrations.NewProvider(nil, migrations.Config{})
	require.ErrorContains(t, err, "nil *sql.DB")
}

// The same files work from the goose CLI, with the command README.md gives.
func TestGooseCLI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db := testdb.Empty(t)

	bin := t.TempDir()
	build := exec.CommandContext(ctx, "go", "install",
		"-tags", "no_clickhouse no_libsql no_mssql no_mysql no_sqlite3 no_vertica no_ydb",
		"github.com/pressly/goose/v3/cmd/goose@v3.29.0")
	build.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=")
	build.Dir = bin // outside this module: install the CLI at its own go.mod
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build goose CLI: %s", out)

	goose := func(args ...string) string {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "goose"),
			append([]string{"-dir", ".", "-table", migrations.TableName, "postgres", db.URL}, args...)...)
		cmd.Dir = "." // this package's directory holds the .sql files
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "goose %s: %s", strings.Join(args, " "), out)
		return string(out)
	}
	goose("up")
	require.Contains(t, pgboxTables(t, db), "pgbox_inbox")

	// The library sees the CLI's work as its own: nothing left to apply.
	st, err := migrations.Status(ctx, db.SQL(t))
	require.NoError(t, err)
	for _, s := range st {
		require.Equal(t, "applied", string(s.State), "migration %s", s.Source.Path)
	}

	goose("reset")
	require.Empty(t, pgboxTables(t, db))
	goose("up")
	require.Contains(t, pgboxTables(t, db), "pgbox_inbox")
}

// LockIDDefault is the key earlier pgbox releases derived at run time: a
// migrator of this release and one of an older release still wait for each
// other.
func TestLockIDDefault(t *testing.T) {
	t.Parallel()
	h := fnv.New64a()
	_, _ = h.Write([]byte("pgbox:" + migrations.TableName))
	require.Equal(t, int64(h.Sum64()>>1), migrations.LockIDDefault)
}
