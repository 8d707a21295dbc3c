package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// TestCleanupUnmigratedSaysMigrate: on a database without pgbox's tables,
// `relay cleanup` (dry run or not) prints no report, as if a pass had run,
// before failing: one error naming `relay migrate up`, exit 1.
func TestCleanupUnmigratedSaysMigrate(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	c := kafkatest.New(t)
	env := []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ",")}
	for _, args := range [][]string{{"cleanup", "--dry-run"}, {"cleanup"}} {
		r := runRelay(t, time.Minute, env, args...)
		require.Equal(t, 1, r.Code, "%v: %s", args, r.Stderr)
		require.Empty(t, r.Stdout, "%v: no report of a pass that did not run", args)
		require.Contains(t, r.Stderr, "relay migrate up", args)
		require.Equal(t, 1, strings.Count(r.Stderr, "relay migrate up"), "%v: one error: %s", args, r.Stderr)
		require.NotContains(t, r.Stderr, "dry run at", args)
	}
}

// TestKafkaOutageIsNotNeverPruned: with Kafka unreachable, `relay cleanup`
// and `relay status` say the inbox keys were not pruned this time because
// Kafka was unreachable, not that the topic is never pruned (which means a
// topic whose Kafka config keeps records forever).
func TestKafkaOutageIsNotNeverPruned(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	seedInbox(t, db, "svc", "orders", 100*time.Hour)
	env := []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=127.0.0.1:1", "PGBOX_KAFKA_TIMEOUT=500ms"}

	r := runRelay(t, time.Minute, env, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "not pruned this pass: "+string(cleanup.ReasonKafkaUnreachable), r.Stdout)
	require.NotContains(t, r.Stdout, "never pruned", r.Stdout)
	require.Equal(t, 1, inboxKeys(t, db))

	r = runRelay(t, time.Minute, env, "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "not pruned this pass: "+string(cleanup.ReasonKafkaUnreachable), r.Stdout)
	require.NotContains(t, r.Stdout, "never pruned", r.Stdout)
}
