package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/integration_test/internal/harness"
)

// Knobs of the outage scenario.
const (
	envOutage       = "CHAOS_OUTAGE"        // how long Kafka is unreachable (Go duration); default 2m
	envOutageEvents = "CHAOS_OUTAGE_EVENTS" // orders written (most during the outage); default 50000
)

// Deadlines an operator's tools must meet while Kafka is unreachable.
const (
	metricsDeadline = 10 * time.Second // a Prometheus scrape timeout
	statusDeadline  = 30 * time.Second // `relay status` from a shell
)

// TestScenarioKafkaUnreachable: the broker stops answering (SIGSTOP: open
// sockets, no replies, the hardest case for timeouts) for minutes while the
// orders service keeps committing. Every relay's /metrics and `relay
// status` keep answering within their deadlines and report the backlog;
// when Kafka returns, the backlog drains with no loss and in order.
// Depends on the fast status queries (cmd).
func TestScenarioKafkaUnreachable(t *testing.T) {
	outage := 2 * time.Minute
	if v := os.Getenv(envOutage); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, envOutage)
		outage = d
	}
	events := int64(50_000)
	envInt(t, envOutageEvents, func(n int64) { events = n })
	ctx, w := scenarioWorld(t, harness.Options{})

	require.NoError(t, w.StartOrders(events, float64(events)/outage.Seconds()*1.2, 3))
	time.Sleep(3 * time.Second)
	require.NoError(t, w.Broker.Pause())
	paused := time.Now()
	var maxBacklog int64
	for time.Since(paused) < outage {
		time.Sleep(min(15*time.Second, outage-time.Since(paused)))
		for i, addr := range w.RelayHTTP[:w.Opts.OrderRelays] {
			took, backlog, err := scrapeBacklog(ctx, addr)
			require.NoError(t, err, "%s /metrics while Kafka is unreachable", w.Relays[i].Name)
			require.Less(t, took, metricsDeadline, "%s /metrics", w.Relays[i].Name)
			maxBacklog = max(maxBacklog, backlog)
		}
		took, unsent, err := status(ctx, w)
		require.NoError(t, err, "relay status while Kafka is unreachable")
		require.Less(t, took, statusDeadline, "relay status")
		fmt.Printf("%s: Kafka unreachable %v: status took %v, reports %d unpublished rows\n", t.Name(), time.Since(paused).Round(time.Second), took.Round(time.Millisecond), unsent)
		maxBacklog = max(maxBacklog, unsent)
	}
	require.NoError(t, w.Broker.Resume())
	require.Positive(t, maxBacklog, "the backlog is reported while Kafka is unreachable")

	requireDrained(ctx, t, w, events, 15*time.Minute)
}

// scrapeBacklog GETs /metrics and returns how long it took and the sum of
// pgbox_outbox_unpublished_rows.
func scrapeBacklog(ctx context.Context, addr string) (time.Duration, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, metricsDeadline)
	defer cancel()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return time.Since(start), 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return time.Since(start), 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return time.Since(start), 0, fmt.Errorf("/metrics: %s", resp.Status)
	}
	var sum int64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "pgbox_outbox_unpublished_rows{") {
			f, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			sum += int64(f)
		}
	}
	return time.Since(start), sum, nil
}

// status runs `relay status --json` against the orders database, with
// the (unreachable) broker given, and returns its unpublished row count.
func status(ctx context.Context, w *harness.World) (time.Duration, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, statusDeadline+5*time.Second)
	defer cancel()
	start := time.Now()
	out, err := w.RunRelay(ctx, "status", "--json", "--database-url", w.PG.URL(harness.OrdersDB),
		"--kafka-brokers", w.Brokers[0], "--kafka-timeout", "2s", "--log-level", "error")
	took := time.Since(start)
	if err != nil {
		return took, 0, fmt.Errorf("%w\n%s", err, out)
	}
	var rep struct {
		Unsent int64 `json:"outbox_unpublished"`
	}
	if i := strings.IndexByte(out, '{'); i >= 0 {
		out = out[i:]
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		return took, 0, fmt.Errorf("status --json output: %w\n%s", err, out)
	}
	return took, rep.Unsent, nil
}
