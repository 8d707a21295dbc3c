package pgboxprom_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/promtest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// gather returns every sample of c as name{labels} -> value.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	return promtest.Samples(t, c)
}

func newCollector(t *testing.T, cfg pgboxprom.Config) *pgboxprom.Collector {
	t.Helper()
	c, err := pgboxprom.New(cfg)
	require.NoError(t, err)
	return c
}

func writeRows(t *testing.T, pool *pgxpool.Pool, topic string, n int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range n {
			if err := outbox.Write(ctx, tx, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}); err != nil {
				return err
			}
		}
		return nil
	}))
}

// TestDedupHits: an in-process inbox's duplicates are exported as
// pgbox_inbox_duplicates_total, and the database gauges come from the
// outbox. (Moved from cmd/relay's exporter test.)
func TestDedupHits(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: inbox.ByHeader("id")})
	require.NoError(t, err)
	c := newCollector(t, pgboxprom.Config{Inbox: ib, DB: db.Pool, Inspect: inspect.Config{Lanes: 4}})

	m := inbox.Message{Topic: "orders", Partition: 0, Offset: 1, Value: []byte("v"), Headers: []outbox.Header{{Key: "id", Value: []byte("o-1")}}}
	for range 3 {
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := ib.Process(ctx, tx, m, func(context.Context, pgx.Tx, inbox.Message) error { return nil })
			return err
		}))
	}
	writeRows(t, db.Pool, "payments", 2)
	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET created_at = now() - interval '1 minute'`)
	require.NoError(t, err)

	got := gather(t, c)
	require.Equal(t, 1.0, got["pgbox_inbox_processed_total"])
	require.Equal(t, 2.0, got["pgbox_inbox_duplicates_total"])
	require.Equal(t, 1.0, got["pgbox_scrape_database_up"])
	require.Equal(t, 1.0, got["pgbox_scrape_database_snapshot_ok"])
	require.Greater(t, got["pgbox_outbox_oldest_unpublished_age_seconds"], 50.0)
	require.Equal(t, 0.0, got["pgbox_outbox_unpublished_rows_estimated"])
	var unpublished float64
	for k, v := range got {
		if strings.HasPrefix(k, `pgbox_outbox_unpublished_rows{lane=`) {
			require.Contains(t, k, `topic="payments"`)
			unpublished += v
		}
	}
	require.Equal(t, 2.0, unpublished)
	require.Equal(t, 1.0, got[`pgbox_inbox_keys{consumer="svc",topic="orders"}`])
	require.Contains(t, got, `pgbox_inbox_oldest_key_age_seconds{consumer="svc",topic="orders"}`)
	_, hasRelay := got["pgbox_relay_published_total"]
	require.False(t, hasRelay, "no relay in this process: no relay metrics")
}

// TestUnreachableDatabaseIsDown: a database that cannot be reached reports
// up 0 within the scrape timeout; the scrape itself succeeds.
func TestUnreachableDatabaseIsDown(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()
	c := newCollector(t, pgboxprom.Config{DB: pool, ScrapeTimeout: time.Second})
	start := time.Now()
	got := gather(t, c)
	require.Less(t, time.Since(start), 3*time.Second)
	require.Equal(t, 0.0, got["pgbox_scrape_database_up"])
	require.Equal(t, 0.0, got["pgbox_scrape_database_snapshot_ok"])
}

// TestSlowDatabaseIsNotDown: a read stuck behind a lock runs into the
// statement timeout; the database still reports up, the scrape reports its
// duration and a failed snapshot. Before, a timed-out scrape read as down.
func TestSlowDatabaseIsNotDown(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE pgbox_outbox IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	c := newCollector(t, pgboxprom.Config{DB: db.Pool, ScrapeTimeout: time.Second})
	got := gather(t, c)
	require.Equal(t, 1.0, got["pgbox_scrape_database_up"])
	require.Equal(t, 0.0, got["pgbox_scrape_database_snapshot_ok"])
	require.Greater(t, got["pgbox_scrape_database_duration_seconds"], 0.4)
}

// TestLint: every metric passes client_golang's linter (names, help, units).
func TestLint(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	writeRows(t, db.Pool, "payments", 1)
	c := newCollector(t, pgboxprom.Config{DB: db.Pool})
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	for _, p := range problems {
		// Gauges named _total would be wrong; the row gauges are fine.
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// TestConfigValidation: negative durations are named.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := pgboxprom.New(pgboxprom.Config{ScrapeTimeout: -time.Second})
	require.ErrorContains(t, err, "ScrapeTimeout -1s")
}

// TestRelayMetricsFromARelay: a *relay.Relay is a pgboxprom.Relay (read
// through client-neutral counters, so pgboxprom links no Kafka client); its
// counters are exported, and a relay that has not run reports zeros.
func TestRelayMetricsFromARelay(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	r, err := relay.New(relay.Config{Pool: db.Pool, Brokers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	got := gather(t, newCollector(t, pgboxprom.Config{Relay: r}))
	for _, name := range []string{"pgbox_relay_published_total", "pgbox_relay_retried_total", "pgbox_relay_parked_total", "pgbox_relay_batches_total",
		"pgbox_relay_rows_below_floor_total"} {
		v, ok := got[name]
		require.True(t, ok, name)
		require.Zero(t, v, name)
	}
}

// TestTargetsFromAFleet: Config.Targets exports a relay.Fleet's targets as
// one pgbox_relay_targets series per state, none per target.
func TestTargetsFromAFleet(t *testing.T) {
	t.Parallel()
	a, b := testdb.New(t), testdb.New(t)
	f, err := relay.NewFleet(relay.FleetConfig{Relay: relay.Config{Brokers: []string{"127.0.0.1:1"}},
		Targets: []relay.Target{{Pool: a.Pool, Schema: a.Schema}, {Pool: a.Pool, Schema: b.Schema}}})
	require.NoError(t, err)
	c := newCollector(t, pgboxprom.Config{Relay: f, Targets: f})
	got := gather(t, c)
	require.Equal(t, float64(2), got[`pgbox_relay_targets{state="starting"}`], "a fleet not yet run: %v", got)
	require.Contains(t, got, "pgbox_relay_published_total")
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}
