package cleanup

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// PGBOX_BENCH_CLEANUP_ROWS sets the number of expired keys BenchmarkPrune
// deletes; the size, 10,000,000, is the default (loading them takes
// minutes: try 500000 for a quick look). PGBOX_BENCH_CLEANUP_BATCH and
// PGBOX_BENCH_CLEANUP_PAUSE override the cleaner's BatchSize and Pause, to
// chart the trade-off; unset, the defaults are measured.
// PGBOX_BENCH_CLEANUP_RULE=time loads every key with an unknown position
// (position_at NULL) and spread over three consumers, so the time rule
// deletes the expired ones instead of the exact rule (Kafka is left alone:
// no log start has moved), reading each consumer's keys by age.
const benchRowsEnv = "PGBOX_BENCH_CLEANUP_ROWS"

// benchPhase is how long the cleaner runs, then rests, in turn.
const benchPhase = time.Second

// BenchmarkPrune loads N expired inbox keys plus N/2 live ones (positions
// known, so the exact rule deletes them: Kafka's log start has passed every
// expired key, as retention would have moved it) and runs 4
// writers calling inbox.Process (each call in its own transaction) for the
// whole of one cleanup pass that deletes the N expired keys. The pass is
// interleaved with rests: it runs for benchPhase, is held between two
// batches for benchPhase, and so on, so that the writers' latencies with
// cleanup (pgbox) and without (baseline) are measured in the same run,
// alternating every second (samples that start within 100ms of a switch, or
// span one, are dropped). It reports both p99s and their ratio (the target
// is ≤ 2x with the default settings), the writers' commit rates, and the
// delete rate the settings give (rows deleted per second of the cleaner's
// running time).
//
// It does its work once whatever b.N is: run it with -benchtime 1x (the
// Makefile's default).
func BenchmarkPrune(b *testing.B) {
	expired := 10_000_000
	if v := os.Getenv(benchRowsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			b.Fatalf("%s=%q: want a number of rows >= 2", benchRowsEnv, v)
		}
		expired = n
	}
	ctx := context.Background()
	db := testdb.New(b)
	cluster := kafkatest.New(b)
	admin, err := sarama.NewClusterAdmin(cluster.ListenAddrs(), kafkatest.Config())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = admin.Close() })
	kafkatest.CreateTopic(b, cluster.ListenAddrs(), "orders", benchPartitions,
		map[string]*string{"retention.ms": ptr(ms(24 * time.Hour)), "segment.ms": ptr(ms(time.Hour))})
	timeRule := os.Getenv("PGBOX_BENCH_CLEANUP_RULE") == "time"
	loadKeysFor(ctx, b, db.Pool, expired, expired/2, timeRule)
	if !timeRule {
		dropExpired(ctx, b, cluster.ListenAddrs(), admin, expired)
	}

	cfg := Config{Pool: db.Pool, Admin: cleanupsarama.New(admin)}
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
	g := newPhaseGate()
	c.hookBatch = g.wait
	var lsn0 string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	stop := make(chan struct{})
	var rep Report
	var runErr error
	go func() {
		defer close(stop)
		rep, runErr = c.RunOnce(ctx)
	}()
	go g.alternate(stop)
	with, without, commitsWith, commitsWithout := benchWriters(ctx, b, db.Pool, 1<<40, stop, g)
	b.StopTimer()
	if runErr != nil {
		b.Fatal(runErr)
	}
	if rep.Deleted != int64(expired) {
		b.Fatalf("deleted %d keys, want %d", rep.Deleted, expired)
	}
	running, resting := g.durations()
	pw, pwo := p99(b, with), p99(b, without)
	b.ReportMetric(pw, "pgbox-p99-ms")
	b.ReportMetric(pwo, "baseline-p99-ms")
	b.ReportMetric(pw/pwo, "p99-ratio")
	b.ReportMetric(float64(commitsWith)/running.Seconds(), "pgbox-commits/s")
	b.ReportMetric(float64(commitsWithout)/resting.Seconds(), "baseline-commits/s")
	b.ReportMetric(float64(rep.Deleted)/running.Seconds(), "rows-deleted/s")
	b.ReportMetric(float64(rep.MaxBatch.Microseconds())/1000, "max-batch-ms")
	var wal int64
	if err := db.Pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn0).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(wal)/(1<<20), "WAL-MB")
	b.Logf("pass over %d expired keys: %v running, %v held; batch %d, pause %v",
		expired, running.Round(time.Millisecond), resting.Round(time.Millisecond), c.cfg.BatchSize, c.cfg.Pause)
}

// benchPartitions is the partition count of the benchmark's topic.
const benchPartitions = 12

// loadKeys writes expired keys 3 to 5 days old and live ones spread over
// the last day, both in insertion order as a consumer writes them, positions
// known: key g sits on partition g % 12 at offset g / 12, expired keys below
// offset expiredEnd(expired), live ones from it on.
func loadKeys(ctx context.Context, b *testing.B, pool *pgxpool.Pool, expired, live int) {
	loadKeysFor(ctx, b, pool, expired, live, false)
}

// loadKeysFor is loadKeys; with timeRule, every key's position is unknown
// and the keys are spread over three consumers.
func loadKeysFor(ctx context.Context, b *testing.B, pool *pgxpool.Pool, expired, live int, timeRule bool) {
	t0 := time.Now()
	consumer, position := `'payments-svc'`, "%[2]s"
	if timeRule { // unknown positions, three consumers
		consumer, position = `(ARRAY['payments-svc', 'audit-svc', 'ledger-svc'])[1 + g %% 3]`, "NULL"
	}
	load := func(from, to int, offsetSQL, ageSQL string) {
		q := fmt.Sprintf(`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", fingerprint, record_at, received_at, position_at)
			SELECT `+consumer+`, 'orders/' || (g %% %[3]d) || '/' || (%[1]s), 'orders', g %% %[3]d, %[1]s,
			       sha256(g::text::bytea), %[2]s - interval '1 second', %[2]s, `+position+`
			FROM generate_series($1::bigint, $2::bigint) g`, offsetSQL, ageSQL, benchPartitions)
		if _, err := pool.Exec(ctx, q, from, to); err != nil {
			b.Fatalf("load: %v", err)
		}
	}
	end := expiredEnd(expired)
	var wg sync.WaitGroup
	const chunks = 4
	for i := range chunks {
		wg.Go(func() {
			lo, hi := i*expired/chunks, (i+1)*expired/chunks-1
			load(lo, hi, fmt.Sprintf("g / %d", benchPartitions),
				fmt.Sprintf(`now() - interval '5 days' + g * interval '172800 seconds' / %d`, expired))
			lo, hi = i*live/chunks, (i+1)*live/chunks-1
			load(lo, hi, fmt.Sprintf("%d + g / %d", end, benchPartitions),
				fmt.Sprintf(`now() - interval '1 day' + g * interval '86400 seconds' / %d`, max(live, 1)))
		})
	}
	wg.Wait()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE pgbox_inbox`); err != nil {
		b.Fatal(err)
	}
	// Start from a fresh checkpoint, so that the pass does not pay for the
	// load's (needs superuser or pg_checkpoint; skipped when not allowed).
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		b.Logf("CHECKPOINT: %v", err)
	}
	b.Logf("loaded %d expired and %d live keys in %v", expired, live, time.Since(t0).Round(time.Millisecond))
}

// expiredEnd is the first offset past every expired key's, on every
// partition.
func expiredEnd(expired int) int64 { return int64((expired-1)/benchPartitions + 1) }

// dropExpired makes Kafka hold no expired key's record any more, as
// retention would: it fills every partition of "orders" up to expiredEnd
// with small records (one batch per 10,000) and moves the log start there
// with DeleteRecords. For the 10M-key run that is 10M records in the
// embedded broker (a few hundred MB, under a minute).
func dropExpired(ctx context.Context, b *testing.B, addrs []string, admin sarama.ClusterAdmin, expired int) {
	t0 := time.Now()
	end := expiredEnd(expired)
	fillPartitions(ctx, b, addrs, end)
	dropTo(b, admin, end)
	b.Logf("Kafka dropped the expired keys' %d records in %v", end*benchPartitions, time.Since(t0).Round(time.Millisecond))
}

// fillPartitions produces n small records to every partition of "orders".
func fillPartitions(ctx context.Context, b *testing.B, addrs []string, n int64) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(1<<20), kgo.MaxBufferedRecords(100_000), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var failed error
	var mu sync.Mutex
	for p := range int32(benchPartitions) {
		for range n {
			cl.Produce(ctx, &kgo.Record{Topic: "orders", Partition: p, Value: []byte("x")}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			})
		}
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if failed != nil {
		b.Fatal(failed)
	}
}

// dropTo moves the log start of every partition of "orders" to offset end,
// as retention would.
func dropTo(b *testing.B, admin sarama.ClusterAdmin, end int64) {
	drop := map[int32]int64{}
	for p := range int32(benchPartitions) {
		drop[p] = end
	}
	if err := admin.DeleteRecords("orders", drop); err != nil {
		b.Fatal(err)
	}
}

// phaseGate holds the cleaner between two batches every other benchPhase.
type phaseGate struct {
	mu       sync.Mutex
	cond     *sync.Cond
	phase    int // even: the cleaner runs; odd: it is held
	switched time.Time
	run      time.Duration
	rest     time.Duration
}

func newPhaseGate() *phaseGate {
	g := &phaseGate{switched: time.Now()}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// wait blocks the cleaner while the phase is a rest.
func (g *phaseGate) wait() {
	g.mu.Lock()
	for g.phase%2 == 1 {
		g.cond.Wait()
	}
	g.mu.Unlock()
}

func (g *phaseGate) alternate(stop <-chan struct{}) {
	t := time.NewTicker(benchPhase)
	defer t.Stop()
	for {
		select {
		case <-stop:
			g.flip()
			return
		case <-t.C:
			g.flip()
		}
	}
}

func (g *phaseGate) flip() {
	g.mu.Lock()
	defer g.mu.Unlock()
	d := time.Since(g.switched)
	if g.phase%2 == 0 {
		g.run += d
	} else {
		g.rest += d
	}
	g.phase++
	g.switched = time.Now()
	g.cond.Broadcast()
}

// at returns the phase and how long it has lasted.
func (g *phaseGate) at() (int, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.phase, time.Since(g.switched)
}

func (g *phaseGate) durations() (run, rest time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.run, g.rest
}

func p99(b *testing.B, lat []time.Duration) float64 {
	if len(lat) == 0 {
		b.Fatal("writers made no progress in one of the phases")
	}
	slices.Sort(lat)
	return float64(lat[min(len(lat)-1, int(0.99*float64(len(lat))))].Microseconds()) / 1000
}

// benchWriters runs 4 writers calling inbox.Process (ByOffset keys of new
// messages, fingerprints on, an empty handler) in their own transactions until
// stop closes, and returns their latencies and commits while the cleaner ran
// and while it was held. Offsets start at base, on partitions the load left
// empty.
func benchWriters(ctx context.Context, b *testing.B, pool *pgxpool.Pool, base int64, stop <-chan struct{}, g *phaseGate) (with, without []time.Duration, commitsWith, commitsWithout int64) {
	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByOffset()})
	if err != nil {
		b.Fatal(err)
	}
	handler := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			var mine [2][]time.Duration
			for i := base; ; i++ {
				select {
				case <-stop:
					mu.Lock()
					with, without = append(with, mine[0]...), append(without, mine[1]...)
					mu.Unlock()
					return
				default:
				}
				m := inbox.Message{Topic: "orders", Partition: int32(100 + w), Offset: i, Value: []byte("payment"), Timestamp: time.Now()}
				phase, since := g.at()
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := ib.Process(ctx, tx, m, handler)
					return err
				})
				if err != nil {
					b.Errorf("writer: %v", err)
					return
				}
				d := time.Since(t0)
				if end, _ := g.at(); end == phase && since > 100*time.Millisecond {
					mine[phase%2] = append(mine[phase%2], d)
				}
			}
		})
	}
	wg.Wait()
	return with, without, int64(len(with)), int64(len(without))
}
