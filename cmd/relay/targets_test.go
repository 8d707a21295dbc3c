package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/migrations"
)

func init() {
	for name, c := range map[string]flagCheck{
		"targets":             {check: checkTargets, bad: "/no/such/dir/targets.txt"},
		"targets-query":       {check: checkTargetsQuery},
		"control-url":         {check: checkControlURL, bad: "postgres://u:pw@h:notaport/db"},
		"targets-refresh":     {check: checkTargetsRefresh, bad: "0s"},
		"migrate-concurrency": {check: checkMigrateConcurrency, bad: "0"},
	} {
		flagChecks[name] = c
	}
}

// testApp is an app for calling the binary's functions in the test's
// process, logging to the returned buffer.
func testApp(o *options) (*app, *testutil.SyncBuffer) {
	logs := &testutil.SyncBuffer{}
	return &app{opts: o, set: newSettings(), stdout: logs, stderr: logs, log: newLogger(logs, "text", "debug")}, logs
}

// writeFile writes a file of the test's temporary directory and returns its
// path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	return p
}

// rewrite replaces a file's text at once (as an editor saving by rename
// does), so a concurrent reader never sees half of it.
func rewrite(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(text), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

const (
	defaultDB = "postgres://app@db.internal:5432/app"
	otherDB   = "postgres://app:s3cret@other.internal:5432/app"
)

func TestTargetsFile(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "targets.txt", `# tenants of the eu cluster
acme      tenant_acme
globex    tenant_globex   `+otherDB+`   # moved to its own database

	initech.eu-1 t_initech$2
`)
	list, err := readTargetsFile(path, defaultDB)
	require.NoError(t, err)
	require.Equal(t, []targetSpec{
		{Name: "acme", Schema: "tenant_acme", DatabaseURL: defaultDB},
		{Name: "globex", Schema: "tenant_globex", DatabaseURL: otherDB},
		{Name: "initech.eu-1", Schema: "t_initech$2", DatabaseURL: defaultDB},
	}, list)

	empty, err := parseTargets([]byte("# nobody yet\n\n"), "empty.txt", defaultDB)
	require.NoError(t, err)
	require.Empty(t, empty)
}

// Every bad line is reported, each with the file and its line number; a
// password never is.
func TestTargetsFileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		defaultURL string
		want       string // with {f} for the file's path
	}{
		{"one field", "acme\n", defaultDB, `{f}:1: 1 fields: a line must be name schema [database-url]`},
		{"four fields", "\n\nacme s postgres://h/db extra\n", defaultDB, `{f}:3: 4 fields`},
		{"bad name", "acme/eu s\n", defaultDB, `{f}:1: target "acme/eu": invalid name "acme/eu": must be letters, digits`},
		{"two schemas", "acme a,b\n", defaultDB, `{f}:1: target "acme": invalid schema "a,b": must be one schema name`},
		{"quoted schema", "acme \"a\"\n", defaultDB, `{f}:1: target "acme": invalid schema "\"a\""`},
		{"upper-case schema", "acme Tenant\n", defaultDB, `{f}:1: target "acme": invalid schema "Tenant": must be one schema name in lower case`},
		{"long schema", "acme " + strings.Repeat("s", 64) + "\n", defaultDB, `must be at most 63 bytes`},
		{"bad url", "acme s postgres://app:hunter2@h:notaport/db\n", defaultDB, `{f}:1: target "acme": invalid database URL postgres://`},
		{"no url", "# x\nacme s\n", "", `{f}:2: target "acme": no database URL: give one for this target or set DATABASE_URL (--database-url)`},
		{"duplicate name", "acme s1\nglobex s2\nacme s3\n", defaultDB, `{f}:3: target "acme": duplicate name "acme" (first on line 1)`},
		{"same schema twice", "acme s " + otherDB + "\nglobex s " + otherDB + "\n", defaultDB,
			`{f}:2: target "globex": schema "s" of database postgres://app:xxxxx@other.internal:5432/app is listed twice (first on line 1)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, "targets.txt", tc.text)
			_, err := readTargetsFile(path, tc.defaultURL)
			require.Error(t, err)
			require.ErrorIs(t, err, errUsage)
			require.Contains(t, err.Error(), "PGBOX_TARGETS (--targets) ")
			require.Contains(t, err.Error(), strings.ReplaceAll(tc.want, "{f}", path))
			require.NotContains(t, err.Error(), "hunter2")
			require.NotContains(t, err.Error(), "s3cret")
		})
	}

	// All bad lines at once, the good ones not reported.
	path := writeFile(t, "targets.txt", "good s1\nbad/1 s2\ngood2 s3\nbad2 S4\n")
	_, err := readTargetsFile(path, defaultDB)
	require.Error(t, err)
	require.Contains(t, err.Error(), path+":2:")
	require.Contains(t, err.Error(), path+":4:")
	require.NotContains(t, err.Error(), path+":1:")
	require.NotContains(t, err.Error(), path+":3:")

	_, err = readTargetsFile(filepath.Join(t.TempDir(), "missing.txt"), defaultDB)
	require.ErrorIs(t, err, errUsage)
	require.Contains(t, err.Error(), "PGBOX_TARGETS (--targets): cannot read the target list")
	require.Contains(t, err.Error(), "missing.txt")
}

// controlTable creates a table of targets in a scratch schema and returns
// the schema (its URL sets it as search_path).
func controlTable(t *testing.T, rows ...string) *testdb.DB {
	t.Helper()
	db := testdb.Empty(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE tenants (name text, schema text, database_url text, active bool NOT NULL DEFAULT true)`)
	require.NoError(t, err)
	for _, r := range rows {
		_, err := db.Pool.Exec(context.Background(), `INSERT INTO tenants (name, schema, database_url) VALUES `+r)
		require.NoError(t, err)
	}
	return db
}

func queryApp(t *testing.T, db *testdb.DB, query string) (*app, *testutil.SyncBuffer) {
	t.Helper()
	return testApp(&options{DatabaseURL: defaultDB, Targets: targetOptions{Query: query, ControlURL: db.URL}})
}

func TestTargetsQuery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := controlTable(t, `('acme', 'tenant_acme', NULL)`, `('globex', 'tenant_globex', '`+otherDB+`')`)
	a, _ := queryApp(t, db, `SELECT name, schema, database_url FROM tenants WHERE active ORDER BY name`)
	list, err := loadTargets(ctx, a)
	require.NoError(t, err)
	require.Equal(t, []targetSpec{
		{Name: "acme", Schema: "tenant_acme", DatabaseURL: defaultDB},
		{Name: "globex", Schema: "tenant_globex", DatabaseURL: otherDB},
	}, list, "a NULL database_url is --database-url")

	// database_url is optional; any text type does.
	a, _ = queryApp(t, db, `SELECT name::varchar AS name, schema FROM tenants ORDER BY name`)
	list, err = loadTargets(ctx, a)
	require.NoError(t, err)
	require.Equal(t, defaultDB, list[1].DatabaseURL)

	for _, tc := range []struct{ name, query, want string }{
		{"bad row", `SELECT 'acme' AS name, 'a,b' AS schema UNION ALL SELECT 'globex', 'ok'`,
			`target "acme" (row 1): invalid schema "a,b"`},
		{"NULL schema", `SELECT name, NULL::text AS schema FROM tenants WHERE name = 'globex'`,
			`target "globex": name and schema must not be NULL`},
		{"NULL name", `SELECT NULL::text AS name, 's' AS schema`, `row 1: name and schema must not be NULL`},
		{"duplicate", `SELECT 'acme' AS name, 's1' AS schema UNION ALL SELECT 'acme', 's2'`,
			`target "acme" (row 2): duplicate name "acme" (first on row 1)`},
		{"bad url", `SELECT 'acme' AS name, 's' AS schema, 'postgres://u:hunter2@h:notaport/db' AS database_url`,
			`target "acme" (row 1): invalid database URL postgres://`},
		{"unknown column", `SELECT name, schema, database_url AS db_url FROM tenants`,
			`unknown column "db_url": the query returns the columns name, schema and optionally database_url`},
		{"missing column", `SELECT name FROM tenants`, `no column "schema"`},
		{"writes", `INSERT INTO tenants (name, schema) VALUES ('x', 'y') RETURNING name, schema`, `read-only transaction`},
		{"sql error", `SELECT name, schema FROM no_such_table`, `no_such_table`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := queryApp(t, db, tc.query)
			_, err := loadTargets(ctx, a)
			require.Error(t, err)
			require.Contains(t, err.Error(), "PGBOX_TARGETS_QUERY (--targets-query): ")
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "hunter2")
		})
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM tenants`).Scan(&n))
	require.Equal(t, 2, n, "the query runs read-only")
}

// watchFor starts watchTargets with a short refresh and returns the first
// list and a channel of the lists it calls back with.
func watchFor(t *testing.T, a *app) ([]targetSpec, <-chan []targetSpec) {
	t.Helper()
	a.opts.Targets.Refresh = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan []targetSpec, 100)
	list, done, err := watchTargets(ctx, a, func(l []targetSpec) { changes <- l })
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("watchTargets did not stop")
		}
	})
	return list, changes
}

func nextList(t *testing.T, changes <-chan []targetSpec) []string {
	t.Helper()
	select {
	case l := <-changes:
		return targetNames(l)
	case <-time.After(30 * time.Second):
		t.Fatal("no change seen")
	}
	return nil
}

func requireNoChange(t *testing.T, changes <-chan []targetSpec, d time.Duration) {
	t.Helper()
	select {
	case l := <-changes:
		t.Fatalf("unexpected change to %v", targetNames(l))
	case <-time.After(d):
	}
}

// Editing the file adds and removes targets; a file that cannot be read is
// logged once and the previous list kept, until it reads again.
func TestTargetsRefreshFile(t *testing.T) {
	t.Parallel()
	path := writeFile(t, "targets.txt", "acme s1\nglobex s2\n")
	a, logs := testApp(&options{DatabaseURL: defaultDB, Targets: targetOptions{File: path}})
	list, changes := watchFor(t, a)
	require.Equal(t, []string{"acme", "globex"}, targetNames(list))

	rewrite(t, path, "acme s1\nglobex s2\ninitech s3\n")
	require.Equal(t, []string{"acme", "globex", "initech"}, nextList(t, changes))
	rewrite(t, path, "# acme left\nglobex s2\ninitech s3\n")
	require.Equal(t, []string{"globex", "initech"}, nextList(t, changes))
	rewrite(t, path, "initech s3\nglobex s2\n")
	requireNoChange(t, changes, 300*time.Millisecond) // the order is no change

	rewrite(t, path, "initech s3\nglobex S2\n")
	testutil.Eventually(t, 30*time.Second, "the failed read logged", func() bool {
		return strings.Contains(logs.String(), "cannot re-read the target list")
	})
	requireNoChange(t, changes, 500*time.Millisecond) // ten reads, all failing
	require.Equal(t, 1, strings.Count(logs.String(), "cannot re-read the target list"), "logged once, not at every read:\n%s", logs)
	require.Contains(t, logs.String(), `targets.txt:2: target \"globex\": invalid schema`)

	rewrite(t, path, "initech s3\nglobex s2-moved\n")
	require.Equal(t, []string{"initech", "globex"}, nextList(t, changes), "a changed schema is a change")
	require.Contains(t, logs.String(), "target list read again")
	require.Contains(t, logs.String(), `msg="target list changed"`)
}

// A row inserted into the control table adds a target, a row deleted
// removes one; a failing query is logged once and the list kept.
func TestTargetsRefreshQuery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := controlTable(t, `('acme', 'tenant_acme', NULL)`)
	a, logs := queryApp(t, db, `SELECT name, schema, database_url FROM tenants ORDER BY name`)
	list, changes := watchFor(t, a)
	require.Equal(t, []string{"acme"}, targetNames(list))

	_, err := db.Pool.Exec(ctx, `INSERT INTO tenants (name, schema) VALUES ('globex', 'tenant_globex')`)
	require.NoError(t, err)
	require.Equal(t, []string{"acme", "globex"}, nextList(t, changes))
	_, err = db.Pool.Exec(ctx, `DELETE FROM tenants WHERE name = 'acme'`)
	require.NoError(t, err)
	require.Equal(t, []string{"globex"}, nextList(t, changes))

	_, err = db.Pool.Exec(ctx, `ALTER TABLE tenants RENAME TO tenants_away`)
	require.NoError(t, err)
	testutil.Eventually(t, 30*time.Second, "the failed query logged", func() bool {
		return strings.Contains(logs.String(), "cannot re-read the target list")
	})
	requireNoChange(t, changes, 500*time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), "cannot re-read the target list"), logs.String())

	_, err = db.Pool.Exec(ctx, `ALTER TABLE tenants_away RENAME TO tenants; INSERT INTO tenants (name, schema) VALUES ('initech', 's3')`)
	require.NoError(t, err)
	require.Equal(t, []string{"globex", "initech"}, nextList(t, changes))
	require.Contains(t, logs.String(), "target list read again")
}

// The first read's failure is watchTargets' error; without a target list
// there is one target and nothing to watch.
func TestWatchTargetsFirstRead(t *testing.T) {
	t.Parallel()
	db := controlTable(t)
	a, _ := queryApp(t, db, `SELECT name, schema FROM no_such_table`)
	_, _, err := watchTargets(context.Background(), a, func([]targetSpec) { t.Error("called back") })
	require.ErrorContains(t, err, "no_such_table")

	a, _ = testApp(&options{DatabaseURL: defaultDB, Schema: "tenant_acme"})
	list, done, err := watchTargets(context.Background(), a, func([]targetSpec) { t.Error("called back") })
	require.NoError(t, err)
	require.Equal(t, []targetSpec{{DatabaseURL: defaultDB, Schema: "tenant_acme"}}, list)
	<-done
}

// The target settings refuse each other, --schema, and a control database
// without a query; a bad file is a usage error before any command runs.
func TestTargetsSettingsRefused(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "targets.txt", "acme s1\n")
	db := []string{"DATABASE_URL=postgres://alice:hunter2@127.0.0.1:1/db"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"file and query", append(db, "PGBOX_TARGETS="+file), []string{"migrate", "up", "--targets-query=SELECT 1"},
			"PGBOX_TARGETS (--targets) and PGBOX_TARGETS_QUERY (--targets-query) cannot both be set"},
		{"schema and file", append(db, "PGBOX_SCHEMA=s"), []string{"migrate", "up", "--targets", file},
			"PGBOX_SCHEMA (--schema) cannot be combined with PGBOX_TARGETS (--targets): each target names its own schema"},
		{"schema and query", append(db, "PGBOX_TARGETS_QUERY=SELECT 1"), []string{"targets", "list", "--schema=s"},
			"PGBOX_SCHEMA (--schema) cannot be combined with PGBOX_TARGETS_QUERY (--targets-query)"},
		{"control without query", append(db, "PGBOX_CONTROL_URL=postgres://u:hunter2@h/db"), []string{"migrate", "status"},
			"PGBOX_CONTROL_URL (--control-url) is set but PGBOX_TARGETS_QUERY (--targets-query) is not"},
		{"query without any database", nil, []string{"targets", "list", "--targets-query=SELECT 1"},
			"missing control database for PGBOX_TARGETS_QUERY (--targets-query): set PGBOX_CONTROL_URL (--control-url) or DATABASE_URL (--database-url)"},
		{"bad line", db, []string{"migrate", "status", "--targets=" + writeFile(t, "bad.txt", "\nacme s1 postgres://u:hunter2@h:x/db\n")},
			"bad.txt:2: target \"acme\": invalid database URL"},
		{"migrate down", db, []string{"migrate", "down", "--targets", file},
			"migrate down is refused with PGBOX_TARGETS (--targets), nothing rolled back: it rolls back one target at a time; run `relay migrate down` with --database-url and --schema"},
		{"targets without action", db, []string{"targets"}, "targets needs one argument: list or watch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runRelay(t, time.Minute, tc.env, tc.args...)
			require.Equal(t, 2, r.Code, r.Stderr)
			require.Contains(t, r.Stderr, tc.want)
			require.NotContains(t, r.Stderr+r.Stdout, "hunter2")
		})
	}

	// With a target list, DATABASE_URL is only the default of the targets
	// naming none.
	r := runRelay(t, time.Minute, nil, "targets", "list", "--targets", writeFile(t, "t.txt", "acme s1 "+otherDB+"\n"))
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^acme\s+s1\s+postgres://app:xxxxx@other.internal:5432/app$`, r.Stdout)
	r = runRelay(t, time.Minute, nil, "targets", "list", "--targets", file)
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "no database URL")
}

// --- flag checks ---

func checkTargets(t *testing.T, set setFn) {
	db := testdb.Empty(t)
	file := writeFile(t, "targets.txt", "acme "+db.Schema+" "+testdb.ServerURL(t)+"\n")
	r := runWith(t, set, file, nil, "migrate", "up")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^acme\s+`+db.Schema+`\s+\S+\s+migrated to `+schemaVersion()+` \(from 0\)$`, r.Stdout)
	require.True(t, tableExists(t, db, "pgbox_outbox"), "the file's target was migrated")
}

func checkTargetsQuery(t *testing.T, set setFn) {
	db := controlTable(t, `('acme', 'tenant_acme', NULL)`, `('globex', 'tenant_globex', '`+otherDB+`')`)
	r := runWith(t, set, "SELECT name, schema, database_url FROM tenants ORDER BY name", []string{"DATABASE_URL=" + db.URL}, "targets", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^acme\s+tenant_acme\s+`+regexp.QuoteMeta(db.URL)+`$`, r.Stdout)
	require.Regexp(t, `(?m)^globex\s+tenant_globex\s+postgres://app:xxxxx@other.internal:5432/app$`, r.Stdout)
}

func checkControlURL(t *testing.T, set setFn) {
	// The table is only on the control URL's search_path.
	db := controlTable(t, `('acme', 'tenant_acme', NULL)`)
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_TARGETS_QUERY=SELECT name, schema FROM tenants"}
	r := runWith(t, set, db.URL, env, "targets", "list")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^acme\s+tenant_acme\s+`+regexp.QuoteMeta(testdb.ServerURL(t))+`$`, r.Stdout, "the default database stays --database-url")
	r = runRelay(t, time.Minute, env, "targets", "list")
	require.Equal(t, 1, r.Code, "without it, the query runs on DATABASE_URL: %s", r.Stderr)
	require.Contains(t, r.Stderr, `relation "tenants" does not exist`)
}

// startTargetsProc starts the binary (stdout and stderr in Output);
// watching waits for the first target table.
func startTargetsProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(relayBin, args...)
	cmd.Env = append(testutil.CleanEnv(), env...)
	return &proc{testutil.StartProc(t, cmd, regexp.MustCompile(`^(NAME)\s+SCHEMA\s+DATABASE$`))}
}

func checkTargetsRefresh(t *testing.T, set setFn) {
	file := writeFile(t, "targets.txt", "acme s1\n")
	a, e := with(set, "1s", []string{"DATABASE_URL=" + defaultDB, "PGBOX_TARGETS=" + file}, "targets", "watch")
	p := startTargetsProc(t, e, a...)
	p.HTTPAddr(t) // the first table
	rewrite(t, file, "acme s1\nglobex s2\n")
	// Seen within seconds: with the 30s default, not within 15.
	waitFor(t, "the added target", 15*time.Second, func() bool {
		return strings.Contains(p.Output(), "+ globex s2 "+defaultDB+"\n")
	})
	rewrite(t, file, "globex s2\n")
	waitFor(t, "the removed target", 15*time.Second, func() bool {
		return strings.Contains(p.Output(), "- acme s1 "+defaultDB+"\n")
	})
	require.Equal(t, 0, p.stop(t), p.Output())
	require.Contains(t, p.Output(), "refresh=1s")
}

// holdMigrationLock takes the lock single-target migrators hold on the
// database, as a `relay migrate up` running there would.
func holdMigrationLock(t *testing.T, dbURL string) (release func()) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrations.LockIDDefault)
	require.NoError(t, err)
	released := false
	release = func() {
		if !released {
			released = true
			_ = c.Close(ctx)
		}
	}
	t.Cleanup(release)
	return release
}

var startedRE = regexp.MustCompile(`msg="migrate up: target started"`)

func checkMigrateConcurrency(t *testing.T, set setFn) {
	_, dbURL := testdb.CreateDatabase(t, "t_targets_")
	var lines []string
	for i := range 4 {
		lines = append(lines, fmt.Sprintf("t%d s%d", i, i))
	}
	file := writeFile(t, "targets.txt", strings.Join(lines, "\n"))
	release := holdMigrationLock(t, dbURL)
	a, e := with(set, "2", []string{"DATABASE_URL=" + dbURL, "PGBOX_TARGETS=" + file}, "migrate", "up")
	p := startTargetsProc(t, e, a...)
	waitFor(t, "two targets started", time.Minute, func() bool { return len(startedRE.FindAllString(p.Output(), -1)) >= 2 })
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) { // both wait for the lock: no third starts
		require.Len(t, startedRE.FindAllString(p.Output(), -1), 2, p.Output())
		time.Sleep(50 * time.Millisecond)
	}
	release()
	select {
	case <-p.Done():
	case <-time.After(2 * time.Minute):
		t.Fatalf("migrate up did not finish\n%s", p.Output())
	}
	require.Equal(t, 0, p.Cmd.ProcessState.ExitCode(), p.Output())
	created := regexp.MustCompile(`(?m)^t\d\s+s\d\s+\S+\s+migrated to ` + schemaVersion() + ` \(schema created\)$`)
	require.Len(t, created.FindAllString(p.Output(), -1), 4, p.Output())
}

// TestTargetsWatchKeepsListOnFailure: `targets watch` prints nothing while
// the list cannot be read, and the change once it can.
func TestTargetsWatchKeepsListOnFailure(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "targets.txt", "acme s1\n")
	p := startTargetsProc(t, []string{"DATABASE_URL=" + defaultDB, "PGBOX_TARGETS=" + file, "PGBOX_TARGETS_REFRESH=1s"}, "targets", "watch")
	p.HTTPAddr(t)
	require.NoError(t, os.Remove(file))
	waitFor(t, "the failed read logged", 15*time.Second, func() bool { return strings.Contains(p.Output(), "cannot re-read the target list") })
	rewrite(t, file, "acme s1\nglobex s2\n")
	waitFor(t, "the added target", 15*time.Second, func() bool { return strings.Contains(p.Output(), "+ globex s2 ") })
	require.NotContains(t, p.Output(), "- acme", "the list was kept while the file was missing")
	require.Equal(t, 1, strings.Count(p.Output(), "cannot re-read the target list"), p.Output())
	require.Equal(t, 0, p.stop(t), p.Output())
}
