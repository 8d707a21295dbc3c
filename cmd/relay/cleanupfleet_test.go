package main

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

func init() {
	flagChecks["targets-concurrency"] = flagCheck{check: checkTargetsConcurrency, bad: "0"}
}

// ordersLogStart creates the topic "orders" (one partition), writes three
// records to it and moves its log start offset past the first two, as
// retention would.
func ordersLogStart(t *testing.T, c *kfake.Cluster) {
	t.Helper()
	kafkatest.CreateTopic(t, c.ListenAddrs(), "orders", 1, nil)
	cfg := kafkatest.Config()
	cfg.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer(c.ListenAddrs(), cfg)
	require.NoError(t, err)
	for i := range 3 {
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "orders", Key: sarama.StringEncoder(fmt.Sprint(i)), Value: sarama.StringEncoder("v")})
		require.NoError(t, err)
	}
	require.NoError(t, p.Close())
	admin, err := sarama.NewClusterAdmin(c.ListenAddrs(), kafkatest.Config())
	require.NoError(t, err)
	defer func() { _ = admin.Close() }()
	require.NoError(t, admin.DeleteRecords("orders", map[int32]int64{0: 2}))
}

// keysAt adds one "orders" inbox key per offset of partition 0, received 3h
// ago, its position known: the exact rule decides them.
func keysAt(t *testing.T, db *testdb.DB, offsets ...int64) {
	t.Helper()
	for _, o := range offsets {
		opsExec(t, db, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
			VALUES ('svc', $1, 'orders', 0, $2, now() - interval '3 hours', now() - interval '3 hours')`, fmt.Sprintf("orders/%d", o), o)
	}
}

// `relay cleanup` over a target list: a pass on each target (three schemas
// of one database, one in a database of its own), each deleting the keys
// behind Kafka's log start; a target whose lease another cleaner holds is
// skipped; one behind its migrations and one unreachable fail, are reported
// and make the run exit 1 without stopping the others.
func TestCleanupTargets(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	ordersLogStart(t, c)
	acme, globex, umbrella, hooli := testdb.New(t), testdb.New(t), testdb.New(t), testdb.Empty(t)
	_, scratch := testdb.CreateDatabase(t, "t_cleanup_")
	initech := scratchTarget(t, scratch, "s_initech")
	for _, db := range []*testdb.DB{acme, globex, umbrella, initech} {
		keysAt(t, db, 0, 1, 2)
	}
	opsExec(t, umbrella, `INSERT INTO pgbox_cleanup_lease (owner, expires_at) VALUES ('another-cleaner', now() + interval '1 hour')`)
	file := writeFile(t, "targets.txt", fmt.Sprintf("acme %s\nglobex %s\numbrella %s\nhooli %s\ninitech s_initech %s\nbroken s_x %s\n",
		acme.Schema, globex.Schema, umbrella.Schema, hooli.Schema, scratch, unreachableURL(t)))
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_TARGETS=" + file, kafkaEnv(c), "PGBOX_CLEANUP_BUFFER=1h"}

	r := runRelay(t, time.Minute, env, "cleanup", "--dry-run")
	require.Equal(t, 1, r.Code, r.Stderr)
	for _, name := range []string{"acme", "globex", "initech"} {
		require.Equal(t, "dry run: would delete 2 rows (2 inbox keys, 0 other rows)", targetRow(t, r.Stdout, name), name)
	}
	for _, db := range []*testdb.DB{acme, globex, initech} {
		require.Equal(t, 3, inboxKeys(t, db), "a dry run deletes nothing")
	}

	r = runRelay(t, time.Minute, env, "cleanup")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^NAME\s+SCHEMA\s+DATABASE\s+RESULT$`, r.Stdout)
	require.Equal(t, 7, strings.Count(r.Stdout, "\n"), "a line per target, in the list's order:\n%s", r.Stdout)
	for _, name := range []string{"acme", "globex", "initech"} {
		require.Equal(t, "deleted 2 rows (2 inbox keys, 0 other rows)", targetRow(t, r.Stdout, name), name)
	}
	require.Equal(t, "skipped: another cleaner holds this target's lease (pgbox_cleanup_lease); it prunes the target now", targetRow(t, r.Stdout, "umbrella"))
	require.Regexp(t, "^failed: .*relay migrate up", targetRow(t, r.Stdout, "hooli"))
	require.Regexp(t, `^failed: database postgres://\S+:xxxxx@\S+/t_fleet_no_such_database\S* unreachable: .*does not exist`, targetRow(t, r.Stdout, "broken"))
	require.Contains(t, r.Stderr, "relay cleanup: 2 of 6 targets failed (see the table); the others' passes ran\n")
	require.NotContains(t, r.Stdout+r.Stderr, "hunter2")
	for _, db := range []*testdb.DB{acme, globex, initech} {
		require.Equal(t, 1, inboxKeys(t, db), "the key at the log start stays")
	}
	require.Equal(t, 3, inboxKeys(t, umbrella), "the lease holder's target is left to it")
	require.Regexp(t, `msg="cleanup pass done" .*target=acme`, r.Stderr, "each pass logs its target")

	// Kafka unreachable: every target's topics are skipped this pass (one
	// connection attempt for all of them), the other tables still pruned;
	// exit 0 as for one target.
	keysAt(t, acme, 0)
	opsExec(t, acme, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		VALUES (gen_random_uuid(), 1, 'orders', 'k', 'v', 5, 'e', now() - interval '2 hours')`)
	rewrite(t, file, fmt.Sprintf("acme %s\nglobex %s\n", acme.Schema, globex.Schema))
	down := []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_TARGETS=" + file, "KAFKA_BROKERS=127.0.0.1:1", "PGBOX_KAFKA_TIMEOUT=500ms",
		"PGBOX_CLEANUP_KEEP_PARKED=1h"}
	r = runRelay(t, time.Minute, down, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	not := fmt.Sprintf("; not pruned: orders (this pass: %s)", cleanup.ReasonKafkaUnreachable)
	require.Equal(t, "deleted 1 rows (0 inbox keys, 1 other rows)"+not, targetRow(t, r.Stdout, "acme"))
	require.Equal(t, "deleted 0 rows (0 inbox keys, 0 other rows)"+not, targetRow(t, r.Stdout, "globex"))
	require.Equal(t, 2, inboxKeys(t, acme))
}

// An empty list cleans nothing and says so.
func TestCleanupTargetsEmptyList(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db", "KAFKA_BROKERS=127.0.0.1:1", "PGBOX_TARGETS=" + writeFile(t, "targets.txt", "")}
	r := runRelay(t, time.Minute, env, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "no targets: PGBOX_TARGETS (--targets) lists none\n", r.Stdout)
}

var cleanupStartedRE = regexp.MustCompile(`msg="cleanup: target started"`)

// --targets-concurrency 2: with every target's cleanup lease table locked,
// two passes start and wait; the others start as they finish.
func checkTargetsConcurrency(t *testing.T, set setFn) {
	ctx := context.Background()
	var lines []string
	lock, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for i := range 4 {
		db := testdb.New(t)
		lines = append(lines, fmt.Sprintf("t%d %s", i, db.Schema))
		_, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{db.Schema, "pgbox_cleanup_lease"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
	}
	file := writeFile(t, "targets.txt", strings.Join(lines, "\n"))
	a, e := with(set, "2", []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_TARGETS=" + file, "KAFKA_BROKERS=127.0.0.1:1"}, "cleanup")
	p := startTargetsProc(t, e, a...)
	waitFor(t, "two targets started", time.Minute, func() bool { return len(cleanupStartedRE.FindAllString(p.Output(), -1)) >= 2 })
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) { // both wait for the lock: no third starts
		require.Len(t, cleanupStartedRE.FindAllString(p.Output(), -1), 2, p.Output())
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, tx.Rollback(ctx))
	select {
	case <-p.Done():
	case <-time.After(2 * time.Minute):
		t.Fatalf("cleanup did not finish\n%s", p.Output())
	}
	require.Equal(t, 0, p.Cmd.ProcessState.ExitCode(), p.Output())
	done := regexp.MustCompile(`(?m)^t\d\s+\S+\s+\S+\s+deleted 0 rows \(0 inbox keys, 0 other rows\)$`)
	require.Len(t, done.FindAllString(p.Output(), -1), 4, p.Output())
}

// closingBroker accepts connections and closes them at once (a Kafka that
// cannot be reached, failing fast); it returns its address and how many
// connections it accepted.
func closingBroker(t *testing.T) (addr string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	return ln.Addr().String(), func() int { return int(n.Load()) }
}

// Over a target list, Kafka is dialled once for all targets: with it
// unreachable, three targets cost no more connection attempts than one
// target's pass makes, and each target's topics are "not pruned this
// pass".
func TestCleanupTargetsDialKafkaOnce(t *testing.T) {
	t.Parallel()
	dbs := []*testdb.DB{testdb.New(t), testdb.New(t), testdb.New(t)}
	var lines []string
	for i, db := range dbs {
		keysAt(t, db, 0)
		lines = append(lines, fmt.Sprintf("t%d %s", i, db.Schema))
	}
	one, oneAccepted := closingBroker(t)
	r := runRelay(t, time.Minute, []string{"DATABASE_URL=" + dbs[0].URL, "KAFKA_BROKERS=" + one}, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, string(cleanup.ReasonKafkaUnreachable))
	require.Positive(t, oneAccepted())

	all, allAccepted := closingBroker(t)
	file := writeFile(t, "targets.txt", strings.Join(lines, "\n"))
	r = runRelay(t, time.Minute, []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_TARGETS=" + file, "KAFKA_BROKERS=" + all}, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	for i := range dbs {
		require.Equal(t, fmt.Sprintf("deleted 0 rows (0 inbox keys, 0 other rows); not pruned: orders (this pass: %s)", cleanup.ReasonKafkaUnreachable),
			targetRow(t, r.Stdout, fmt.Sprintf("t%d", i)))
	}
	// One target's pass dials for each Kafka request it makes; three
	// targets together dial once.
	require.Positive(t, allAccepted())
	require.LessOrEqual(t, allAccepted(), oneAccepted(), "three targets dial no more than one target's pass")
}
