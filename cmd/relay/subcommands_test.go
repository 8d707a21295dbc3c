package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

func tableExists(t *testing.T, db *testdb.DB, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM information_schema.tables WHERE table_schema = $1 AND table_name = $2)`, db.Schema, name).Scan(&ok))
	return ok
}

func TestMigrateUpStatusDown(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	// The server URL plus --schema, as an operator would pass it.
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t), "PGBOX_SCHEMA=" + db.Schema}

	r := runRelay(t, time.Minute, env, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "pending")
	require.NotContains(t, r.Stdout, "applied")
	require.False(t, tableExists(t, db, "pgbox_migrations"), "status on an unmigrated database creates nothing")

	r = runRelay(t, time.Minute, env, "migrate", "up")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "version "+schemaVersion())
	for _, tbl := range []string{"pgbox_inbox", "pgbox_outbox", "pgbox_relay_lanes"} {
		require.True(t, tableExists(t, db, tbl), tbl)
	}

	r = runRelay(t, time.Minute, env, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, "pending")
	require.Contains(t, r.Stdout, "00001_inbox.sql")

	r = runRelay(t, time.Minute, env, "migrate", "up")
	require.Equal(t, 0, r.Code, "up twice is a no-op: %s", r.Stderr)

	// down rolls back one version per run.
	r = runRelay(t, time.Minute, env, "migrate", "down")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "rolled back "+newestMigration(t))
	require.True(t, tableExists(t, db, "pgbox_inbox"))
	r = runRelay(t, time.Minute, env, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	v := migrationVersions(t)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+pending`, v[len(v)-1]), r.Stdout)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+applied`, v[len(v)-2]), r.Stdout)

	for tableExists(t, db, "pgbox_inbox") {
		r = runRelay(t, time.Minute, env, "migrate", "down")
		require.Equal(t, 0, r.Code, r.Stderr)
	}
	require.False(t, tableExists(t, db, "pgbox_outbox"))
	r = runRelay(t, time.Minute, env, "migrate", "down")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "nothing to roll back")

	r = runRelay(t, time.Minute, env, "migrate", "up")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.True(t, tableExists(t, db, "pgbox_outbox"))
}

func TestStatusWithoutSchemaSaysMigrate(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	r := runRelay(t, time.Minute, []string{"DATABASE_URL=" + db.URL}, "status")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "relay migrate up")
}

// seedInbox adds keys for topic "orders" received age ago.
func seedInbox(t *testing.T, db *testdb.DB, consumer, topic string, ages ...time.Duration) {
	t.Helper()
	for i, age := range ages {
		// Positions unknown (as before migration 00070): the time rule decides.
		_, err := db.Pool.Exec(context.Background(), `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
			VALUES ($1, $2, $3, 0, $4, now() - $5::interval, NULL)`, consumer, topic+"-"+age.String()+"-"+strconv.Itoa(i), topic, i, age.String())
		require.NoError(t, err)
	}
}

func inboxKeys(t *testing.T, db *testdb.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_inbox`).Scan(&n))
	return n
}

func TestCleanupAndStatusCommands(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := kafkatest.New(t)
	hour, tenMin := "3600000", "600000"
	kafkatest.CreateTopic(t, c.ListenAddrs(), "orders", 1, map[string]*string{"retention.ms": &hour, "segment.ms": &tenMin})
	forever := "-1"
	kafkatest.CreateTopic(t, c.ListenAddrs(), "ledger", 1, map[string]*string{"retention.ms": &forever})
	// Window for orders: 1h retention + 10m segment + 1h buffer = 2h10m.
	seedInbox(t, db, "payments-svc", "orders", 3*time.Hour, 4*time.Hour, time.Hour)
	seedInbox(t, db, "payments-svc", "ledger", 100*time.Hour)
	writeRows(t, db, "payments", 0, 3)

	env := []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ","), "PGBOX_CLEANUP_BUFFER=1h"}

	// status: the overdue keys show a negative margin against the cutoff.
	r := runRelay(t, time.Minute, env, "status", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st inspect.Snapshot
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st), r.Stdout)
	require.EqualValues(t, 3, st.Outbox.Unpublished)
	require.NotNil(t, st.Outbox.OldestAge)
	require.Len(t, st.Inbox, 2)
	byTopic := map[string]inspect.InboxTopic{}
	for _, in := range st.Inbox {
		byTopic[in.Topic] = in
	}
	orders := byTopic["orders"]
	require.EqualValues(t, 3, orders.Keys)
	require.NotNil(t, orders.Window)
	require.InDelta(t, (2*time.Hour + 10*time.Minute).Seconds(), *orders.Window, 1)
	require.Less(t, *orders.Margin, 0.0, "the 4h-old key is past the 2h10m window")
	require.Contains(t, byTopic["ledger"].Note, string(cleanup.ReasonInfiniteRetention))

	r = runRelay(t, time.Minute, env, "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	for _, want := range []string{"OUTBOX: 3 unpublished, 0 parked", "payments", "INBOX", "orders", "2h10m", "never pruned by time: " + string(cleanup.ReasonInfiniteRetention)} {
		require.Contains(t, r.Stdout, want)
	}

	// A dry run counts and deletes nothing.
	r = runRelay(t, time.Minute, env, "cleanup", "--dry-run")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "WOULD DELETE (DRY RUN)")
	require.Equal(t, 4, inboxKeys(t, db))

	r = runRelay(t, time.Minute, env, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "2 rows deleted")
	require.Contains(t, r.Stdout, "never pruned by time: "+string(cleanup.ReasonInfiniteRetention))
	require.Equal(t, 2, inboxKeys(t, db), "the 1h-old orders key and the ledger key stay")

	// Kafka unreachable: nothing is deleted, the reason is printed, exit 0.
	seedInbox(t, db, "payments-svc", "orders", 10*time.Hour)
	down := []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=127.0.0.1:1", "PGBOX_KAFKA_TIMEOUT=500ms"}
	r = runRelay(t, time.Minute, down, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, string(cleanup.ReasonKafkaUnreachable))
	require.Equal(t, 3, inboxKeys(t, db))
}
