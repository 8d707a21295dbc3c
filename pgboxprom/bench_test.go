package pgboxprom_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/pgboxprom"
)

// The scrape's database reads before package inspect (cmd/relay's
// collectStatus without the inbox): the lane table, then count(*) GROUP BY
// over the whole outbox. Kept here as the baseline.
const (
	baselineLanesSQL = `SELECT lane, lanes, coalesce(owner, ''), expires_at > now(), epoch,
	CASE WHEN expires_at > now() THEN extract(epoch FROM expires_at - now()) ELSE 0 END::float8
FROM pgbox_relay_lanes ORDER BY lane`

	baselineBacklogSQL = `SELECT topic, (slot % $1)::int AS lane,
	count(*) FILTER (WHERE parked_at IS NULL)::bigint,
	count(*) FILTER (WHERE parked_at IS NOT NULL)::bigint,
	min(created_at) FILTER (WHERE parked_at IS NULL),
	now()
FROM pgbox_outbox GROUP BY 1, 2 ORDER BY 1, 2`

	// baselineStatusInboxSQL is what `status` ran over the inbox.
	baselineStatusInboxSQL = `SELECT consumer, topic, count(*)::bigint, min(GREATEST(received_at, record_at)), now()
FROM pgbox_inbox GROUP BY 1, 2 ORDER BY 1, 2`
)

// benchRows reads a row count from the environment, else def.
func benchRows(b *testing.B, env string, def int) int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, env)
	return n
}

// seedScrapeBench fills a fresh schema with an outbox backlog of outboxRows
// (4 topics, 256 slots, a few parked) and inboxRows keys (2 consumers × 4
// topics, a month of receive times), quickly: the inbox's secondary indexes
// are dropped for the load and rebuilt, then both tables are analyzed.
func seedScrapeBench(b *testing.B, pool *pgxpool.Pool, outboxRows, inboxRows int) {
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	exec := func(sql string, args ...any) {
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(b, err, sql)
	}
	exec(`SET maintenance_work_mem = '256MB'`)
	exec(`SET synchronous_commit = off`)
	exec(`INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at) SELECT l, 16, 'relay-a', now() + interval '1 hour' FROM generate_series(0, 15) l`)
	exec(`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, created_at)
		SELECT gen_random_uuid(), g % 256, 'topic-' || (g % 4), int8send(g), '\x00', now() - interval '1 hour' + g * interval '1 microsecond'
		FROM generate_series(1, $1) g`, outboxRows)
	exec(`UPDATE pgbox_outbox SET parked_at = now(), last_error = 'bench' WHERE id % 100000 = 0`)

	// Every secondary index the migrations made, whatever they are now.
	rows, err := conn.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'pgbox_inbox' AND schemaname = current_schema() AND indexname <> 'pgbox_inbox_pkey'`)
	require.NoError(b, err)
	var names, defs []string
	for rows.Next() {
		var n, d string
		require.NoError(b, rows.Scan(&n, &d))
		names, defs = append(names, n), append(defs, d)
	}
	require.NoError(b, rows.Err())
	for _, name := range names {
		exec(`DROP INDEX ` + pgx.Identifier{name}.Sanitize())
	}
	exec(`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at)
		SELECT 'svc-' || (g % 2), 'k' || g, 'topic-' || (g / 2 % 4), 0, g, now() - interval '30 days' + g * (interval '30 days' / $1)
		FROM generate_series(1, $1) g`, inboxRows)
	for _, d := range defs {
		exec(d)
	}
	exec(`ANALYZE pgbox_outbox`)
	exec(`ANALYZE pgbox_inbox`)
}

// BenchmarkInspect builds one 5M-row outbox backlog and 10M inbox keys
// (sized by PGBOX_BENCH_OUTBOX_ROWS and PGBOX_BENCH_INBOX_ROWS; the load takes
// minutes at full size and runs only with -bench), then measures on it:
//
//   - scrape: one Prometheus scrape of pgboxprom's Collector (database
//     metrics through package inspect: backlog, lanes, parked rows, inbox key
//     ages per consumer and topic) against the scrape's queries before it
//     (baseline: count(*) GROUP BY over the whole outbox);
//   - status: inspect.Read, what `relay status` prints, against
//     status's queries before it (baseline: the same outbox count plus
//     count(*) GROUP BY over the whole inbox).
func BenchmarkInspect(b *testing.B) {
	outboxRows := benchRows(b, "PGBOX_BENCH_OUTBOX_ROWS", 5_000_000)
	inboxRows := benchRows(b, "PGBOX_BENCH_INBOX_ROWS", 10_000_000)
	db := testdb.New(b)
	seedScrapeBench(b, db.Pool, outboxRows, inboxRows)
	b.Run("scrape", func(b *testing.B) {
		b.Run("pgbox", func(b *testing.B) { benchScrape(b, db.Pool) })
		b.Run("baseline", func(b *testing.B) {
			benchBaseline(b, db.Pool, "scrape-ms", baselineLanesSQL, baselineBacklogSQL)
		})
	})
	b.Run("status", func(b *testing.B) {
		b.Run("pgbox", func(b *testing.B) { benchStatus(b, db.Pool) })
		b.Run("baseline", func(b *testing.B) {
			benchBaseline(b, db.Pool, "status-ms", baselineLanesSQL, baselineBacklogSQL, baselineStatusInboxSQL)
		})
	})
}

func benchScrape(b *testing.B, pool *pgxpool.Pool) {
	c, err := pgboxprom.New(pgboxprom.Config{DB: pool, Inspect: inspect.Config{Lanes: 16}})
	require.NoError(b, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	_, err = reg.Gather() // warm the pool's connection
	require.NoError(b, err)
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		mfs, err := reg.Gather()
		require.NoError(b, err)
		require.NotEmpty(b, mfs)
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "scrape-ms")
}

func benchStatus(b *testing.B, pool *pgxpool.Pool) {
	ctx := context.Background()
	_, err := inspect.Read(ctx, pool, inspect.Config{}) // warm up
	require.NoError(b, err)
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		snap, err := inspect.Read(ctx, pool, inspect.Config{})
		require.NoError(b, err)
		require.NotEmpty(b, snap.Inbox)
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "status-ms")
}

// benchBaseline runs the old queries (the backlog one takes the lane count, 16).
func benchBaseline(b *testing.B, pool *pgxpool.Pool, unit string, queries ...string) {
	ctx := context.Background()
	_, err := pool.Exec(ctx, `SELECT 1`)
	require.NoError(b, err)
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		for _, q := range queries {
			var args []any
			if q == baselineBacklogSQL {
				args = []any{16}
			}
			rows, err := pool.Query(ctx, q, args...)
			require.NoError(b, err)
			for rows.Next() {
			}
			require.NoError(b, rows.Err())
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), unit)
}
