package cleanup

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// PGBOX_BENCH_CLEANUP_ROWS sets the table size of BenchmarkPrune (half of the
// keys expired); the size, 4,000,000, is the default.
const benchRowsEnv = "PGBOX_BENCH_CLEANUP_ROWS"

// BenchmarkPrune loads N inbox keys (N/2 past their topic's cutoff) and
// measures writers calling inbox.Process (4 at a time, each call in its own
// transaction) without cleanup (baseline), then the same writers while one
// pass deletes the expired half (pgbox). pgbox also
// reports the deletion rate and the table and index sizes after VACUUM.
//
// Each sub-benchmark does its work once whatever b.N is: run it with
// -benchtime 1x (the Makefile's default).
func BenchmarkPrune(b *testing.B) {
	rows := 4_000_000
	if v := os.Getenv(benchRowsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			b.Fatalf("%s=%q: want a number of rows >= 2", benchRowsEnv, v)
		}
		rows = n
	}
	ctx := context.Background()
	db := testdb.New(b)
	cluster := kafkatest.New(b)
	admin, err := sarama.NewClusterAdmin(cluster.ListenAddrs(), kafkatest.Config())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = admin.Close() })
	kafkatest.CreateTopic(b, cluster.ListenAddrs(), "orders", 12,
		map[string]*string{"retention.ms": ptr(ms(24 * time.Hour)), "segment.ms": ptr(ms(time.Hour))})

	t0 := time.Now()
	// Expired keys are 3 to 5 days old, live ones spread over the last day;
	// both in insertion order, as a consumer writes them.
	load := func(from, to int, ageSQL string) {
		q := fmt.Sprintf(`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", fingerprint, record_at, received_at)
			SELECT 'payments-svc', 'orders/' || (g %% 12) || '/' || g, 'orders', g %% 12, g,
			       sha256(g::text::bytea), %[1]s - interval '1 second', %[1]s
			FROM generate_series($1::bigint, $2::bigint) g`, ageSQL)
		if _, err := db.Pool.Exec(ctx, q, from, to); err != nil {
			b.Fatalf("load: %v", err)
		}
	}
	half := rows / 2
	var wg sync.WaitGroup
	const chunks = 4
	for i := range chunks {
		wg.Go(func() {
			lo, hi := 1+i*half/chunks, (i+1)*half/chunks
			load(lo, hi, fmt.Sprintf(`now() - interval '5 days' + g * interval '172800 seconds' / %d`, half))
			load(half+lo, half+hi, fmt.Sprintf(`now() - interval '1 day' + (g - %d) * interval '86400 seconds' / %d`, half, rows-half))
		})
	}
	wg.Wait()
	if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE pgbox_inbox`); err != nil {
		b.Fatal(err)
	}
	// Start both phases from a fresh checkpoint, so that neither pays for the
	// load's (needs superuser or pg_checkpoint; skipped when not allowed).
	if _, err := db.Pool.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Logf("CHECKPOINT: %v", err)
	}
	b.Logf("loaded %d keys in %v", rows, time.Since(t0).Round(time.Millisecond))

	var cleanupDur time.Duration
	b.Run("baseline", func(b *testing.B) {
		// As long as a pass takes at this size, estimated at 300k rows/s.
		d := max(time.Duration(float64(half)/300_000*float64(time.Second)), 2*time.Second)
		lat, commits := benchWriters(ctx, b, db.Pool, 0, func() <-chan struct{} {
			c := make(chan struct{})
			time.AfterFunc(d, func() { close(c) })
			return c
		}())
		reportWriters(b, lat, commits, d)
		reportSizes(ctx, b, db.Pool)
	})
	b.Run("pgbox", func(b *testing.B) {
		cfg := Config{Pool: db.Pool, Admin: admin}
		if v := os.Getenv("PGBOX_BENCH_CLEANUP_BATCH"); v != "" {
			cfg.BatchSize, _ = strconv.Atoi(v)
		}
		if v := os.Getenv("PGBOX_BENCH_CLEANUP_PAUSE"); v != "" {
			cfg.Pause, _ = time.ParseDuration(v)
		}
		c, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		var lsn0 string
		if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		var rep Report
		var runErr error
		go func() {
			defer close(stop)
			rep, runErr = c.RunOnce(ctx)
		}()
		lat, commits := benchWriters(ctx, b, db.Pool, 1<<40, stop)
		if runErr != nil {
			b.Fatal(runErr)
		}
		if rep.Deleted != int64(half) {
			b.Fatalf("deleted %d keys, want %d", rep.Deleted, half)
		}
		cleanupDur = rep.Duration
		reportWriters(b, lat, commits, rep.Duration)
		b.ReportMetric(float64(rep.Deleted)/rep.Duration.Seconds(), "rows-deleted/s")
		b.ReportMetric(float64(rep.MaxBatch.Microseconds())/1000, "max-batch-ms")
		var wal int64
		if err := db.Pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn0).Scan(&wal); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(wal)/(1<<20), "WAL-MB")

		if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE pgbox_inbox`); err != nil {
			b.Fatal(err)
		}
		reportSizes(ctx, b, db.Pool)
	})
	b.Logf("pass over %d keys took %v", rows, cleanupDur)
}

// benchWriters runs 4 writers calling inbox.Process (ByOffset keys of new
// messages, fingerprints on, an empty handler) in their own transactions until
// stop closes, and returns their latencies and commit count. Offsets start at
// base, on partitions the load left empty.
func benchWriters(ctx context.Context, b *testing.B, pool *pgxpool.Pool, base int64, stop <-chan struct{}) ([]time.Duration, int64) {
	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByOffset()})
	if err != nil {
		b.Fatal(err)
	}
	handler := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	var mu sync.Mutex
	var lat []time.Duration
	var commits atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			var mine []time.Duration
			for i := base; ; i++ {
				select {
				case <-stop:
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
					return
				default:
				}
				m := inbox.Message{Topic: "orders", Partition: int32(100 + w), Offset: i, Value: []byte("payment"), Timestamp: time.Now()}
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := ib.Process(ctx, tx, m, handler)
					return err
				})
				if err != nil {
					b.Errorf("writer: %v", err)
					return
				}
				mine = append(mine, time.Since(t0))
				commits.Add(1)
			}
		})
	}
	wg.Wait()
	return lat, commits.Load()
}

func reportWriters(b *testing.B, lat []time.Duration, commits int64, d time.Duration) {
	if len(lat) == 0 {
		b.Fatal("writers made no progress")
	}
	slices.Sort(lat)
	p := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(float64(commits)/d.Seconds(), "commits/s")
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}

// reportSizes reports pgbox_inbox's table and index sizes (after the pass and
// a VACUUM for pgbox; before the pass for the baseline). VACUUM frees the
// deleted rows' space for reuse by new keys; it does not shrink the files.
func reportSizes(ctx context.Context, b *testing.B, pool *pgxpool.Pool) {
	var table, index int64
	if err := pool.QueryRow(ctx, `SELECT pg_table_size('pgbox_inbox'), pg_indexes_size('pgbox_inbox')`).Scan(&table, &index); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(table)/(1<<20), "table-MB")
	b.ReportMetric(float64(index)/(1<<20), "index-MB")
}
