package consume_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/delayproxy"
	"github.com/pgbox/pgbox/internal/kafkatest"
)

// benchRecords is how many records each consumer run reads:
// PGBOX_BENCH_RECORDS, 10,000 by default. At batch 100 a 10,000-record run
// lasts 100–300 ms, a third of it the group's join and the last commit
// tick: longer runs weigh the price per message more than those.
var benchRecords = benchRecordsOf(os.Getenv("PGBOX_BENCH_RECORDS"))

func benchRecordsOf(s string) int64 {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
		return n
	}
	return 10_000
}

const (
	benchInsert = `INSERT INTO effects (event, topic, partition, "offset") VALUES ($1, $2, $3, $4)`
	// The hand-written consumer's own dedup table and its two statements.
	benchDedupTable  = `CREATE TABLE handmade_dedup (key text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`
	benchDedupOne    = `INSERT INTO handmade_dedup (key) VALUES ($1) ON CONFLICT DO NOTHING`
	benchDedupSeen   = `SELECT key FROM handmade_dedup WHERE key = ANY($1)`
	benchDedupInsert = `INSERT INTO handmade_dedup (key) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`
	// The batch's business rows in one statement (handwritten-batchwrite).
	benchInsertMany = `INSERT INTO effects (event, topic, partition, "offset")
		SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[])`
)

// BenchmarkConsumer: records consumed per second through each adapter,
// against what a team writes by hand instead of pgbox on the same client,
// and against no dedup at all. Each row runs pgbox and its baseline
// interleaved, run by run, with the same client settings (offsets committed
// every 100ms on all sides), the same pool and the same partitions; the rows:
//
//   - <client>/handwritten/batch1: the common hand-written pattern, on the
//     same client with the same per-partition concurrency: its own dedup
//     table, per message BEGIN; INSERT key ON CONFLICT DO NOTHING; business
//     INSERT if new; COMMIT; mark the offset. pgbox: the adapter with
//     BatchSize 1 and the same business INSERT as its handler. Same business
//     statements on both sides: this row is pgbox's dedup against the
//     hand-written dedup.
//   - <client>/handwritten/batch100: the hand-written batched form, BEGIN;
//     SELECT the keys seen = ANY($1); INSERT the new keys (unnest); one
//     business INSERT per new message; COMMIT; mark. pgbox: BatchSize 100,
//     whose handler is called once per new message of the batch (that is
//     what ProcessBatch and the adapters hand a handler), with the same
//     business INSERT. Same business statements on both sides: again the
//     dedup against the dedup, but each side pays the batch's 100 business
//     round trips, so the ratio cannot go far above 1.
//   - <client>/handwritten-batchwrite/batch100: what a team that batches by
//     hand writes: the same dedup, then the batch's business rows in ONE
//     statement (INSERT … SELECT FROM unnest). A per-message handler cannot
//     do that (it sees one message at a time), so pgbox's side is the same
//     as in the row above: this row is the price of the per-message handler
//     API, not of the dedup. BenchmarkConsumerBatchHandler measures the
//     batch handler (ConsumerConfig.BatchHandler), which can.
//   - <client>/price-of-exactly-once/batch1|100: the same business INSERTs
//     with no dedup at all (one autocommit INSERT per message at batch 1; one
//     transaction per batch with one INSERT per message at batch 100).
//
// pgbox runs with event-id keys (inbox.ByHeader), as the hand-written
// consumer dedups on the event id. Each run starts from a full backlog
// (benchRecords on 4 partitions: 10k, or PGBOX_BENCH_RECORDS) with a new consumer group and a fresh key
// space, nothing running; the clock runs from the group's creation to the
// records committed as seen from outside: every business row in the table
// (counted in PostgreSQL) and the group's committed offsets at the end of
// every partition (read from the broker). pgbox and the baseline alternate
// run by run, the order flipping each time. rt/msg is the database round
// trips per record (statements sent alone, plus pipelines sent with
// SendBatch, counted by a pgx tracer on the consumers' pool). PGBOX_BENCH_DELAY
// puts a delaying proxy in front of PostgreSQL (make bench-remote).
//
//	make bench PKG=./inbox/internal/consume BENCH=Consumer BENCHTIME=2x
func BenchmarkConsumer(b *testing.B) {
	env := newBenchEnv(b)
	for _, client := range []string{"sarama", "franz"} {
		for _, row := range []struct {
			vs    string
			batch int
		}{
			{"handwritten", 1}, {"handwritten", 100}, {"handwritten-batchwrite", 100},
			{"price-of-exactly-once", 1}, {"price-of-exactly-once", 100},
		} {
			b.Run(fmt.Sprintf("%s/%s/batch%d", client, row.vs, row.batch), func(b *testing.B) {
				env.interleave(b, client, "pgbox", row.vs, row.batch)
			})
		}
	}
}

// interleave runs pgbox's side of kind pg and the baseline of kind vs on
// client, b.N times each, alternating which goes first, and reports both
// rates, their ratio and both sides' round trips per record.
func (env *benchEnv) interleave(b *testing.B, client, pg, vs string, batch int) {
	var tp, tb time.Duration
	var rp, rb int64
	for i := range b.N {
		pgbox := func() {
			d, rt := env.consumeOnce(b, client, pg, batch)
			tp, rp = tp+d, rp+rt
		}
		base := func() {
			d, rt := env.consumeOnce(b, client, vs, batch)
			tb, rb = tb+d, rb+rt
		}
		if i%2 == 0 {
			pgbox()
			base()
		} else {
			base()
			pgbox()
		}
	}
	n := float64(int64(b.N) * benchRecords)
	b.ReportMetric(n/tp.Seconds(), "pgbox-msgs/s")
	b.ReportMetric(n/tb.Seconds(), "baseline-msgs/s")
	b.ReportMetric(tb.Seconds()/tp.Seconds(), "x-baseline")
	b.ReportMetric(float64(rp)/n, "pgbox-rt/msg")
	b.ReportMetric(float64(rb)/n, "baseline-rt/msg")
}

// benchCommitInterval is how often every consumer of the benchmark commits
// its marked offsets: the adapters' CommitInterval, sarama's and franz-go's
// autocommit interval of the hand-written and no-dedup consumers.
const benchCommitInterval = 100 * time.Millisecond

// roundTrips counts what a pool sends to PostgreSQL: each statement sent on
// its own (BEGIN and COMMIT included) and each pipeline (SendBatch) is one
// round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

type benchEnv struct {
	b    *bundle
	pool *pgxpool.Pool // the consumers' pool: traced, through the delay proxy when PGBOX_BENCH_DELAY is set
	rts  *roundTrips
	runs atomic.Int64
}

func newBenchEnv(tb testing.TB) *benchEnv {
	bd := setup(tb, 4)
	ctx := context.Background()
	_, err := bd.DB.Pool.Exec(ctx, benchDedupTable)
	require.NoError(tb, err)
	rts := &roundTrips{}
	cfg := bd.DB.Pool.Config()
	cfg.ConnConfig.Tracer = rts
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(tb, err)
	tb.Cleanup(traced.Close)
	env := &benchEnv{b: bd, pool: delayproxy.Pool(tb, traced), rts: rts}
	bd.ProduceEvents(tb, events("ev", int(benchRecords))...)
	// A live service's dedup tables are large and vacuumed: both start from
	// 200k earlier keys.
	_, err = bd.DB.Pool.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset")
		SELECT 'earlier-svc', 'earlier-' || i, 'events', 0, i FROM generate_series(1, 200000) AS i`)
	require.NoError(tb, err)
	_, err = bd.DB.Pool.Exec(ctx, `INSERT INTO handmade_dedup (key) SELECT 'earlier-svc:earlier-' || i FROM generate_series(1, 200000) AS i`)
	require.NoError(tb, err)
	_, err = bd.DB.Pool.Exec(ctx, `VACUUM ANALYZE pgbox_inbox, handmade_dedup`)
	require.NoError(tb, err)
	env.consumeOnce(tb, "sarama", "price-of-exactly-once", 100) // warm up
	return env
}

// consumeOnce reads every record with a new group of one member of client
// running kind, and returns the time from the group's creation to every
// record committed as seen from outside (its business row in the table and
// the group's offsets at the end of every partition), and the round trips
// the consumer's pool made meanwhile.
func (env *benchEnv) consumeOnce(tb testing.TB, client, kind string, batch int) (time.Duration, int64) {
	tb.Helper()
	ctx := context.Background()
	var before int64
	require.NoError(tb, env.b.DB.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM effects`).Scan(&before))
	admin, err := sarama.NewClusterAdmin(env.b.Addrs, kafkatest.Config())
	require.NoError(tb, err)
	defer admin.Close()
	group := fmt.Sprintf("bench-%d", env.runs.Add(1))
	rt0 := env.rts.n.Load()
	start := time.Now()
	stop := env.start(tb, client, kind, group, batch)
	deadline := start.Add(10 * time.Minute)
	rows := func() int64 {
		var n int64
		require.NoError(tb, env.b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE id > $1`, before).Scan(&n))
		return n
	}
	offsets := func() int64 {
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{env.b.Topic: {0, 1, 2, 3}})
		if err != nil {
			return -1
		}
		var sum int64
		for p := range int32(4) {
			if blk := resp.GetBlock(env.b.Topic, p); blk != nil && blk.Err == sarama.ErrNoError {
				sum += max(0, blk.Offset)
			}
		}
		return sum
	}
	// The offsets are read once the rows are all in: a commit of the last
	// offsets follows the last transaction.
	for rows() < benchRecords || offsets() < benchRecords {
		if time.Now().After(deadline) {
			tb.Fatalf("%s %s: %d of %d business rows, %d offsets committed", client, kind, rows(), benchRecords, offsets())
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	trips := env.rts.n.Load() - rt0
	stop()
	require.EqualValues(tb, benchRecords, rows(), "each record has one business row")
	require.EqualValues(tb, benchRecords, offsets(), "the group committed every offset")
	return elapsed, trips
}

func benchEffect(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	ev, _ := m.Header(eventHeader)
	_, err := tx.Exec(ctx, benchInsert, string(ev), m.Topic, m.Partition, m.Offset)
	return err
}

// start runs one member of kind on client in group; stop leaves the group.
func (env *benchEnv) start(tb testing.TB, client, kind, group string, batch int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	switch {
	case client == "sarama":
		var h sarama.ConsumerGroupHandler = env.handmade(kind, group, batch)
		if isPgbox(kind) {
			icfg, fn, cc := pgboxSide(kind, group, batch)
			ib, err := inbox.New(icfg)
			require.NoError(tb, err)
			h, err = inboxsarama.NewHandler(env.pool, ib, fn, inboxsarama.Config{ConsumerConfig: cc})
			require.NoError(tb, err)
		}
		cfg := consumetest.GroupConfig()
		cfg.Consumer.Offsets.AutoCommit.Interval = benchCommitInterval
		cg, err := sarama.NewConsumerGroup(env.b.Addrs, group, cfg)
		require.NoError(tb, err)
		wg.Go(func() {
			defer cg.Close()
			for ctx.Err() == nil {
				if err := cg.Consume(ctx, []string{env.b.Topic}, h); err != nil && ctx.Err() == nil {
					tb.Logf("consume: %v", err)
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	case isPgbox(kind):
		icfg, fn, cc := pgboxSide(kind, group, batch)
		ib, err := inbox.New(icfg)
		require.NoError(tb, err)
		c, err := inboxfranz.NewConsumer(env.pool, ib, fn, inboxfranz.Config{ConsumerConfig: cc, CommitInterval: benchCommitInterval},
			franzOpts(env.b.Addrs, group, env.b.Topic, kgo.CooperativeStickyBalancer())...)
		require.NoError(tb, err)
		wg.Go(func() {
			defer c.Close()
			if err := c.Run(ctx); err != nil {
				tb.Errorf("run: %v", err)
			}
		})
	default:
		h := env.handmade(kind, group, batch)
		opts := append(franzGroupOpts(env.b.Addrs, group, env.b.Topic, kgo.CooperativeStickyBalancer()),
			kgo.BlockRebalanceOnPoll(), kgo.AutoCommitMarks(), kgo.AutoCommitInterval(benchCommitInterval))
		cl, err := kgo.NewClient(opts...)
		require.NoError(tb, err)
		wg.Go(func() {
			defer cl.CloseAllowingRebalance()
			h.pollLoop(ctx, cl)
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
