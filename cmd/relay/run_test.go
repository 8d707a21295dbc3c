package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// proc is a running `relay run` whose stderr is watched.
type proc struct{ *testutil.Proc }

var listenRE = regexp.MustCompile(`msg="http listening" addr=(\S+)`)

// startRelay starts the binary with args; the HTTP server listens on a free
// loopback port, returned by proc.HTTPAddr.
func startRelay(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(relayBin, args...)
	cmd.Env = append(testutil.CleanEnv(), env...)
	cmd.Stdout = io.Discard
	return &proc{testutil.StartProc(t, cmd, listenRE)}
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop(t *testing.T) int {
	t.Helper()
	return p.signal(t, syscall.SIGTERM)
}

// signal sends sig and returns the exit code.
func (p *proc) signal(t *testing.T, sig os.Signal) int {
	t.Helper()
	require.NoError(t, p.Cmd.Process.Signal(sig))
	select {
	case <-p.Done():
	case <-time.After(2 * time.Minute):
		t.Fatalf("relay did not exit after SIGTERM\n%s", p.Output())
	}
	return p.Cmd.ProcessState.ExitCode()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, timeout, what, cond)
}

// writeRows commits n outbox rows for topic in one transaction each batch.
func writeRows(t *testing.T, db *testdb.DB, topic string, from, n int) {
	t.Helper()
	require.NoError(t, writeRowsErr(db, topic, from, n))
}

// writeRowsErr is writeRows for a goroutine of its own: it returns the
// error.
func writeRowsErr(db *testdb.DB, topic string, from, n int) error {
	ctx := context.Background()
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		msgs := make([]outbox.Message, 0, n)
		for i := from; i < from+n; i++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%7), Value: fmt.Appendf(nil, "v%d", i)})
		}
		return outbox.Write(ctx, tx, msgs...)
	})
}

func runEnv(db *testdb.DB, c *kfake.Cluster, extra ...string) []string {
	return append([]string{
		"DATABASE_URL=" + db.URL,
		"KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ","),
		"PGBOX_HTTP_ADDR=127.0.0.1:0",
		"PGBOX_LANES=4",
		"PGBOX_HEARTBEAT_INTERVAL=200ms",
		"PGBOX_LEASE_TTL=1s",
		"PGBOX_POLL_INTERVAL=100ms",
		"PGBOX_KAFKA_TIMEOUT=2s",
	}, extra...)
}

func eventIDs(t *testing.T, c *kfake.Cluster, topic string, want int) map[string]int {
	t.Helper()
	recs := kafkatest.ReadAll(t, c.ListenAddrs(), topic, want, 60*time.Second)
	ids := map[string]int{}
	for _, r := range recs {
		for _, h := range r.Headers {
			if string(h.Key) == relay.EventIDHeader {
				ids[string(h.Value)]++
			}
		}
	}
	return ids
}

func outboxCount(t *testing.T, db *testdb.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
	return n
}

func TestRunPublishesServesMetricsAndStops(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(3, "payments"))
	writeRows(t, db, "payments", 0, 50)

	p := startRelay(t, runEnv(db, c, "PGBOX_LOG_FORMAT=text", "PGBOX_MAX_ATTEMPTS=2", "PGBOX_MAX_BACKOFF=300ms", "PGBOX_UNKNOWN_TOPIC_WINDOW=0s"), "run")
	base := "http://" + p.HTTPAddr(t)

	code, body := httpGet(t, base+"/healthz")
	require.Equal(t, 200, code)
	require.Equal(t, "ok\n", body)

	ids := eventIDs(t, c, "payments", 50)
	require.Len(t, ids, 50, "every row is published with its own event id")
	waitFor(t, "outbox drained", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })

	waitFor(t, "ready", 30*time.Second, func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
	_, body = httpGet(t, base+"/readyz")
	require.Contains(t, body, `"lanes":"holding 4 of 4"`)

	waitFor(t, "published counter", 30*time.Second, func() bool {
		_, m := httpGet(t, base+"/metrics")
		return strings.Contains(m, "pgbox_relay_published_total 50")
	})
	_, m := httpGet(t, base+"/metrics")
	for _, want := range []string{
		"pgbox_relay_batches_total", "pgbox_relay_batch_latency_seconds_bucket", "pgbox_relay_batch_latency_seconds_count",
		"pgbox_relay_lanes_held 4", "pgbox_relay_retried_total 0", "pgbox_relay_parked_total 0",
		"pgbox_outbox_oldest_unpublished_age_seconds 0", "pgbox_relay_lane_owner{lane=\"3\"", "pgbox_scrape_database_up 1",
		"pgbox_cleanup_passes_total 1", "pgbox_cleanup_deleted_total",
	} {
		require.Contains(t, m, want)
	}
	// status sees this instance holding every lane.
	r := runRelay(t, time.Minute, []string{"DATABASE_URL=" + db.URL}, "status", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st inspect.Snapshot
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.Len(t, st.Instances, 1)
	require.True(t, st.Instances[0].Live)
	require.Len(t, st.Lanes, 4)
	for _, l := range st.Lanes {
		require.True(t, l.Held, "lane %d", l.Lane)
		require.Equal(t, st.Instances[0].Instance, l.Owner)
	}

	// A row that can never be published (unknown topic) is parked and shows.
	writeRows(t, db, "no-such-topic", 0, 1)
	waitFor(t, "parked metric", 60*time.Second, func() bool {
		_, m := httpGet(t, base+"/metrics")
		return strings.Contains(m, `pgbox_outbox_parked_rows{topic="no-such-topic"} 1`) && strings.Contains(m, "pgbox_relay_parked_total 1")
	})

	require.Equal(t, 0, p.stop(t), p.Output())
	require.Contains(t, p.Output(), "relay stopped")
}

func TestRunNotReadyWithoutKafka(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	// A password in the URL (the test server trusts loopback and ignores it)
	// and a SASL password: neither may reach the logs.
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "db-s3cret")
	env := append(runEnv(db, kafkatest.New(t)), "KAFKA_BROKERS=127.0.0.1:1", // nothing listens on port 1
		"DATABASE_URL="+u.String(), "PGBOX_KAFKA_SASL_MECHANISM=PLAIN", "PGBOX_KAFKA_SASL_USER=u", "PGBOX_KAFKA_SASL_PASSWORD=sasl-s3cret")
	p := startRelay(t, env, "run")
	base := "http://" + p.HTTPAddr(t)
	code, _ := httpGet(t, base+"/healthz")
	require.Equal(t, 200, code, "the process is up")
	code, body := httpGet(t, base+"/readyz")
	require.Equal(t, 503, code, body)
	require.Contains(t, body, `"kafka":"unreachable`)
	require.Equal(t, 0, p.signal(t, os.Interrupt), "SIGINT stops it cleanly too: %s", p.Output())
	require.Contains(t, p.Output(), ":xxxxx@", "the startup line shows the DSN, redacted")
	require.Contains(t, p.Output(), `kafka_sasl_password=(redacted)`)
	require.NotContains(t, p.Output(), "s3cret")
}

// TestRunSIGTERMUnderLoad stops the relay while writers keep committing rows:
// it must exit 0 (within its shutdown deadline, or it would exit 1), and after
// a restart every row written during the run reaches Kafka.
func TestRunSIGTERMUnderLoad(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(3, "load"))
	env := runEnv(db, c, "PGBOX_SHUTDOWN_TIMEOUT=15s", "PGBOX_BATCH_SIZE=50")
	ctx := context.Background()

	// Writers commit 10 rows per transaction, paced, until told to stop.
	var written atomic.Int64
	stopWriting := make(chan struct{})
	writerErr := make(chan error, 1)
	go func() {
		defer close(writerErr)
		for i := 0; ; i += 10 {
			select {
			case <-stopWriting:
				return
			case <-time.After(2 * time.Millisecond):
			}
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				msgs := make([]outbox.Message, 10)
				for j := range msgs {
					msgs[j] = outbox.Message{Topic: "load", Key: fmt.Appendf(nil, "k%d", (i+j)%7), Value: fmt.Appendf(nil, "v%d", i+j)}
				}
				return outbox.Write(ctx, tx, msgs...)
			})
			if err != nil {
				writerErr <- err
				return
			}
			written.Add(10)
		}
	}()
	published := func() int64 {
		// A lower bound: written is counted after each commit and read before
		// the rows left are counted.
		w := written.Load()
		var left int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&left))
		return w - left
	}

	// Three runs, each stopped by SIGTERM while writers commit and the relay
	// publishes.
	for run := range 3 {
		p := startRelay(t, env, "run")
		p.HTTPAddr(t)
		floor := published()
		waitFor(t, "the relay publishing", 90*time.Second, func() bool { return published() > floor+100 })
		code := p.stop(t)
		require.Equal(t, 0, code, "run %d: SIGTERM under load must exit cleanly within the deadline\n%s", run, p.Output())
		require.Contains(t, p.Output(), "shutting down")
	}
	close(stopWriting)
	require.NoError(t, <-writerErr)
	total := int(written.Load())
	require.Positive(t, outboxCount(t, db), "rows were left for the restart")

	// Restart: everything written reaches Kafka, each row at least once.
	p2 := startRelay(t, env, "run")
	p2.HTTPAddr(t)
	waitFor(t, "outbox drained after restart", 120*time.Second, func() bool { return outboxCount(t, db) == 0 })
	ids := eventIDs(t, c, "load", total)
	require.Len(t, ids, total, "every committed row reached Kafka")
	require.Equal(t, 0, p2.stop(t), p2.Output())
}

// TestRunLaneCountMismatchExits: a second instance started with another
// --lanes than the running one refuses to start (exit 1, message naming the
// lane counts) instead of publishing out of order.
func TestRunLaneCountMismatchExits(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(1, "payments"))
	a := startRelay(t, runEnv(db, c), "run")
	base := "http://" + a.HTTPAddr(t)
	waitFor(t, "first instance ready", 30*time.Second, func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })

	r := runRelay(t, time.Minute, runEnv(db, c, "PGBOX_LANES=8"), "run")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "lane count")
	require.Equal(t, 0, a.stop(t), a.Output())
}
