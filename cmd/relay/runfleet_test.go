package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

func init() {
	flagChecks["db-conn-budget"] = flagCheck{check: checkDBConnBudget, bad: "0"}
	flagChecks["dormant-after"] = flagCheck{check: checkDormantAfter, bad: "-1s"}
	flagChecks["watch-rate"] = flagCheck{check: checkWatchRate, bad: "0"}
}

// fleetEnv is runEnv for `relay run` with a target list: DATABASE_URL is
// the test server's database, where the targets without a URL are.
func fleetEnv(t *testing.T, c *kfake.Cluster, extra ...string) []string {
	return append([]string{
		"DATABASE_URL=" + testdb.ServerURL(t),
		"KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ","),
		"PGBOX_HTTP_ADDR=127.0.0.1:0",
		"PGBOX_LANES=4",
		"PGBOX_HEARTBEAT_INTERVAL=200ms",
		"PGBOX_LEASE_TTL=1s",
		"PGBOX_POLL_INTERVAL=100ms",
		"PGBOX_KAFKA_TIMEOUT=2s",
		"PGBOX_TARGETS_REFRESH=1s",
	}, extra...)
}

// schemaDB is a testdb.DB over schema of the database dbURL (a pool with
// it as search_path), for writing a target's rows.
func schemaDB(t *testing.T, dbURL, schema string) *testdb.DB {
	t.Helper()
	u, err := testdb.WithSearchPath(dbURL, schema)
	require.NoError(t, err)
	pool, err := pgxpool.New(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testdb.DB{Pool: pool, Schema: schema, URL: u}
}

// lanesHeld counts a target's lanes with a live owner, and its registered
// instances.
func lanesHeld(t *testing.T, db *testdb.DB) (lanes, instances int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL AND expires_at > now()`).Scan(&lanes))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_instances`).Scan(&instances))
	return lanes, instances
}

// headSchema creates schema in the database dbURL at this binary's newest
// migration.
func headSchema(t *testing.T, dbURL, schema string) *testdb.DB {
	t.Helper()
	vs := migrationVersions(t)
	migrateSchemaTo(t, dbURL, schema, vs[len(vs)-1])
	return schemaDB(t, dbURL, schema)
}

func metricsOf(t *testing.T, base string) string {
	t.Helper()
	_, m := httpGet(t, base+"/metrics")
	return m
}

// `relay run --targets FILE`: three schemas of one database and one of
// another served by one process; a target behind the binary's migrations
// refused alone and served once migrated; a target added to the file
// served, one removed stopped with its lanes given up; SIGTERM exits 0.
func TestRunTargets(t *testing.T) {
	t.Parallel()
	acme, globex, initech := testdb.New(t), testdb.New(t), testdb.New(t)
	behind := testdb.Empty(t)
	_, otherURL := testdb.CreateDatabase(t, "t_fleet_")
	umbrella := headSchema(t, otherURL, "s_umbrella")
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-acme", "t-globex", "t-initech", "t-umbrella", "t-behind", "t-hooli"))
	dbs := map[string]*testdb.DB{"acme": acme, "globex": globex, "initech": initech, "umbrella": umbrella}
	for name, db := range dbs {
		writeRows(t, db, "t-"+name, 0, 20)
	}
	lines := fmt.Sprintf("acme %s\nglobex %s\ninitech %s\numbrella s_umbrella %s\nbehind %s # no tables yet\n",
		acme.Schema, globex.Schema, initech.Schema, otherURL, behind.Schema)
	file := writeFile(t, "targets.txt", lines)

	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	base := "http://" + p.HTTPAddr(t)
	for name, db := range dbs {
		require.Len(t, eventIDs(t, c, "t-"+name, 20), 20, name)
		waitFor(t, name+" drained", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })
	}
	require.NotContains(t, p.Output(), "cleanup does not run")
	waitFor(t, "the checked line", 10*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	require.Regexp(t, `msg="relay running" targets=5 databases=2 db_conn_budget=20 `, p.Output())
	require.Regexp(t, `msg="targets checked" served=4 refused=1 databases=2 `, p.Output())

	// The behind target is refused, logged once at ERROR with the fix, and
	// checked again at each refresh without a new line.
	refusedRE := regexp.MustCompile(`level=ERROR msg="target refused[^\n]*target=behind[^\n]*relay migrate up`)
	time.Sleep(2500 * time.Millisecond) // two refreshes
	require.Len(t, refusedRE.FindAllString(p.Output(), -1), 1, p.Output())
	waitFor(t, "ready", 30*time.Second, func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
	_, body := httpGet(t, base+"/readyz")
	require.Contains(t, body, `"refused":1`)
	require.Contains(t, body, `"running":4`)
	require.Contains(t, body, `"behind: refused: target \"behind\"`)
	m := metricsOf(t, base)
	require.Contains(t, m, `pgbox_relay_targets{state="refused"} 1`)
	require.Contains(t, m, `pgbox_relay_targets{state="running"} 4`)
	require.Contains(t, m, "pgbox_relay_published_total 80")
	waitFor(t, "the targets' figures", 10*time.Second, func() bool {
		return strings.Contains(metricsOf(t, base), `pgbox_fleet_targets_read{result="ok"} 4`)
	})

	// `migrate up` over the list: the behind target runs within a refresh.
	r := runRelay(t, time.Minute, []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_TARGETS=" + file}, "migrate", "up")
	require.Equal(t, 0, r.Code, r.Stderr)
	writeRows(t, behind, "t-behind", 0, 20)
	require.Len(t, eventIDs(t, c, "t-behind", 20), 20)
	require.Contains(t, p.Output(), `msg="target accepted: the relay serves it" component=targets target=behind`)
	waitFor(t, "behind running", 10*time.Second, func() bool {
		return strings.Contains(metricsOf(t, base), `pgbox_relay_targets{state="running"} 5`)
	})

	// A target added to the file is served within the refresh.
	hooli := testdb.New(t)
	writeRows(t, hooli, "t-hooli", 0, 20)
	added := time.Now()
	rewrite(t, file, lines+"hooli "+hooli.Schema+"\n")
	waitFor(t, "hooli drained", 30*time.Second, func() bool { return outboxCount(t, hooli) == 0 })
	require.Less(t, time.Since(added), 15*time.Second)
	require.Len(t, eventIDs(t, c, "t-hooli", 20), 20)

	// A target removed from the file stops: its lanes and instance row are
	// given up, its new rows stay for whoever serves it next.
	lanes, _ := lanesHeld(t, globex)
	require.Equal(t, 4, lanes)
	rewrite(t, file, strings.Replace(lines, "globex "+globex.Schema+"\n", "", 1)+"hooli "+hooli.Schema+"\n")
	waitFor(t, "globex released", 15*time.Second, func() bool { l, i := lanesHeld(t, globex); return l == 0 && i == 0 })
	writeRows(t, globex, "t-globex", 100, 10)
	time.Sleep(time.Second) // ten polls of a relay still serving it
	require.Equal(t, 10, outboxCount(t, globex))
	lanes, _ = lanesHeld(t, acme)
	require.Equal(t, 4, lanes, "the others run on")
	writeRows(t, acme, "t-acme", 100, 5)
	require.Len(t, eventIDs(t, c, "t-acme", 25), 25)
	waitFor(t, "globex gone from the metrics", 10*time.Second, func() bool {
		m := metricsOf(t, base)
		return strings.Contains(m, `pgbox_relay_targets{state="running"} 5`) && strings.Contains(m, "pgbox_relay_published_total 125")
	})

	require.Equal(t, 0, p.stop(t), p.Output())
	require.Contains(t, p.Output(), `msg="relay stopped" published=125`)
	for name, db := range map[string]*testdb.DB{"acme": acme, "umbrella": umbrella, "behind": behind, "hooli": hooli} {
		l, i := lanesHeld(t, db)
		require.Zero(t, l+i, "%s: lanes given up at shutdown", name)
	}
}

// A target whose database does not answer at start is given to the
// fleet, which retries it; the others run and the process is ready.
func TestRunTargetsDatabaseDown(t *testing.T) {
	t.Parallel()
	acme := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(1, "t-acme"))
	writeRows(t, acme, "t-acme", 0, 10)
	file := writeFile(t, "targets.txt", "acme "+acme.Schema+"\ndown s_down postgres://pgbox@127.0.0.1:1/nowhere?connect_timeout=2\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	base := "http://" + p.HTTPAddr(t)
	require.Len(t, eventIDs(t, c, "t-acme", 10), 10)
	require.Regexp(t, `level=WARN msg="target's database did not answer its check[^\n]*target=down`, p.Output())
	waitFor(t, "ready", 30*time.Second, func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
	_, body := httpGet(t, base+"/readyz")
	require.Contains(t, body, `"serving":1`)
	require.Contains(t, body, `"down: `)
	require.NotContains(t, p.Output(), "target refused")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// The relay's connections, counted by the application_name of its
// databases' URLs, never exceed --db-conn-budget: six targets over two
// databases, draining with small batches on 16 lanes.
func TestRunTargetsConnBudget(t *testing.T) {
	t.Parallel()
	app := fmt.Sprintf("pgbox-budget-%d", time.Now().UnixNano())
	withApp := func(raw string) string { return withAppName(t, raw, app) }
	_, otherURL := testdb.CreateDatabase(t, "t_budget_")
	var lines []string
	var dbs []*testdb.DB
	for range 4 {
		db := testdb.New(t)
		dbs = append(dbs, db)
		lines = append(lines, fmt.Sprintf("%s %s %s", strings.ReplaceAll(db.Schema, "_", "-"), db.Schema, withApp(testdb.ServerURL(t))))
	}
	for _, s := range []string{"s_one", "s_two"} {
		dbs = append(dbs, headSchema(t, otherURL, s))
		lines = append(lines, fmt.Sprintf("%s %s %s", s, s, withApp(otherURL)))
	}
	var topics []string
	for i, db := range dbs {
		topics = append(topics, fmt.Sprintf("t%d", i))
		writeRows(t, db, topics[i], 0, 300)
	}
	c := kafkatest.New(t, kfake.SeedTopics(3, topics...))
	file := writeFile(t, "targets.txt", strings.Join(lines, "\n"))
	// 12 = 1 (the check) + 3 (a cleanup pass, which runs at start) + 2 × (3 pooled + 1 LISTEN).
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_DB_CONN_BUDGET=12", "PGBOX_LANES=16", "PGBOX_BATCH_SIZE=5"), "run")
	p.HTTPAddr(t)
	most := 0
	waitFor(t, "every target drained", 2*time.Minute, func() bool {
		n, err := appConns(context.Background(), dbs[0], app)
		require.NoError(t, err)
		most = max(most, n)
		for _, db := range dbs {
			if outboxCount(t, db) > 0 {
				return false
			}
		}
		return true
	})
	t.Logf("at most %d connections", most)
	require.LessOrEqual(t, most, 12, "the budget")
	require.GreaterOrEqual(t, most, 6, "the pools were used: %d connections at most", most)
	require.Contains(t, p.Output(), "databases=2 db_conn_budget=12 ")
	require.Contains(t, p.Output(), "databases=2 db_conns_planned=12 ")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// withAppName is raw with app as its application_name, by which the
// relay's connections to it are counted in pg_stat_activity.
func withAppName(t *testing.T, raw, app string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// appConns counts the connections open with application_name app.
func appConns(ctx context.Context, db *testdb.DB, app string) (n int, err error) {
	err = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
	return n, err
}

// The pools follow the databases listed while the relay runs: a database
// added gets its share at once, the other pool shrinking to make room (a
// new pool, its targets handed over); a database removed gives its share
// back, and the other pool grows once the list has been still for three
// refreshes. Rows written all along (and a backlog at each change, so that
// the pools are busy when replaced) are published once each, and the
// relay's connections never exceed the budget.
func TestRunTargetsPoolResize(t *testing.T) {
	t.Parallel()
	app := fmt.Sprintf("pgbox-resize-%d", time.Now().UnixNano())
	server := withAppName(t, testdb.ServerURL(t), app)
	var lines string
	var dbs []*testdb.DB
	var topics []string
	for i := range 4 { // four targets of one database: up to 2 connections each at once
		db := testdb.New(t)
		dbs, topics = append(dbs, db), append(topics, fmt.Sprintf("t%d", i))
		lines += fmt.Sprintf("t%d %s %s\n", i, db.Schema, server)
	}
	_, otherURL := testdb.CreateDatabase(t, "t_resize_")
	umbrella := headSchema(t, otherURL, "s_umbrella")
	c := kafkatest.New(t, kfake.SeedTopics(3, append(topics, "t-umbrella")...))
	file := writeFile(t, "targets.txt", lines)

	// 16 = 1 (the check) + 3 (a cleanup pass) + one database: 10 pooled
	// (--db-max-conns) + 1 LISTEN; two databases: 2 × (5 + 1).
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_DB_CONN_BUDGET=16", "PGBOX_LANES=16", "PGBOX_BATCH_SIZE=5"), "run")
	p.HTTPAddr(t)
	waitFor(t, "the checked line", 10*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	require.Contains(t, p.Output(), "databases=1 db_conn_budget=16 ")
	require.Contains(t, p.Output(), "databases=1 db_conns_planned=15 ")

	// The relay's connections, sampled until the end; rows written to the
	// first database's targets all along, through both hand-overs.
	ctx, stop := context.WithCancel(context.Background())
	var most, written int
	var writeErr error
	sampled, wrote := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			if n, err := appConns(ctx, dbs[0], app); err == nil {
				most = max(most, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	backlog := make(chan int, 1)
	go func() {
		defer close(wrote)
		for ctx.Err() == nil && writeErr == nil {
			n := 2
			select {
			case n = <-backlog:
			case <-time.After(50 * time.Millisecond):
			}
			for i, db := range dbs {
				writeErr = errors.Join(writeErr, writeRowsErr(db, topics[i], written, n))
			}
			written += n
		}
	}()

	resized := func(n, was, dbs int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`msg="database pool resized"[^\n]*max_conns=%d was=%d databases=%d db_conns_planned=`, n, was, dbs))
	}
	time.Sleep(time.Second)
	backlog <- 300
	rewrite(t, file, lines+fmt.Sprintf("umbrella s_umbrella %s\n", withAppName(t, otherURL, app)))
	writeRows(t, umbrella, "t-umbrella", 0, 50)
	waitFor(t, "umbrella drained", 30*time.Second, func() bool { return outboxCount(t, umbrella) == 0 })
	require.Regexp(t, resized(5, 10, 2), p.Output())
	require.Regexp(t, `msg="database pool opened"[^\n]*max_conns=5 db_conns_planned=16`, p.Output())
	require.Len(t, eventIDs(t, c, "t-umbrella", 50), 50)

	time.Sleep(time.Second)
	backlog <- 300
	rewrite(t, file, lines)
	waitFor(t, "the pool grown back", 30*time.Second, func() bool { return resized(10, 5, 1).MatchString(p.Output()) })
	require.Regexp(t, `msg="database no longer listed: its pool is closed"[^\n]*db_conns_planned=10`, p.Output())
	time.Sleep(time.Second)
	stop()
	<-wrote
	<-sampled
	require.NoError(t, writeErr)
	for _, db := range dbs {
		waitFor(t, db.Schema+" drained", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })
	}
	for _, topic := range topics {
		ids := eventIDs(t, c, topic, written)
		require.Len(t, ids, written, "%s: every row published, once", topic)
	}
	t.Logf("%d rows per target, at most %d connections", written, most)
	require.LessOrEqual(t, most, 16, "the budget")
	require.GreaterOrEqual(t, most, 6, "the pools were used")
	require.NotContains(t, p.Output(), "is still open", "every old connection, LISTEN included, closed before its pool's share moved")
	require.Equal(t, 0, p.stop(t), p.Output())
	// The process has exited, its pools closed (a pool's Close waits for
	// its connections in use and sends each its Terminate). A backend
	// leaves pg_stat_activity only once its own process has exited, a few
	// milliseconds later on a busy machine: counted at once, 1 to 4 of the
	// relay's were still listed (idle, the last one the stop's lane
	// release) and gone 5 to 8 ms later. What lasts is a backend still
	// running a statement the relay left behind.
	waitFor(t, "every connection closed", 5*time.Second, func() bool {
		n, err := appConns(context.Background(), dbs[0], app)
		require.NoError(t, err)
		return n == 0
	})
}

func checkDBConnBudget(t *testing.T, set setFn) {
	_, otherURL := testdb.CreateDatabase(t, "t_budget_")
	file := writeFile(t, "targets.txt", "a s_a\nb s_b "+otherURL+"\n")
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t), "KAFKA_BROKERS=127.0.0.1:1", "PGBOX_HTTP_ADDR=127.0.0.1:0", "PGBOX_TARGETS=" + file}
	r := runWith(t, set, "9", env, "run")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "PGBOX_DB_CONN_BUDGET (--db-conn-budget) 9 is too small for the 2 databases of the target list: it needs at least 10, 3 per database (a pool of at least 2 and its LISTEN connection) plus 1 to check targets and 3 for a cleanup pass (--cleanup-interval)")
	a, e := with(set, "10", append(env, "PGBOX_TARGETS_REFRESH=1s"), "run")
	p := startRelay(t, e, a...)
	p.HTTPAddr(t)
	waitFor(t, "the running and checked lines", 10*time.Second, func() bool {
		return strings.Contains(p.Output(), "db_conn_budget=10 ") && strings.Contains(p.Output(), "db_conns_planned=10 ")
	})
	// Spent: a third database's target is refused, naming the setting.
	rewrite(t, file, "a s_a\nb s_b "+otherURL+"\nc s_c postgres://pgbox@127.0.0.1:1/third\n")
	waitFor(t, "the third database refused", 15*time.Second, func() bool {
		return strings.Contains(p.Output(), `target=c `) && strings.Contains(p.Output(), "no room left in PGBOX_DB_CONN_BUDGET (--db-conn-budget) 10 for this database")
	})
	require.Equal(t, 0, p.stop(t), p.Output())
}

// The budget's split: each database's pool at most --db-max-conns and at
// least 2, its LISTEN connection, the check's and the control database's
// counted; a database added later gets the start's share if left, else
// what is left, else an error naming the setting and the number needed.
func TestConnBudget(t *testing.T) {
	t.Parallel()
	budget := func(total int, query string, noListen bool) *connBudget {
		o := &options{DBMaxConns: 10}
		o.Targets.ConnBudget, o.Targets.Query, o.Relay.NoListen = total, query, noListen
		return newConnBudget(o)
	}
	share, err := budget(20, "", false).split(2)
	require.NoError(t, err)
	require.Equal(t, 8, share, "(20 - 1 check) / 2 databases - 1 LISTEN")
	share, err = budget(20, "", false).split(1)
	require.NoError(t, err)
	require.Equal(t, 10, share, "at most --db-max-conns")
	share, err = budget(7, "", false).split(2)
	require.NoError(t, err)
	require.Equal(t, 2, share)
	_, err = budget(6, "", false).split(2)
	require.ErrorIs(t, err, errUsage)
	require.EqualError(t, err, "usage error: PGBOX_DB_CONN_BUDGET (--db-conn-budget) 6 is too small for the 2 databases of the target list: it needs at least 7, 3 per database (a pool of at least 2 and its LISTEN connection) plus 1 to check targets")
	_, err = budget(6, "SELECT 1", false).split(1)
	require.NoError(t, err)
	_, err = budget(6, "SELECT 1", false).split(2)
	require.ErrorContains(t, err, "it needs at least 8, 3 per database (a pool of at least 2 and its LISTEN connection) plus 1 to check targets and 1 to the --targets-query control database")
	share, err = budget(6, "SELECT 1", true).split(2)
	require.NoError(t, err)
	require.Equal(t, 2, share, "--no-listen: no LISTEN connection counted")

	b := budget(20, "", false)
	share, err = b.split(1)
	require.NoError(t, err)
	n, err := b.take(share)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	n, err = b.take(share)
	require.NoError(t, err)
	require.Equal(t, 7, n, "a database added later: what is left")
	require.Equal(t, 20, b.used)
	_, err = b.take(share)
	require.EqualError(t, err, "no room left in PGBOX_DB_CONN_BUDGET (--db-conn-budget) 20 for this database: 20 of it are taken, a new database needs 3 more (raise it to at least 23 and restart the relay)")
	b.give(7)
	n, err = b.take(share)
	require.NoError(t, err)
	require.Equal(t, 7, n, "a database gone gives its connections back")

	// Resizing: the share follows the databases listed; a pool shrunk gives
	// back once replaced, a pool grown reserves first, at most what is free.
	require.Equal(t, 8, b.share(2))
	require.Equal(t, 5, b.share(3), "(20 - 1) / 3 - 1")
	require.Equal(t, 2, b.share(9), "never below 2: take refuses the databases that do not fit")
	b.shrunk(10, 8)
	require.Equal(t, 2, b.free())
	require.Equal(t, 9, b.grow(7, 10), "as far as the free room goes")
	require.Equal(t, 0, b.free())
	require.Equal(t, 8, b.grow(8, 10), "no room: the same size")
	require.Equal(t, 20, b.planned())
}

// The resizing plan: a database added makes the largest pools shrink to
// the new share when the free room is short of it; a database removed
// leaves its room free until the list has been still for three refreshes,
// so that a database that flaps out and back in changes no pool.
func TestPlanPools(t *testing.T) {
	t.Parallel()
	o := &options{DBMaxConns: 10, CleanupInterval: time.Hour}
	o.Targets.ConnBudget, o.Targets.Refresh = 16, time.Second
	fr := &fleetRun{a: &app{opts: o}, budget: newConnBudget(o), dbs: map[string]*fleetDB{}}
	open := func(url string) {
		n, err := fr.budget.take(fr.share)
		require.NoError(t, err)
		fr.dbs[url] = &fleetDB{url: url, conns: n}
	}
	replaced := func(sizes map[string]int) { // what replacePools does to the budget
		for url, n := range sizes {
			if db := fr.dbs[url]; n < db.conns {
				fr.budget.shrunk(db.conns, n)
			}
			fr.dbs[url].conns = n
		}
	}
	closed := func(url string) {
		fr.budget.give(fr.dbs[url].conns)
		delete(fr.dbs, url)
	}
	a, b := map[string]bool{"a": true}, map[string]bool{"a": true, "b": true}
	now := time.Now()
	require.Empty(t, fr.planPools(a, now))
	open("a")
	require.Equal(t, 10, fr.dbs["a"].conns, "(16 - 1 check - 3 cleanup) / 1 - 1 LISTEN, at most --db-max-conns")
	require.Equal(t, 15, fr.budget.planned())

	sizes := fr.planPools(b, now.Add(time.Second))
	require.Equal(t, map[string]int{"a": 5}, sizes, "b is added: a shrinks to the share")
	replaced(sizes)
	open("b")
	require.Equal(t, 5, fr.dbs["b"].conns)
	require.Equal(t, 16, fr.budget.planned())

	closed("b")
	require.Empty(t, fr.planPools(a, now.Add(2*time.Second)), "not yet three refreshes")
	require.Empty(t, fr.planPools(b, now.Add(3*time.Second)), "b back: its room is free")
	open("b")
	require.Equal(t, 5, fr.dbs["b"].conns)

	closed("b")
	require.Empty(t, fr.planPools(a, now.Add(4*time.Second)))
	require.False(t, fr.growDue())
	sizes = fr.planPools(a, now.Add(7*time.Second))
	require.Equal(t, map[string]int{"a": 10}, sizes, "the list still: a grows back")
	require.Equal(t, 15, fr.budget.planned(), "reserved before the pool is replaced")
	replaced(sizes)
	require.Empty(t, fr.planPools(a, now.Add(8*time.Second)))

	// More databases: every pool at the share, (16 - 4) / 3 - 1 = 3, then
	// (16 - 4) / 4 - 1 = 2; a fifth finds no room even at the smallest
	// pool, and take refuses it naming the setting.
	sizes = fr.planPools(b, now.Add(9*time.Second))
	replaced(sizes)
	open("b")
	require.Equal(t, map[string]int{"a": 5}, sizes)
	listed := maps.Clone(b)
	for i, name := range []string{"c", "d"} {
		listed[name] = true
		sizes = fr.planPools(listed, now.Add(time.Duration(10+i)*time.Second))
		require.Len(t, sizes, 2+i, "every pool shrinks to the share")
		replaced(sizes)
		open(name)
		for url, db := range fr.dbs {
			require.Equal(t, 3-i, db.conns, url)
		}
		require.Equal(t, 16, fr.budget.planned())
	}
	listed["e"] = true
	require.Empty(t, fr.planPools(listed, now.Add(12*time.Second)), "nothing left to shrink")
	_, err := fr.budget.take(fr.share)
	require.ErrorContains(t, err, "no room left in PGBOX_DB_CONN_BUDGET (--db-conn-budget) 16 for this database")

	// Of equal pools, the one with the fewer targets to hand over shrinks
	// when one is enough: 33 - 4 - 2 × 11 leaves 7, c needs 8 + 1.
	o.Targets.ConnBudget = 33
	fr = &fleetRun{a: &app{opts: o}, budget: newConnBudget(o), dbs: map[string]*fleetDB{}, share: 10,
		served: map[string]servedTarget{"t1": {spec: targetSpec{DatabaseURL: "a"}}, "t2": {spec: targetSpec{DatabaseURL: "a"}}, "t3": {spec: targetSpec{DatabaseURL: "b"}}}}
	open("a")
	open("b")
	require.Equal(t, map[string]int{"b": 8}, fr.planPools(map[string]bool{"a": true, "b": true, "c": true}, now))
}

// /readyz with a target list: ready when Kafka answers and a target holds
// lanes, or when the list is empty; not while every target is refused.
func TestRunTargetsReadiness(t *testing.T) {
	t.Parallel()
	behind := testdb.Empty(t)
	c := kafkatest.New(t)
	file := writeFile(t, "targets.txt", "# no tenants yet\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	base := "http://" + p.HTTPAddr(t)
	code, body := httpGet(t, base+"/readyz")
	require.Equal(t, 200, code, "an empty list: nothing to serve, ready: %s", body)
	require.Contains(t, body, `"kafka":"ok"`)

	rewrite(t, file, "behind "+behind.Schema+"\n")
	waitFor(t, "the refused target", 15*time.Second, func() bool { return strings.Contains(p.Output(), "target refused") })
	code, body = httpGet(t, base+"/readyz")
	require.Equal(t, 503, code, "no target served: %s", body)
	require.Contains(t, body, `"serving":0`)
	require.Contains(t, body, `"refused":1`)
	require.Contains(t, body, "relay migrate up")

	migrateEmpty(t, behind)
	waitFor(t, "ready once migrated", 30*time.Second, func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
	_, body = httpGet(t, base+"/readyz")
	require.Contains(t, body, `"serving":1`)
	require.NotContains(t, body, "problems")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// migrateEmpty applies pgbox's migrations to db's (empty) schema.
func migrateEmpty(t *testing.T, db *testdb.DB) {
	t.Helper()
	require.NoError(t, migrations.Up(context.Background(), db.SQL(t)))
}

// --targets-query: the targets come from the control database, whose
// connection the budget counts.
func TestRunTargetsQuery(t *testing.T) {
	t.Parallel()
	acme := testdb.New(t)
	control := controlTable(t, fmt.Sprintf(`('acme', '%s', NULL)`, acme.Schema))
	c := kafkatest.New(t, kfake.SeedTopics(1, "t-acme"))
	writeRows(t, acme, "t-acme", 0, 10)
	p := startRelay(t, fleetEnv(t, c, "PGBOX_CONTROL_URL="+control.URL, "PGBOX_TARGETS_QUERY=SELECT name, schema, database_url FROM tenants WHERE active"), "run")
	p.HTTPAddr(t)
	require.Len(t, eventIDs(t, c, "t-acme", 10), 10)
	waitFor(t, "the checked line", 10*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	require.Contains(t, p.Output(), "databases=1 db_conn_budget=20 ")
	// 2 (the check, the control database) + 3 (a cleanup pass) + 10 (--db-max-conns) + 1 LISTEN.
	require.Contains(t, p.Output(), "databases=1 db_conns_planned=16 ")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// --dormant-after: a served target idle that long gives its lanes up
// (its instance row stays, dormant); 0 keeps them.
func checkDormantAfter(t *testing.T, set setFn) {
	c := kafkatest.New(t)
	db := testdb.New(t)
	file := writeFile(t, "targets.txt", "a "+db.Schema+"\n")
	held := func() (lanes int, dormant bool) {
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL AND expires_at > now())::int,
			EXISTS (SELECT 1 FROM pgbox_relay_instances WHERE sleeping AND NOT kafka_ready AND expires_at > now())`).Scan(&lanes, &dormant))
		return lanes, dormant
	}
	a, e := with(set, "500ms", fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	p := startRelay(t, e, a...)
	waitFor(t, "lanes taken, then given up", 20*time.Second, func() bool {
		lanes, dormant := held()
		return lanes == 0 && dormant
	})
	require.Equal(t, 0, p.stop(t), p.Output())

	a, e = with(set, "0", fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	p = startRelay(t, e, a...)
	waitFor(t, "lanes taken", 20*time.Second, func() bool { lanes, _ := held(); return lanes == 4 })
	time.Sleep(2 * time.Second) // well past a sleep (2 s without rows) and four 500 ms dormancies
	lanes, dormant := held()
	require.Equal(t, 4, lanes, p.Output())
	require.False(t, dormant)
	require.Equal(t, 0, p.stop(t), p.Output())
}

// --watch-rate: at 1 a second, the one busy target's rows, committed every
// 50 ms without a notification, are found by a watch a second (a few
// batches, rows sharing a record timestamp); at 5,000, every 2 ms (about
// a batch a row).
func checkWatchRate(t *testing.T, set setFn) {
	c := kafkatest.New(t)
	db := testdb.New(t)
	file := writeFile(t, "targets.txt", "a "+db.Schema+"\n")
	batches := func(rate string) int {
		topic := "w" + rate
		kafkatest.CreateTopic(t, c.ListenAddrs(), topic, 1, nil)
		// The every-slot probe (PollInterval) finds the first row, then
		// only the watch finds rows while they come.
		a, e := with(set, rate, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_POLL_INTERVAL=5s"), "run")
		p := startRelay(t, e, a...)
		writeRows(t, db, topic, 0, 1)
		require.Len(t, eventIDs(t, c, topic, 1), 1, p.Output())
		for i := 1; i <= 60; i++ {
			time.Sleep(50 * time.Millisecond)
			writeRows(t, db, topic, i, 1)
		}
		recs := kafkatest.ReadAll(t, c.ListenAddrs(), topic, 61, 60*time.Second)
		require.Len(t, recs, 61, p.Output())
		require.Equal(t, 0, p.stop(t), p.Output())
		at := map[int64]bool{}
		for _, r := range recs[1:] {
			at[r.Timestamp.UnixMilli()] = true
		}
		return len(at)
	}
	slow, fast := batches("1"), batches("5000")
	t.Logf("record batches for 60 rows: %d at 1 watch a second, %d at 5,000", slow, fast)
	require.LessOrEqual(t, slow, 12, "60 rows over 3 s, watched once a second")
	require.GreaterOrEqual(t, fast, 30, "60 rows over 3 s, watched every 2 ms")
}

// After a restart the targets whose outbox holds rows are checked (and
// started) first, the most first, then the others by database in the
// list's order; a target already checked is not checked again. The rows
// come from the statistics, so the test waits for them to show.
func TestCheckOrderRowsFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b, c, d, e := testdb.New(t), testdb.New(t), testdb.New(t), testdb.New(t), testdb.New(t)
	for db, n := range map[*testdb.DB]int{b: 3, d: 9, e: 20} {
		writeRows(t, db, "t", 0, n)
	}
	const url = "postgres://one-database"
	spec := func(name string, db *testdb.DB) targetSpec {
		return targetSpec{Name: name, DatabaseURL: url, Schema: db.Schema}
	}
	sa, sb, sc, sd, se := spec("a", a), spec("b", b), spec("c", c), spec("d", d), spec("e", e)
	other := targetSpec{Name: "x", DatabaseURL: "postgres://another", Schema: c.Schema}
	fr := &fleetRun{dbs: map[string]*fleetDB{url: {url: url, pool: a.Pool}, other.DatabaseURL: {url: other.DatabaseURL, pool: a.Pool}},
		served: map[string]servedTarget{"e": {spec: se, verified: true}}}
	var todo []targetSpec
	var rows map[targetSpec]int64
	waitFor(t, "the statistics show the rows", 30*time.Second, func() bool {
		todo, rows = fr.checkOrder(ctx, []targetSpec{sa, other, sb, sc, sd, se})
		return rows[sb] == 3 && rows[sd] == 9
	})
	require.Equal(t, []targetSpec{sd, sb, sa, sc, other}, todo)
	require.NotContains(t, rows, sa)
	require.NotContains(t, rows, se, "a checked target is not asked about")
}

// SIGHUP re-reads the target list at once: a tenant added to the file is
// served (its rows published) long before the next --targets-refresh, and
// the process keeps running.
func TestRunTargetsSIGHUP(t *testing.T) {
	t.Parallel()
	acme, globex := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-acme", "t-globex"))
	writeRows(t, globex, "t-globex", 0, 5)
	file := writeFile(t, "targets.txt", "acme "+acme.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_TARGETS_REFRESH=1h"), "run")
	waitFor(t, "acme checked", 15*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked" served=1`) })
	require.NoError(t, os.WriteFile(file, []byte("acme "+acme.Schema+"\nglobex "+globex.Schema+"\n"), 0o644))
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	require.Len(t, eventIDs(t, c, "t-globex", 5), 5)
	require.Contains(t, p.Output(), `msg="SIGHUP: re-reading the target list"`)
	require.Regexp(t, `msg="target list changed"[^\n]*added=\[globex\]`, p.Output())
	require.Equal(t, 0, p.stop(t), p.Output())
}
