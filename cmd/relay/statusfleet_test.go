package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
)

// scratchTarget migrates schema in the database of dbURL to this binary's
// head and returns it as a testdb.DB, for the helpers that write rows.
func scratchTarget(t *testing.T, dbURL, schema string) *testdb.DB {
	t.Helper()
	vs := migrationVersions(t)
	migrateSchemaTo(t, dbURL, schema, vs[len(vs)-1])
	u, err := testdb.WithSearchPath(dbURL, schema)
	require.NoError(t, err)
	pool, err := pgxpool.New(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testdb.DB{Pool: pool, Schema: schema, URL: u}
}

// unreachableURL is a database that does not exist, with a password that
// must never be printed.
func unreachableURL(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testdb.ServerURL(t))
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "hunter2")
	u.Path = "/t_fleet_no_such_database"
	return u.String()
}

// statusTargetsFixture: six targets, whose lines `relay status` sorts
// broken (unreachable), nosuch (no schema), hooli (behind: an empty
// schema), acme (2h-old backlog), initech (fresh backlog, in a database of
// its own whose horizon a snapshot holds) and globex (nothing to do).
func statusTargetsFixture(t *testing.T) (env []string) {
	t.Helper()
	server := testdb.ServerURL(t)
	acme, globex, hooli := testdb.New(t), testdb.New(t), testdb.Empty(t)
	_, scratch := testdb.CreateDatabase(t, "t_status_")
	initech := scratchTarget(t, scratch, "s_initech")

	writeRows(t, acme, "orders", 0, 5)
	opsExec(t, acme, `UPDATE pgbox_outbox SET created_at = now() - interval '2 hours'`)
	park(t, acme, "orders", time.Hour, "record too large")
	park(t, acme, "orders", time.Hour, "record too large")
	dead(t, acme, "payments-svc", "orders")
	registerRelay(t, acme, "relay-a")
	opsExec(t, acme, `INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at)
		SELECT g, 4, CASE WHEN g < 3 THEN 'relay-a' END, CASE WHEN g < 3 THEN now() + interval '1 hour' ELSE '-infinity' END FROM generate_series(0, 3) g`)

	writeRows(t, initech, "invoices", 0, 2)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, initech.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	_, err = holder.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pgbox_outbox`)
	require.NoError(t, err)

	file := writeFile(t, "targets.txt", fmt.Sprintf(`acme %s
globex %s
hooli %s
nosuch t_no_such_schema
initech s_initech %s
broken s_x %s
`, acme.Schema, globex.Schema, hooli.Schema, scratch, unreachableURL(t)))
	return []string{"DATABASE_URL=" + server, "PGBOX_TARGETS=" + file}
}

// `relay status` over a target list: one line per target, the worst first,
// with each one's state and figures; --json the same; exit 1 naming how
// many are not ok. A password is never printed.
func TestStatusTargets(t *testing.T) {
	t.Parallel()
	env := statusTargetsFixture(t)

	r := runRelay(t, time.Minute, env, "status")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "relay status: 3 of 6 targets are not ok (see the STATE column)\n")
	require.NotContains(t, r.Stdout+r.Stderr, "hunter2")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	require.Len(t, lines, 7, r.Stdout)
	require.Regexp(t, `^NAME\s+SCHEMA\s+DATABASE\s+BACKLOG\s+OLDEST\s+PARKED\s+DEAD\s+RELAYS\s+LANES\s+XMIN\s+STATE$`, lines[0])
	var order []string
	for _, l := range lines[1:] {
		order = append(order, strings.Fields(l)[0])
	}
	require.Equal(t, []string{"broken", "nosuch", "hooli", "acme", "initech", "globex"}, order, r.Stdout)

	require.Regexp(t, `^(-\s+){7}unreachable: .*t_fleet_no_such_database.*does not exist`, targetRow(t, r.Stdout, "broken"))
	require.Regexp(t, `^postgres://\S+:xxxxx@\S+/t_fleet_no_such_database`, strings.Fields(lines[1])[2], "the database, its password masked")
	require.Regexp(t, "^(-\\s+){7}no schema: `relay migrate up` with the target list creates it$", targetRow(t, r.Stdout, "nosuch"))
	require.Regexp(t, "^(-\\s+){7}behind: never migrated: run `relay migrate up`$", targetRow(t, r.Stdout, "hooli"))
	require.Regexp(t, `^5\s+2h\s+2\s+1\s+1\s+3/4\s+\S+\s+ok$`, targetRow(t, r.Stdout, "acme"))
	require.Regexp(t, `^2\s+\S+\s+0\s+0\s+0\s+-\s+\S+\s+ok$`, targetRow(t, r.Stdout, "initech"))
	require.NotRegexp(t, `\s-\s+ok$`, targetRow(t, r.Stdout, "initech"), "a snapshot holds initech's database's horizon")
	require.Regexp(t, `^0\s+-\s+0\s+0\s+0\s+-\s+\S+\s+ok$`, targetRow(t, r.Stdout, "globex"))

	r = runRelay(t, time.Minute, env, "status", "--json")
	require.Equal(t, 1, r.Code, r.Stderr)
	var got struct{ Targets []targetLine }
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &got), r.Stdout)
	byName := map[string]targetLine{}
	order = nil
	for _, l := range got.Targets {
		byName[l.Name] = l
		order = append(order, l.Name)
	}
	require.Equal(t, []string{"broken", "nosuch", "hooli", "acme", "initech", "globex"}, order)
	for name, state := range map[string]string{"broken": stateUnreachable, "nosuch": stateNoSchema, "hooli": stateBehind, "acme": stateOK, "initech": stateOK, "globex": stateOK} {
		require.Equal(t, state, byName[name].State, name)
	}
	for _, name := range []string{"broken", "nosuch", "hooli"} {
		require.Nil(t, byName[name].TargetFigures, "%s: no figures", name)
	}
	a := byName["acme"]
	require.NotNil(t, a.TargetFigures)
	require.EqualValues(t, 5, a.Unpublished)
	require.InDelta(t, (2 * time.Hour).Seconds(), *a.OldestAge, 60)
	require.EqualValues(t, 2, a.Parked)
	require.EqualValues(t, 1, a.DeadLetters)
	require.Equal(t, 1, a.RelaysLive)
	require.Equal(t, 4, a.Lanes)
	require.Equal(t, 3, a.LanesHeld)
	in := byName["initech"]
	require.EqualValues(t, 2, in.Unpublished)
	require.NotNil(t, in.HorizonAgeSeconds, "the snapshot held in initech's database")
	require.False(t, in.HorizonPastBound)
	require.Regexp(t, `^postgres://\S+:xxxxx@`, byName["broken"].Database)
	require.NotContains(t, r.Stdout+r.Stderr, "hunter2")
}

// `relay status NAME` prints that target's full status, as `relay status`
// prints one database's; a name not in the list is a usage error naming the
// list's; a target that cannot be read fails naming it.
func TestStatusTarget(t *testing.T) {
	t.Parallel()
	env := statusTargetsFixture(t)

	r := runRelay(t, time.Minute, env, "status", "acme")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^pgbox status at `, r.Stdout)
	for _, want := range []string{"OUTBOX: 5 unpublished, 2 parked, oldest unpublished 2h (lanes: 4)", "PARKED ROWS", "record too large",
		"RELAY INSTANCES (4 lanes, 1 unowned)", "relay-a", "DEAD LETTERS", "payments-svc", "XMIN HORIZON: "} {
		require.Contains(t, r.Stdout, want)
	}

	r = runRelay(t, time.Minute, env, "status", "--json", "initech")
	require.Equal(t, 0, r.Code, r.Stderr)
	var snap inspect.Snapshot
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &snap), r.Stdout)
	require.EqualValues(t, 2, snap.Outbox.Unpublished)
	require.Equal(t, "invoices", snap.Topics[0].Topic)

	r = runRelay(t, time.Minute, env, "status", "hooli")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Regexp(t, "^relay status: target \"hooli\" \\(schema \\S+\\): .*relay migrate up", r.Stderr)

	r = runRelay(t, time.Minute, env, "status", "nosuch")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, `target "nosuch": schema "t_no_such_schema" does not exist in database`)

	r = runRelay(t, time.Minute, env, "status", "broken")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Regexp(t, `target "broken": database postgres://\S+:xxxxx@\S+ unreachable`, r.Stderr)
	require.NotContains(t, r.Stderr, "hunter2")

	r = runRelay(t, time.Minute, env, "status", "nobody")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Equal(t, `relay: status: unknown target "nobody": PGBOX_TARGETS (--targets) lists 6: acme, broken, globex, hooli, initech, nosuch`+"\n", r.Stderr)

	r = runRelay(t, time.Minute, env, "status", "acme", "globex")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "status takes at most one argument, the name of a target")

	// Without a list, a name is refused.
	r = runRelay(t, time.Minute, []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db"}, "status", "acme")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "status takes a target name only with --targets or --targets-query")
}

// knownNames names every target of a short list, and the first ten and
// the count of a long one.
func TestStatusUnknownTargetNames(t *testing.T) {
	t.Parallel()
	var list []targetSpec
	for i := range 12 {
		list = append(list, targetSpec{Name: fmt.Sprintf("t%02d", i)})
	}
	require.Equal(t, "12 targets: t00, t01, t02, t03, t04, t05, t06, t07, t08, t09, … (2 more; `relay targets list` prints them all)", knownNames(list))
	require.Equal(t, "2: t00, t01", knownNames(list[:2]))
	require.Equal(t, "no target", knownNames(nil))
}

// An empty list prints no table, and exits 0; --json an empty list.
func TestStatusTargetsEmptyList(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db", "PGBOX_TARGETS=" + writeFile(t, "targets.txt", "# none yet\n")}
	r := runRelay(t, time.Minute, env, "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "no targets: PGBOX_TARGETS (--targets) lists none\n", r.Stdout)
	r = runRelay(t, time.Minute, env, "status", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, regexp.MustCompile(`^\{\s*"targets": \[\]\s*\}\s*$`), r.Stdout)
}

// A target whose snapshot fails on a query is "failed" with the error; one
// whose tables are missing although its migrations are applied is behind
// with inspect's advice; failed sorts first.
func TestStatusTargetsFailed(t *testing.T) {
	t.Parallel()
	renamed, dropped := testdb.New(t), testdb.New(t)
	opsExec(t, renamed, `ALTER TABLE pgbox_relay_lanes RENAME COLUMN epoch TO epoch_renamed`)
	opsExec(t, dropped, `DROP TABLE pgbox_relay_instances`)
	file := writeFile(t, "targets.txt", fmt.Sprintf("dropped %s\nrenamed %s\n", dropped.Schema, renamed.Schema))
	r := runRelay(t, time.Minute, []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_TARGETS=" + file}, "status")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "relay status: 2 of 2 targets are not ok")
	require.Regexp(t, `(?s)\nrenamed .*\ndropped `, r.Stdout)
	require.Regexp(t, `^(-\s+){7}failed: inspect: read pgbox_relay_lanes: .*"epoch" does not exist`, targetRow(t, r.Stdout, "renamed"))
	require.Regexp(t, "^(-\\s+){7}behind: pgbox tables missing: run `relay migrate up`$", targetRow(t, r.Stdout, "dropped"))
}

// The worst first: by state, then the oldest unpublished row, the larger
// backlog, more parked rows, more dead letters, the name; a target without
// figures before one with in the same state.
func TestStatusTargetsOrder(t *testing.T) {
	t.Parallel()
	age := func(s float64) *float64 { return &s }
	line := func(name, state string, f *TargetFigures) targetLine {
		return targetLine{Name: name, State: state, TargetFigures: f}
	}
	lines := []targetLine{
		line("z-ok-idle", stateOK, &TargetFigures{}),
		line("a-ok-idle", stateOK, &TargetFigures{}),
		line("dead", stateOK, &TargetFigures{DeadLetters: 1}),
		line("parked", stateOK, &TargetFigures{Parked: 1, DeadLetters: 0}),
		line("backlog", stateOK, &TargetFigures{Unpublished: 9, OldestAge: age(5)}),
		line("fewer", stateOK, &TargetFigures{Unpublished: 3, OldestAge: age(5)}),
		line("oldest", stateOK, &TargetFigures{Unpublished: 1, OldestAge: age(60)}),
		line("behind-read", stateBehind, &TargetFigures{OldestAge: age(600)}),
		line("behind", stateBehind, nil),
		line("noschema", stateNoSchema, nil),
		line("failed", stateFailed, nil),
		line("unreachable", stateUnreachable, nil),
	}
	sortLines(lines)
	var names []string
	for _, l := range lines {
		names = append(names, l.Name)
	}
	require.Equal(t, []string{"unreachable", "failed", "noschema", "behind", "behind-read", "oldest", "backlog", "fewer", "parked", "dead", "a-ok-idle", "z-ok-idle"}, names)
}

// The XMIN and LANES columns.
func TestStatusTargetsColumns(t *testing.T) {
	t.Parallel()
	secs := func(s float64) *float64 { return &s }
	require.Equal(t, "-", horizonText(&TargetFigures{}))
	require.Equal(t, "3s", horizonText(&TargetFigures{HorizonAgeSeconds: secs(3), HorizonAgeTransactions: 12}))
	require.Equal(t, "12 xacts", horizonText(&TargetFigures{HorizonAgeTransactions: 12}))
	require.Equal(t, "25m!", horizonText(&TargetFigures{HorizonAgeSeconds: secs(1500), HorizonPastBound: true}))
	require.Equal(t, "2000000 xacts!", horizonText(&TargetFigures{HorizonAgeTransactions: 2_000_000, HorizonPastBound: true}))
	require.Equal(t, "-", lanesText(&TargetFigures{}))
	require.Equal(t, "3/16", lanesText(&TargetFigures{Lanes: 16, LanesHeld: 3}))
	require.Equal(t, "~1200", countOrEstimate(1200, true))
	require.Equal(t, ">=1000", countOrCapped(1000, true))
}
