package main

// Hostile review of c024f14 (the Fleet starts before the first round of
// target checks, rows-first order, one check connection per database,
// schema-qualified checks) and feacc78 (SIGHUP re-reads the target list).
// Real processes, a real PostgreSQL and kfake; no mocks.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// quotedDB is a testdb.DB over schema (any name: the search_path is the
// quoted identifier) of the database dbURL.
func quotedDB(t *testing.T, dbURL, schema string) *testdb.DB {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testdb.DB{Pool: pool, Schema: schema}
}

// headQuoted creates schema (quoted) in dbURL's database at this binary's
// newest migration.
func headQuoted(t *testing.T, dbURL, schema string) *testdb.DB {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	p, err := migrations.NewProvider(db, migrations.Config{LockID: targetLockID(schema)})
	require.NoError(t, err)
	_, err = p.Up(ctx)
	require.NoError(t, err)
	return quotedDB(t, dbURL, schema)
}

// dropNewestVersion makes db's schema one migration behind the binary (its
// tables unchanged): the newest version's row is deleted from goose's table.
func dropNewestVersion(t *testing.T, db *testdb.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(),
		`DELETE FROM `+pgx.Identifier{db.Schema, migrations.TableName}.Sanitize()+` WHERE version_id = (SELECT max(version_id) FROM `+pgx.Identifier{db.Schema, migrations.TableName}.Sanitize()+`)`)
	require.NoError(t, err)
}

// waitStats waits until pg_stat_user_tables shows at least n rows in db's
// outbox (checkOrder reads only the statistics).
func waitStats(t *testing.T, db *testdb.DB, n int64) {
	t.Helper()
	waitFor(t, "statistics of "+db.Schema, 30*time.Second, func() bool {
		var got int64
		err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(n_live_tup), 0)::int8 FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'pgbox_outbox'`, db.Schema).Scan(&got)
		return err == nil && got >= n
	})
}

// exactlyOnce reads want records of topic and requires want distinct event
// ids, each seen once.
func exactlyOnce(t *testing.T, c *kfake.Cluster, topic string, want int) {
	t.Helper()
	ids := eventIDs(t, c, topic, want)
	dups := 0
	for _, n := range ids {
		if n > 1 {
			dups++
		}
	}
	require.Len(t, ids, want, "%s: %d distinct of %d read (%d ids more than once)", topic, len(ids), want, dups)
	require.Zero(t, dups, topic)
}

// Attack: a schema BEHIND the binary's migrations whose outbox holds the
// most rows is checked first (checkOrder) while the Fleet already runs: it
// must be refused, never given to the Fleet, its rows left unpublished.
func TestAttackBehindWithRowsRefused(t *testing.T) {
	t.Parallel()
	good, behind := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-good", "t-behind"))
	writeRows(t, behind, "t-behind", 0, 50)
	writeRows(t, good, "t-good", 0, 5)
	dropNewestVersion(t, behind)
	waitStats(t, behind, 50)
	waitStats(t, good, 5)
	file := writeFile(t, "targets.txt", "good "+good.Schema+"\nbehind "+behind.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	exactlyOnce(t, c, "t-good", 5)
	waitFor(t, "the checked line", 15*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	require.Regexp(t, `msg="targets checked" served=1 refused=1 `, p.Output())
	require.Regexp(t, `level=ERROR msg="target refused[^\n]*target=behind[^\n]*relay migrate up`, p.Output())
	time.Sleep(1500 * time.Millisecond) // a refresh
	require.Equal(t, 50, outboxCount(t, behind), "the behind target's rows were published")
	require.NotRegexp(t, `target accepted[^\n]*target=behind`, p.Output())
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack: schema names that need quoting (a dot, a single quote, a
// reserved word, non-ASCII with a hyphen) and the same schema name in two
// databases, with different rows: every one checked, served, its rows
// published exactly once. (checkTargetSchema refuses upper case, spaces,
// commas and double quotes in a target list; those are attacked on
// migrations.CheckSchema in migrations/checkschemaattack_test.go.)
func TestAttackQuotedSchemaNames(t *testing.T) {
	t.Parallel()
	_, urlA := testdb.CreateDatabase(t, "t_qa_")
	_, urlB := testdb.CreateDatabase(t, "t_qb_")
	type tgt struct {
		name, schema, url string
		rows              int
		db                *testdb.DB
	}
	ts := []*tgt{
		{name: "dot", schema: "a.b", url: urlA, rows: 7},
		{name: "quote", schema: "o'neil", url: urlA, rows: 3},
		{name: "reserved", schema: "select", url: urlA, rows: 11},
		{name: "utf", schema: "ü-x", url: urlA, rows: 2},
		{name: "same", schema: "select", url: urlB, rows: 13},
	}
	var topics []string
	var lines strings.Builder
	for _, x := range ts {
		x.db = headQuoted(t, x.url, x.schema)
		topics = append(topics, "t-"+x.name)
		fmt.Fprintf(&lines, "%s %s %s\n", x.name, x.schema, x.url)
	}
	c := kafkatest.New(t, kfake.SeedTopics(2, topics...))
	for _, x := range ts {
		writeRows(t, x.db, "t-"+x.name, 0, x.rows)
	}
	file := writeFile(t, "targets.txt", lines.String())
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	for _, x := range ts {
		exactlyOnce(t, c, "t-"+x.name, x.rows)
		waitFor(t, x.name+" drained", 20*time.Second, func() bool { return outboxCount(t, x.db) == 0 })
	}
	waitFor(t, "the checked line", 15*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	require.Regexp(t, `msg="targets checked" served=5 refused=0 `, p.Output())
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack: the database's default search_path (ALTER DATABASE … SET, and a
// URL search_path for another target) names a decoy schema with complete,
// current pgbox tables, while the listed schemas are behind, missing a
// table, or missing altogether: each must be judged on its own schema and
// refused; only the good one served.
func TestAttackDecoySearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name, dbURL := testdb.CreateDatabase(t, "t_decoy_")
	headQuoted(t, dbURL, "decoy")
	good, behind, partial := headQuoted(t, dbURL, "good"), headQuoted(t, dbURL, "behind"), headQuoted(t, dbURL, "partial")
	dropNewestVersion(t, behind)
	_, err := partial.Pool.Exec(ctx, `DROP TABLE partial.pgbox_inbox CASCADE`)
	require.NoError(t, err)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET search_path = decoy`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	viaURL, err := testdb.WithSearchPath(dbURL, "decoy")
	require.NoError(t, err)

	c := kafkatest.New(t, kfake.SeedTopics(2, "t-good", "t-behind", "t-partial"))
	writeRows(t, good, "t-good", 0, 4)
	writeRows(t, behind, "t-behind", 0, 9)
	file := writeFile(t, "targets.txt", fmt.Sprintf("good good %s\nbehind behind %s\npartial partial %s\nmissing nosuchschema %s\n", dbURL, dbURL, viaURL, dbURL))
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	exactlyOnce(t, c, "t-good", 4)
	waitFor(t, "the checked line", 15*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	out := p.Output()
	require.Regexp(t, `msg="targets checked" served=1 refused=3 `, out)
	require.Regexp(t, `msg="target refused[^\n]*target=behind[^\n]*relay migrate up`, out)
	require.Regexp(t, `msg="target refused[^\n]*target=partial[^\n]*pgbox_inbox`, out)
	require.Regexp(t, `msg="target refused[^\n]*target=missing[^\n]*does not exist`, out)
	time.Sleep(1500 * time.Millisecond)
	require.Equal(t, 9, outboxCount(t, behind))
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack: the relay's role lost its grant on one pgbox table of the listed
// schema: the check refuses that target with the privilege error; the
// other, fully granted, is served.
func TestAttackRevokedGrant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := testdb.ServerURL(t)
	role := fmt.Sprintf("t_attack_role_%d", time.Now().UnixNano()%1e9)
	admin, err := pgx.Connect(ctx, server)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	t.Cleanup(func() { // after the database is dropped (cleanups run last first)
		a, err := pgx.Connect(context.Background(), server)
		if err == nil {
			_, _ = a.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
			_ = a.Close(context.Background())
		}
	})
	_, dbURL := testdb.CreateDatabase(t, "t_grant_")
	granted, revoked := headQuoted(t, dbURL, "granted"), headQuoted(t, dbURL, "revoked")
	for _, s := range []string{"granted", "revoked"} {
		for _, q := range []string{
			`GRANT USAGE ON SCHEMA ` + s + ` TO ` + role,
			`GRANT ALL ON ALL TABLES IN SCHEMA ` + s + ` TO ` + role,
			`GRANT ALL ON ALL SEQUENCES IN SCHEMA ` + s + ` TO ` + role,
			`GRANT ALL ON ALL FUNCTIONS IN SCHEMA ` + s + ` TO ` + role,
		} {
			_, err := granted.Pool.Exec(ctx, q)
			require.NoError(t, err, q)
		}
	}
	_, err = granted.Pool.Exec(ctx, `REVOKE ALL ON revoked.pgbox_relay_lanes FROM `+role)
	require.NoError(t, err)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-granted", "t-revoked"))
	writeRows(t, granted, "t-granted", 0, 6)
	writeRows(t, revoked, "t-revoked", 0, 8) // the most rows: checked first
	waitStats(t, revoked, 8)
	u, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	roleURL := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", role, u.Host, u.Port, u.Database)
	file := writeFile(t, "targets.txt", fmt.Sprintf("granted granted %s\nrevoked revoked %s\n", roleURL, roleURL))
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	exactlyOnce(t, c, "t-granted", 6)
	waitFor(t, "the checked line", 15*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	require.Regexp(t, `msg="targets checked" served=1 refused=1 `, p.Output())
	require.Regexp(t, `msg="target refused[^\n]*target=revoked[^\n]*permission denied[^\n]*pgbox_relay_lanes`, p.Output())
	require.Equal(t, 8, outboxCount(t, revoked))
	require.Equal(t, 0, p.stop(t), p.Output())
}

// hungServer accepts TCP connections and never answers: a database that
// is up at the network level but does not respond.
func hungServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// Attack: databases of the list down (connection refused) or hung (TCP
// accepted, no answer) at start, listed FIRST: the targets with rows in
// the live database start at once (the statistics' 1 s timeout is paid
// once, concurrently, not per database), the down/hung targets are served
// unchecked (the Fleet retries them), the hung database costs one check
// timeout for all its targets, and SIGTERM exits 0.
func TestAttackDownDatabasesAtStart(t *testing.T) {
	t.Parallel()
	rows, idle := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-rows", "t-idle"))
	writeRows(t, rows, "t-rows", 0, 10)
	waitStats(t, rows, 10)
	hung := hungServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refusedAddr := l.Addr().String()
	require.NoError(t, l.Close())
	hungURL := "postgres://pgbox@" + hung + "/pgbox?sslmode=disable"
	refusedURL := "postgres://pgbox@" + refusedAddr + "/pgbox?sslmode=disable"
	file := writeFile(t, "targets.txt", fmt.Sprintf("hung1 s1 %s\nhung2 s2 %s\nrefused1 s1 %s\nrefused2 s2 %s\nidle %s\nrows %s\n",
		hungURL, hungURL, refusedURL, refusedURL, idle.Schema, rows.Schema))
	began := time.Now()
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_TARGETS_REFRESH=1h"), "run")
	exactlyOnce(t, c, "t-rows", 10)
	took := time.Since(began)
	t.Logf("rows published %s after start", took)
	require.Less(t, took, 8*time.Second, "the target with rows waited for the down databases")
	waitFor(t, "the checked line", 40*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	checked := regexp.MustCompile(`msg="targets checked" served=(\d+) refused=(\d+) [^\n]*took=(\S+)`).FindStringSubmatch(p.Output())
	require.NotNil(t, checked, p.Output())
	t.Logf("targets checked: served=%s refused=%s took=%s", checked[1], checked[2], checked[3])
	require.Equal(t, "6", checked[1], p.Output())
	d, err := time.ParseDuration(checked[3])
	require.NoError(t, err)
	require.Less(t, d, 25*time.Second, "more than one check timeout for the hung database")
	// Each down target is logged (served unchecked); hung2 reuses hung1's
	// answer (down[url]): one check timeout for the database, not two.
	require.Regexp(t, `did not answer its check[^\n]*target=hung2[^\n]*err="target \\"hung1\\"`, p.Output())
	stopAt := time.Now()
	require.Equal(t, 0, p.stop(t), p.Output())
	require.Less(t, time.Since(stopAt), 12*time.Second)
}

// holdLock takes lock on table in a transaction of its own, held until
// the test ends.
func holdLock(t *testing.T, db *testdb.DB, table string) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{db.Schema, table}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = tx.Rollback(context.Background())
		conn.Release()
	})
}

// Attack: SIGTERM while the first round of checks is blocked (a check
// waits on a lock held on one target's table): the process exits 0 well
// within the shutdown timeout, the target with rows published exactly
// once, the blocked target never served nor logged, and no "targets
// checked" line for a round that did not finish.
func TestAttackSIGTERMDuringFirstRound(t *testing.T) {
	t.Parallel()
	rows, locked := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-rows"))
	writeRows(t, rows, "t-rows", 0, 20)
	waitStats(t, rows, 20)
	holdLock(t, locked, "pgbox_inbox")
	file := writeFile(t, "targets.txt", "locked "+locked.Schema+"\nrows "+rows.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_SHUTDOWN_TIMEOUT=10s"), "run")
	exactlyOnce(t, c, "t-rows", 20)
	time.Sleep(500 * time.Millisecond) // the locked check is under way
	require.NotContains(t, p.Output(), `msg="targets checked"`)
	stopAt := time.Now()
	require.Equal(t, 0, p.stop(t), p.Output())
	require.Less(t, time.Since(stopAt), 5*time.Second)
	require.NotContains(t, p.Output(), `msg="targets checked"`)
	require.NotContains(t, p.Output(), `target=locked`)
	lanes, _ := lanesHeld(t, rows)
	require.Zero(t, lanes, "lanes left held")
}

// Attack (a defect the review found, older than c024f14, made likelier by
// the rows-first order; fixed): a check that timed out on a lock (one
// tenant's table locked by a long migration or a manual LOCK) was a
// retryable error, so reconcile marked the whole DATABASE down and every
// later target of that database was served UNCHECKED, a schema behind the
// binary's migrations included. Now the check connection has a
// lock_timeout (checkLockTimeout) and a lock timeout refuses that target
// alone.
func TestAttackLockedCheckServesBehindUnchecked(t *testing.T) {
	t.Parallel()
	locked, behind := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-locked", "t-behind"))
	writeRows(t, locked, "t-locked", 0, 30)
	writeRows(t, behind, "t-behind", 0, 10)
	dropNewestVersion(t, behind)
	waitStats(t, locked, 30)
	waitStats(t, behind, 10)
	holdLock(t, locked, "pgbox_inbox")
	file := writeFile(t, "targets.txt", "locked "+locked.Schema+"\nbehind "+behind.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_TARGETS_REFRESH=1h"), "run")
	waitFor(t, "the checked line", 30*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	time.Sleep(time.Second)
	out := p.Output()
	require.NotRegexp(t, `did not answer its check[^\n]*target=behind`, out, "a behind schema served unchecked because another schema's table was locked")
	require.Regexp(t, `msg="target refused[^\n]*target=behind`, out)
	require.Equal(t, 10, outboxCount(t, behind))
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack (a defect the review found, fixed: main registers SIGHUP for the
// whole process): SIGHUP while a --targets-query (slow) is read at start,
// before the list's watch began, killed the process with Go's default
// action. A provisioning job that sends SIGHUP after adding a tenant must
// not kill a relay that is starting.
func TestAttackSIGHUPDuringStart(t *testing.T) {
	t.Parallel()
	acme := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-acme"))
	writeRows(t, acme, "t-acme", 0, 3)
	query := fmt.Sprintf(`SELECT 'acme' AS name, '%s' AS schema FROM pg_sleep(3)`, acme.Schema)
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS_QUERY="+query), "run")
	time.Sleep(time.Second)
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	select {
	case <-p.Done():
		t.Fatalf("SIGHUP killed the starting relay (%v)\n%s", p.Cmd.ProcessState, p.Output())
	case <-time.After(4 * time.Second):
	}
	exactlyOnce(t, c, "t-acme", 3)
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack (a defect the review found, fixed as above): SIGHUP while the
// relay shuts down (after SIGTERM): the list's watch had returned and
// stopped its signal, so SIGHUP was back to Go's default and killed the
// process mid-shutdown (exit by signal, no "relay stopped"). The process
// must still exit 0.
func TestAttackSIGHUPDuringShutdown(t *testing.T) {
	t.Parallel()
	acme := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-acme"))
	writeRows(t, acme, "t-acme", 0, 3)
	file := writeFile(t, "targets.txt", "acme "+acme.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	exactlyOnce(t, c, "t-acme", 3)
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGTERM))
	// SIGHUPs every 2 ms until it exits: one lands after signal.Stop.
	sent := 0
	for deadline := time.Now().Add(time.Minute); ; sent++ {
		select {
		case <-p.Done():
		case <-time.After(2 * time.Millisecond):
			require.True(t, time.Now().Before(deadline), "no exit")
			_ = p.Cmd.Process.Signal(syscall.SIGHUP)
			continue
		}
		break
	}
	t.Logf("%d SIGHUPs sent during the shutdown", sent)
	require.Equal(t, 0, p.Cmd.ProcessState.ExitCode(), "%v\n%s", p.Cmd.ProcessState, p.Output())
}

// replaceFile writes text to path by a temporary file and a rename.
func replaceFile(t *testing.T, path, text string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	require.NoError(t, os.WriteFile(tmp, []byte(text), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// Attack: a SIGHUP storm (rename) that removes and re-adds a target in the
// middle of its drain, while rows are written: every row published exactly
// once, nothing lost, the removed target's lanes given up, the process
// alive and exiting 0.
func TestAttackSIGHUPStormMidDrain(t *testing.T) {
	t.Parallel()
	big, small := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(4, "t-big", "t-small"))
	const first = 3000
	writeRows(t, big, "t-big", 0, first)
	with := "big " + big.Schema + "\nsmall " + small.Schema + "\n"
	without := "small " + small.Schema + "\n"
	file := writeFile(t, "targets.txt", with)
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_TARGETS_REFRESH=1h", "PGBOX_BATCH_SIZE=50"), "run")
	waitFor(t, "big draining", 20*time.Second, func() bool { n := outboxCount(t, big); return n < first && n > 0 })
	total := first
	for i := range 40 {
		if i%2 == 0 {
			replaceFile(t, file, without)
		} else {
			replaceFile(t, file, with)
		}
		require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
		writeRows(t, big, "t-big", total, 10)
		writeRows(t, small, "t-small", i*5, 5)
		total += 10
		time.Sleep(time.Duration(10+i%4*20) * time.Millisecond)
	}
	// Removed for good: drained part way, then released.
	replaceFile(t, file, without)
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	waitFor(t, "big released", 10*time.Second, func() bool {
		l, _ := lanesHeld(t, big)
		return l == 0 && strings.Count(p.Output(), "target list changed") >= 2
	})
	time.Sleep(2 * time.Second) // settle: the last SIGHUP's list applied
	l, _ := lanesHeld(t, big)
	require.Zero(t, l)
	left := outboxCount(t, big)
	t.Logf("big: %d of %d rows left while removed", left, total)
	replaceFile(t, file, with)
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	exactlyOnce(t, c, "t-big", total)
	exactlyOnce(t, c, "t-small", 40*5)
	waitFor(t, "big drained", 20*time.Second, func() bool { return outboxCount(t, big) == 0 })
	select {
	case <-p.Done():
		t.Fatalf("the relay died\n%s", p.Output())
	default:
	}
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack: the list file rewritten IN PLACE (truncate, then write) with a
// SIGHUP between the two: the relay reads an empty list, a successful read
// of no targets, and stops every target (documented here); when the file is
// written and re-read the targets come back and no row is lost or sent
// twice.
func TestAttackSIGHUPInPlaceTruncate(t *testing.T) {
	t.Parallel()
	acme := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-acme"))
	text := "acme " + acme.Schema + "\n"
	file := writeFile(t, "targets.txt", text)
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_TARGETS_REFRESH=1h"), "run")
	waitFor(t, "acme checked", 15*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked" served=1`) })
	writeRows(t, acme, "t-acme", 0, 500)
	require.NoError(t, os.Truncate(file, 0))
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	waitFor(t, "acme removed", 10*time.Second, func() bool {
		return regexp.MustCompile(`msg="target list changed"[^\n]*removed=\[acme\][^\n]*targets=0`).MatchString(p.Output())
	})
	// A half-written line: another schema (refused) for a moment.
	require.NoError(t, os.WriteFile(file, []byte(text[:len(text)-4]+"\n"), 0o600))
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	waitFor(t, "the half line read", 10*time.Second, func() bool { return strings.Count(p.Output(), `msg="target list changed"`) >= 2 })
	writeRows(t, acme, "t-acme", 500, 100)
	require.NoError(t, os.WriteFile(file, []byte(text), 0o600))
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	exactlyOnce(t, c, "t-acme", 600)
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack: SIGHUP to a single-target `relay run` (DATABASE_URL with its
// search_path, no list), as a service manager's reload sends it. The
// review found Go's default applied (the process killed mid-work); now
// SIGHUP is ignored without a list: the relay keeps publishing and stops
// gracefully on SIGTERM.
func TestAttackSIGHUPSingleTarget(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-one"))
	writeRows(t, db, "t-one", 0, 5)
	p := startRelay(t, runEnv(db, c), "run")
	exactlyOnce(t, c, "t-one", 5)
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	select {
	case <-p.Done():
		t.Fatalf("SIGHUP ended the single-target relay (%v)\n%s", p.Cmd.ProcessState, p.Output())
	case <-time.After(2 * time.Second):
	}
	writeRows(t, db, "t-one", 5, 5)
	exactlyOnce(t, c, "t-one", 10)
	require.Equal(t, 0, p.stop(t), p.Output())
	require.Contains(t, p.Output(), "relay stopped")
}

// Attack: checkOrder asks every database's statistics concurrently, each
// within rowsAsk: three hung databases cost about one second, not three,
// and their targets keep the list's order behind those with rows.
func TestAttackCheckOrderHungDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	writeRows(t, db, "t", 0, 4)
	waitStats(t, db, 4)
	fr := &fleetRun{dbs: map[string]*fleetDB{}}
	var list []targetSpec
	for i := range 3 {
		u := "postgres://pgbox@" + hungServer(t) + "/pgbox?sslmode=disable"
		cfg, err := pgxpool.ParseConfig(u)
		require.NoError(t, err)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		fr.dbs[u] = &fleetDB{url: u, pool: pool}
		list = append(list, targetSpec{Name: fmt.Sprintf("hung%d", i), DatabaseURL: u, Schema: db.Schema})
	}
	live := targetSpec{Name: "live", DatabaseURL: "postgres://live", Schema: db.Schema}
	fr.dbs[live.DatabaseURL] = &fleetDB{url: live.DatabaseURL, pool: db.Pool}
	list = append(list, live)
	began := time.Now()
	todo, rows := fr.checkOrder(ctx, list)
	took := time.Since(began)
	t.Logf("checkOrder took %s", took)
	require.Less(t, took, 2500*time.Millisecond)
	require.Equal(t, []targetSpec{live, list[0], list[1], list[2]}, todo)
	require.EqualValues(t, 4, rows[live])
}

// Attack: /readyz and /metrics scraped without pause while the first
// round checks a dozen targets and the Fleet already runs them (reconcile
// now runs beside the readers). Run with -race: the binary is built with
// -race and exits 66 on a data race.
func TestAttackScrapesDuringFirstRound(t *testing.T) {
	t.Parallel()
	const n = 12
	var lines strings.Builder
	var topics []string
	dbs := make([]*testdb.DB, n)
	for i := range n {
		dbs[i] = testdb.New(t)
		fmt.Fprintf(&lines, "t%d %s\n", i, dbs[i].Schema)
		topics = append(topics, fmt.Sprintf("t-%d", i))
	}
	c := kafkatest.New(t, kfake.SeedTopics(1, topics...))
	for i, db := range dbs {
		writeRows(t, db, topics[i], 0, i%4*5)
	}
	file := writeFile(t, "targets.txt", lines.String())
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	base := "http://" + p.HTTPAddr(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, path := range []string{"/readyz", "/metrics"} {
				if r, err := http.Get(base + path); err == nil {
					_ = r.Body.Close()
				}
			}
		}
	}()
	waitFor(t, "the checked line", 30*time.Second, func() bool { return strings.Contains(p.Output(), `msg="targets checked"`) })
	close(stop)
	<-done
	require.Regexp(t, `msg="targets checked" served=12 refused=0 `, p.Output())
	for i := range n {
		if k := i % 4 * 5; k > 0 {
			exactlyOnce(t, c, topics[i], k)
		}
	}
	require.Equal(t, 0, p.stop(t), p.Output())
	require.NotContains(t, p.Output(), "DATA RACE")
}

// Attack: SIGHUP "re-reads the list at once", but the list's watch hands
// the new list over only after the first round of checks. The review found
// a round blocked on a lock held it for dbconf.PingTimeout (15 s); with the
// check connection's lock_timeout (checkLockTimeout, 2 s) a tenant added by
// SIGHUP is served within 5 s.
func TestAttackSIGHUPDuringBlockedFirstRound(t *testing.T) {
	t.Parallel()
	acme, locked, globex := testdb.New(t), testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-globex"))
	holdLock(t, locked, "pgbox_inbox")
	writeRows(t, globex, "t-globex", 0, 5)
	file := writeFile(t, "targets.txt", "acme "+acme.Schema+"\nlocked "+locked.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_TARGETS_REFRESH=1h"), "run")
	p.HTTPAddr(t)
	time.Sleep(time.Second)
	replaceFile(t, file, "acme "+acme.Schema+"\nlocked "+locked.Schema+"\nglobex "+globex.Schema+"\n")
	sent := time.Now()
	require.NoError(t, p.Cmd.Process.Signal(syscall.SIGHUP))
	waitFor(t, "globex drained", 30*time.Second, func() bool { return outboxCount(t, globex) == 0 })
	took := time.Since(sent)
	t.Logf("globex served %s after SIGHUP", took)
	require.Less(t, took, 5*time.Second, "the tenant added by SIGHUP waited for the blocked first round")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Attack (a defect the review found, fixed in the commit after the one
// adding this test):
// when the budget has room for only some
// of the databases added to a running list, which database gets its pool
// must not be random. Before c024f14 reconcile opened the databases as it
// met their targets, in the list's order (the first listed got the room,
// every round, every restart); now checkOrder opens every database's pool
// (fr.database, which takes from the budget) while ranging over a MAP
// (`for url := range dbOrder`), so the database that is refused ("no room
// left in PGBOX_DB_CONN_BUDGET") changes from round to round.
func TestAttackCheckOrderBudgetListOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := testdb.ServerURL(t)
	var list []targetSpec
	for i := range 4 {
		list = append(list, targetSpec{Name: fmt.Sprintf("t%d", i), DatabaseURL: fmt.Sprintf("%s&application_name=attack%d", server, i), Schema: "s"})
	}
	got := map[string]int{}
	for range 20 {
		// Room for one more database only: fixed 1, one open database (2 + LISTEN).
		b := &connBudget{total: 7, fixed: 1, listen: 1, perDB: 10, used: 4}
		fr := &fleetRun{budget: b, share: 2, log: slog.New(slog.DiscardHandler), dbs: map[string]*fleetDB{}, served: map[string]servedTarget{}}
		fr.checkOrder(ctx, list)
		for url, db := range fr.dbs {
			got[url]++
			db.pool.Close()
		}
	}
	require.Equal(t, map[string]int{list[0].DatabaseURL: 20}, got, "the database given the budget's last room is not the first listed")
}

// Attack: SIGTERM while the first round's check connection is dialling a
// hung database (TCP accepted, no answer; up to dbconf.PingTimeout): the
// process exits 0 within seconds, the target with rows (checked first)
// published exactly once.
func TestAttackSIGTERMDuringHungCheck(t *testing.T) {
	t.Parallel()
	rows := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-rows"))
	writeRows(t, rows, "t-rows", 0, 10)
	waitStats(t, rows, 10)
	hungURL := "postgres://pgbox@" + hungServer(t) + "/pgbox?sslmode=disable"
	file := writeFile(t, "targets.txt", fmt.Sprintf("hung s1 %s\nrows %s\n", hungURL, rows.Schema))
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
	exactlyOnce(t, c, "t-rows", 10)
	time.Sleep(time.Second)
	require.NotContains(t, p.Output(), `msg="targets checked"`)
	stopAt := time.Now()
	require.Equal(t, 0, p.stop(t), p.Output())
	require.Less(t, time.Since(stopAt), 5*time.Second)
	require.NotContains(t, p.Output(), "target=hung")
}
