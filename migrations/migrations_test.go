package migrations_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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

	require.NoError(t, migrations.Down(ctx, sqlDB))
	require.Empty(t, pgboxTables(t, db), "down must drop every pgbox table")

	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.Equal(t, tables, pgboxTables(t, db))

	// Up again is a no-op.
	require.NoError(t, migrations.Up(ctx, sqlDB))
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
	err := migrations.Up(context.Background(), nil)
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
