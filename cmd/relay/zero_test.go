package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// An explicit zero buffer, by flag or environment, is a zero buffer: the
// window is exactly retention.ms + segment.ms, never the 24h default.
func TestCleanupBufferZeroMeansZero(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := kafkatest.New(t)
	hour, tenMin := "3600000", "600000"
	kafkatest.CreateTopic(t, c.ListenAddrs(), "orders", 1, map[string]*string{"retention.ms": &hour, "segment.ms": &tenMin})
	// Window with a zero buffer: 1h10m. The 2h-old key is past it, the 1h-old one is not.
	seedInbox(t, db, "payments-svc", "orders", 2*time.Hour, time.Hour)
	base := []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ",")}

	for name, run := range map[string]struct {
		env  []string
		args []string
	}{
		"flag": {base, []string{"cleanup", "--dry-run", "--cleanup-buffer=0s"}},
		"env":  {append(append([]string{}, base...), "PGBOX_CLEANUP_BUFFER=0s"), []string{"cleanup", "--dry-run"}},
	} {
		r := runRelay(t, time.Minute, run.env, run.args...)
		require.Equal(t, 0, r.Code, "%s: %s", name, r.Stderr)
		row := reportRow(t, r.Stdout, "orders")
		require.Equal(t, []string{"orders", "1h", "10m", "delete", "1h10m", "1"}, row[:6], "%s: %s", name, r.Stdout)
	}
	require.Equal(t, 2, inboxKeys(t, db), "dry runs delete nothing")
	r := runRelay(t, time.Minute, base, "cleanup", "--cleanup-buffer=0s")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, 1, inboxKeys(t, db))
}

// reportRow returns the fields of topic's row in the cleanup report.
func reportRow(t *testing.T, out, topic string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 6 && f[0] == topic {
			return f
		}
	}
	t.Fatalf("no row for %s in:\n%s", topic, out)
	return nil
}

// A zero where zero means nothing useful is refused, exit 2, with one line
// naming the flag and saying what to use.
func TestRejectedZeroExitsTwo(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db", "KAFKA_BROKERS=127.0.0.1:9092"}
	for _, tc := range []struct {
		args []string
		env  []string
		want []string
	}{
		{[]string{"run", "--poll-interval=0s"}, nil, []string{"--poll-interval", "PGBOX_POLL_INTERVAL", "at least 1ms"}},
		{[]string{"run"}, []string{"PGBOX_LEASE_TTL=0s"}, []string{"PGBOX_LEASE_TTL", "--lease-ttl", "at least 1ms"}},
		{[]string{"cleanup", "--cleanup-batch-size=0"}, nil, []string{"--cleanup-batch-size", "from 1 to"}},
		{[]string{"cleanup", "--kafka-timeout=0s"}, nil, []string{"--kafka-timeout", "at least 1ms"}},
		{[]string{"run", "--kafka-max-message-bytes=0"}, nil, []string{"--kafka-max-message-bytes", "from 1024"}},
	} {
		r := runRelay(t, time.Minute, append(append([]string{}, env...), tc.env...), tc.args...)
		require.Equal(t, 2, r.Code, "%v %v: %s", tc.args, tc.env, r.Stderr)
		lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
		require.Len(t, lines, 1, "one error line: %s", r.Stderr)
		for _, w := range tc.want {
			require.Contains(t, r.Stderr, w)
		}
	}
}
