package cleanup

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// PGBOX_BENCH_HELD_KEYS sets how many keys the first pass of
// BenchmarkPruneHeld deletes (default 2,000,000).
const benchHeldEnv = "PGBOX_BENCH_HELD_KEYS"

// BenchmarkPruneHeld: a cleanup pass after millions of deleted inbox keys,
// with a snapshot held (as pg_dump holds one) and without, in the same run
// (issue 26). Each side gets a database of its own (the hold is per
// database) holding N expired keys and N/20 newer ones, positions known.
// Pass 1 deletes the N (Kafka's log start passed them); VACUUM runs, as
// autovacuum would between two passes, and removes them only where nothing
// holds a snapshot; then the log start passes the newer keys and pass 2,
// the one measured, deletes them. With the snapshot held, pass 2's index
// walks meet every key pass 1 deleted. It reports pass 2's delete rate
// held (pgbox-rows/s) and unheld (baseline-rows/s), their ratio, and its
// longest batch held and unheld.
//
// It does its work once whatever b.N is: run it with -benchtime 1x.
func BenchmarkPruneHeld(b *testing.B) {
	n := 2_000_000
	if v := os.Getenv(benchHeldEnv); v != "" {
		x, err := strconv.Atoi(v)
		if err != nil || x < 20 {
			b.Fatalf("%s=%q: want a number of keys >= 20", benchHeldEnv, v)
		}
		n = x
	}
	held := prunePass2(b, n, true)
	unheld := prunePass2(b, n, false)
	b.ReportMetric(held.rate, "pgbox-rows/s")
	b.ReportMetric(unheld.rate, "baseline-rows/s")
	b.ReportMetric(held.rate/unheld.rate, "x-baseline")
	b.ReportMetric(float64(held.maxBatch.Microseconds())/1000, "held-max-batch-ms")
	b.ReportMetric(float64(unheld.maxBatch.Microseconds())/1000, "unheld-max-batch-ms")
	b.ReportMetric(held.took.Seconds(), "held-pass-s")
	b.ReportMetric(unheld.took.Seconds(), "unheld-pass-s")
}

type passResult struct {
	rate     float64 // rows deleted per second of the pass
	took     time.Duration
	maxBatch time.Duration
}

// prunePass2 sets up one side and returns its measured pass.
func prunePass2(b *testing.B, n int, hold bool) passResult {
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	db := testdb.NewDatabase(b)
	cluster := kafkatest.New(b)
	addrs := cluster.ListenAddrs()
	admin, err := sarama.NewClusterAdmin(addrs, kafkatest.Config())
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	kafkatest.CreateTopic(b, addrs, "orders", benchPartitions,
		map[string]*string{"retention.ms": ptr(ms(24 * time.Hour)), "segment.ms": ptr(ms(time.Hour))})
	newer := n / 20
	loadKeys(ctx, b, db.Pool, n, newer) // the newer keys sit from offset expiredEnd(n) on
	end1, end2 := expiredEnd(n), expiredEnd(n)+int64((newer-1)/benchPartitions+1)
	fillPartitions(ctx, b, addrs, end2)
	dropTo(b, admin, end1)
	c, err := New(Config{Pool: db.Pool, Admin: cleanupsarama.New(admin), Buffer: NoBuffer})
	if err != nil {
		b.Fatal(err)
	}
	if hold {
		db.HoldSnapshot(b, "held-bench")
	}
	rep, err := c.RunOnce(ctx)
	if err != nil || rep.Deleted != int64(n) {
		b.Fatalf("pass 1 deleted %d keys (want %d): %v", rep.Deleted, n, err)
	}
	if _, err := db.Pool.Exec(ctx, `VACUUM pgbox_inbox`); err != nil {
		b.Fatal(err)
	}
	dropTo(b, admin, end2)
	b.StartTimer()
	t0 := time.Now()
	rep, err = c.RunOnce(ctx)
	took := time.Since(t0)
	b.StopTimer()
	if err != nil || rep.Deleted != int64(newer) {
		b.Fatalf("pass 2 deleted %d keys (want %d): %v", rep.Deleted, newer, err)
	}
	b.Logf("held %v: pass 2 deleted %d keys in %v (longest batch %v) after pass 1 deleted %d",
		hold, rep.Deleted, took.Round(time.Millisecond), rep.MaxBatch.Round(time.Millisecond), n)
	return passResult{rate: float64(rep.Deleted) / took.Seconds(), took: took, maxBatch: rep.MaxBatch}
}
