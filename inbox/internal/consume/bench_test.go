package consume_test

import (
	"context"
	"fmt"
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
	"github.com/pgbox/pgbox/internal/testutil"
)

// benchRecords is how many records each consumer run reads.
const benchRecords = 10_000

const (
	benchInsert = `INSERT INTO effects (event, topic, partition, "offset") VALUES ($1, $2, $3, $4)`
	// The hand-written consumer's own dedup table and its two statements.
	benchDedupTable  = `CREATE TABLE handmade_dedup (key text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`
	benchDedupOne    = `INSERT INTO handmade_dedup (key) VALUES ($1) ON CONFLICT DO NOTHING`
	benchDedupSeen   = `SELECT key FROM handmade_dedup WHERE key = ANY($1)`
	benchDedupInsert = `INSERT INTO handmade_dedup (key) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`
)

// BenchmarkConsumer: records consumed per second through each adapter,
// against what a team writes by hand instead of pgbox on the same client,
// and against no dedup at all:
//
//   - handwritten: the common pattern, on the same client with the same
//     per-partition concurrency: its own dedup table, per message BEGIN;
//     INSERT key ON CONFLICT DO NOTHING; business INSERT if new; COMMIT;
//     mark the offset. Batched: BEGIN; SELECT the keys seen = ANY($1); INSERT
//     the new keys; the business INSERTs; COMMIT; mark.
//   - price-of-exactly-once: the same business INSERTs with no dedup (one
//     autocommit INSERT per message at batch 1; one transaction per batch).
//
// pgbox runs with event-id keys (inbox.ByHeader), as the hand-written
// consumer dedups on the event id. Each run starts from a full backlog
// (10k records on 4 partitions) with a new consumer group and a fresh key
// space; the clock runs from the group's creation to the last business row
// committed, counted in PostgreSQL; the group's offsets reaching the end is
// checked off the clock. pgbox and the baseline alternate run by run, the
// order flipping each time. PGBOX_BENCH_DELAY puts a delaying proxy in front
// of PostgreSQL (make bench-remote).
//
//	make bench PKG=./inbox/internal/consume BENCH=Consumer BENCHTIME=4x
func BenchmarkConsumer(b *testing.B) {
	env := newBenchEnv(b)
	for _, client := range []string{"sarama", "franz"} {
		for _, vs := range []string{"handwritten", "price-of-exactly-once"} {
			for _, batch := range []int{1, 100} {
				b.Run(fmt.Sprintf("%s/%s/batch%d", client, vs, batch), func(b *testing.B) {
					var tp, tb time.Duration
					for i := range b.N {
						pg := func() { tp += env.consumeOnce(b, client, "pgbox", batch) }
						base := func() { tb += env.consumeOnce(b, client, vs, batch) }
						if i%2 == 0 {
							pg()
							base()
						} else {
							base()
							pg()
						}
					}
					n := float64(b.N * benchRecords)
					b.ReportMetric(n/tp.Seconds(), "pgbox-msgs/s")
					b.ReportMetric(n/tb.Seconds(), "baseline-msgs/s")
					b.ReportMetric(tb.Seconds()/tp.Seconds(), "x-baseline")
				})
			}
		}
	}
}

type benchEnv struct {
	b    *bundle
	pool *pgxpool.Pool // through the delay proxy when PGBOX_BENCH_DELAY is set
	runs atomic.Int64
}

func newBenchEnv(tb testing.TB) *benchEnv {
	bd := setup(tb, 4)
	ctx := context.Background()
	_, err := bd.DB.Pool.Exec(ctx, benchDedupTable)
	require.NoError(tb, err)
	env := &benchEnv{b: bd, pool: delayproxy.Pool(tb, bd.DB.Pool)}
	bd.ProduceEvents(tb, events("ev", benchRecords)...)
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
// running kind, and returns the time from the group's creation to the last
// business row committed; then it checks the group committed every offset.
func (env *benchEnv) consumeOnce(tb testing.TB, client, kind string, batch int) time.Duration {
	tb.Helper()
	ctx := context.Background()
	var before int64
	require.NoError(tb, env.b.DB.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM effects`).Scan(&before))
	group := fmt.Sprintf("bench-%d", env.runs.Add(1))
	start := time.Now()
	stop := env.start(tb, client, kind, group, batch)
	deadline := start.Add(10 * time.Minute)
	rows := func() int64 {
		var n int64
		require.NoError(tb, env.b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE id > $1`, before).Scan(&n))
		return n
	}
	for rows() < benchRecords {
		if time.Now().After(deadline) {
			tb.Fatalf("%s %s: %d of %d business rows committed", client, kind, rows(), benchRecords)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	testutil.Eventually(tb, time.Minute, "the group's offsets committed", func() bool {
		var sum int64
		for p := range int32(4) {
			sum += max(0, env.b.Committed(tb, group, p))
		}
		return sum == benchRecords
	})
	stop()
	require.EqualValues(tb, benchRecords, rows(), "each record has one business row")
	return elapsed
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
		var h sarama.ConsumerGroupHandler = &handmade{env: env, group: group, batch: batch, dedup: kind == "handwritten"}
		if kind == "pgbox" {
			ib, err := inbox.New(inbox.Config{Consumer: group, Key: inbox.ByHeader(eventHeader)})
			require.NoError(tb, err)
			h, err = inboxsarama.NewHandler(env.pool, ib, benchEffect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch}})
			require.NoError(tb, err)
		}
		cfg := consumetest.GroupConfig()
		cfg.Consumer.Offsets.AutoCommit.Interval = time.Second
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
	case kind == "pgbox":
		ib, err := inbox.New(inbox.Config{Consumer: group, Key: inbox.ByHeader(eventHeader)})
		require.NoError(tb, err)
		c, err := inboxfranz.NewConsumer(env.pool, ib, benchEffect, inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch}},
			franzOpts(env.b.Addrs, group, env.b.Topic, kgo.CooperativeStickyBalancer())...)
		require.NoError(tb, err)
		wg.Go(func() {
			defer c.Close()
			if err := c.Run(ctx); err != nil {
				tb.Errorf("run: %v", err)
			}
		})
	default:
		h := &handmade{env: env, group: group, batch: batch, dedup: kind == "handwritten"}
		opts := append(franzGroupOpts(env.b.Addrs, group, env.b.Topic, kgo.CooperativeStickyBalancer()),
			kgo.BlockRebalanceOnPoll(), kgo.AutoCommitMarks(), kgo.AutoCommitInterval(time.Second))
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
