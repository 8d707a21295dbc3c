package inboxsarama_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/delayproxy"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// benchMessages is how many records each consumer run reads.
const benchMessages = 20_000

const benchInsert = `INSERT INTO effects (event, topic, partition, "offset") VALUES ($1, $2, $3, $4)`

// BenchmarkConsumer: records consumed per second through the adapter
// (inboxsarama.NewHandler: Process or ProcessBatch, business INSERT, commit,
// mark) against a plain sarama consumer group doing the same business INSERT
// without dedup: the price of exactly-once, not pgbox's overhead (the
// hand-written dedup consumer each adapter is measured against is in
// inbox/internal/consume's BenchmarkConsumer) (one autocommit INSERT per record at batch 1; one
// transaction of 100 INSERTs at batch 100), and the same in watermark mode
// (inbox.DedupWatermark).
//
// Each run starts from a full backlog (20k records on 4 partitions) with no
// consumer running and a new consumer group; the clock starts when the group
// is created (joining is part of the work) and stops when the business rows
// of all 20k records are committed, as counted in PostgreSQL, not by a
// counter of the component. That the group's offsets then reach the end of
// every partition is checked (off the clock). The two sides alternate run by
// run, the order flipping each time, so bursts of other work on a shared
// machine hit both alike; each row reports both rates and their ratio
// (x-baseline).
//
//	make bench PKG=./inbox/... BENCH=Consumer BENCHTIME=4x
//	make bench-remote PKG=./inbox/... BENCH=Consumer   # 0.5 ms each way to PostgreSQL
func BenchmarkConsumer(b *testing.B) {
	env := newConsumerBench(b)
	for _, mode := range []string{"keys", "watermark"} {
		for _, batch := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/batch%d", mode, batch), func(b *testing.B) {
				pg := env.pgbox(batch, mode == "watermark")
				var tp, tb time.Duration
				for i := range b.N {
					if i%2 == 0 {
						tp += env.consumeOnce(b, pg)
						tb += env.consumeOnce(b, env.baseline(batch))
					} else {
						tb += env.consumeOnce(b, env.baseline(batch))
						tp += env.consumeOnce(b, pg)
					}
				}
				n := float64(b.N * benchMessages)
				b.ReportMetric(n/tp.Seconds(), "pgbox-msgs/s")
				b.ReportMetric(n/tb.Seconds(), "baseline-msgs/s")
				b.ReportMetric(tb.Seconds()/tp.Seconds(), "x-baseline")
			})
		}
	}
}

type consumerBench struct {
	b      *testing.B
	bundle *cgBundle
	pool   *pgxpool.Pool // through the delay proxy when PGBOX_BENCH_DELAY is set
	runs   atomic.Int64
}

// newConsumerBench creates the schema and the broker, produces the records,
// and warms up (broker, connections, caches) with one untimed baseline run.
func newConsumerBench(b *testing.B) *consumerBench {
	db := testdb.New(b)
	consumetest.CreateEffects(b, db)
	c := kafkatest.New(b, kfake.SeedTopics(4, "bench"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	env := &consumerBench{b: b, bundle: &cgBundle{DB: db, Kafka: c, Addrs: c.ListenAddrs(), Topic: "bench"},
		pool: delayproxy.Pool(b, db.Pool)}
	env.bundle.ProduceEvents(b, events("ev", benchMessages)...)
	// A live service's inbox is large and vacuumed: start from 200k earlier
	// keys rather than an empty table that autovacuum keeps revisiting as it
	// grows during the runs.
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset")
		SELECT 'earlier-svc', 'bench/0/' || i, 'bench', 0, i FROM generate_series(1, 200000) AS i`)
	require.NoError(b, err)
	_, err = db.Pool.Exec(context.Background(), `VACUUM ANALYZE pgbox_inbox`)
	require.NoError(b, err)
	env.consumeOnce(b, env.baseline(100))
	return env
}

// pgbox: the adapter with the default inbox (ByOffset keys, fingerprints),
// or in watermark mode.
func (env *consumerBench) pgbox(batch int, watermark bool) makeHandler {
	return func(group string) sarama.ConsumerGroupHandler {
		cfg := inbox.Config{Consumer: group}
		if watermark {
			cfg.Dedup = inbox.DedupWatermark
		}
		ib, err := inbox.New(cfg)
		require.NoError(env.b, err)
		return mustHandler(env.b, env.pool, ib, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			ev, _ := m.Header(eventHeader)
			_, err := tx.Exec(ctx, benchInsert, string(ev), m.Topic, m.Partition, m.Offset)
			return err
		}, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch}})
	}
}

func (env *consumerBench) baseline(batch int) makeHandler {
	return func(string) sarama.ConsumerGroupHandler {
		return &plainHandler{pool: env.pool, batch: batch}
	}
}

type makeHandler func(group string) sarama.ConsumerGroupHandler

// consumeOnce reads all benchMessages records with a new consumer group and
// returns the time from the group's creation to the last business row
// committed; then it checks that the group committed every offset.
func (env *consumerBench) consumeOnce(b *testing.B, mk makeHandler) time.Duration {
	b.Helper()
	ctx := context.Background()
	var before int64
	require.NoError(b, env.bundle.DB.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM effects`).Scan(&before))
	group := fmt.Sprintf("bench-%d", env.runs.Add(1))
	h := mk(group)

	start := time.Now()
	cg, err := sarama.NewConsumerGroup(env.bundle.Addrs, group, cgConfig())
	require.NoError(b, err)
	cctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for cctx.Err() == nil {
			if err := cg.Consume(cctx, []string{env.bundle.Topic}, h); err != nil && cctx.Err() == nil {
				b.Logf("consume: %v", err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	deadline := start.Add(10 * time.Minute)
	rows := func() int64 {
		var n int64
		require.NoError(b, env.bundle.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE id > $1`, before).Scan(&n))
		return n
	}
	for rows() < benchMessages {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d business rows committed", rows(), benchMessages)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	testutil.Eventually(b, time.Minute, "the group's offsets committed", func() bool {
		var sum int64
		for p := range int32(4) {
			sum += max(0, env.bundle.Committed(b, group, p))
		}
		return sum == benchMessages
	})
	cancel()
	<-finished
	require.NoError(b, cg.Close())
	require.EqualValues(b, benchMessages, rows(), "each record has one business row")
	return elapsed
}

// plainHandler is what a service without pgbox writes: the business INSERT,
// then MarkMessage. No dedup: a redelivery would insert again.
type plainHandler struct {
	pool  *pgxpool.Pool
	batch int
}

func (h *plainHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *plainHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *plainHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	insert := func(ctx context.Context, q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, m *sarama.ConsumerMessage) error {
		var ev string
		for _, hd := range m.Headers {
			if string(hd.Key) == eventHeader {
				ev = string(hd.Value)
			}
		}
		_, err := q.Exec(ctx, benchInsert, ev, m.Topic, m.Partition, m.Offset)
		return err
	}
	for {
		var batch []*sarama.ConsumerMessage
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			batch = append(batch, m)
		}
		if h.batch == 1 {
			if err := insert(ctx, h.pool, batch[0]); err != nil {
				return err
			}
			sess.MarkMessage(batch[0], "")
			continue
		}
		timer := time.NewTimer(inbox.BatchWaitDefault)
	fill:
		for len(batch) < h.batch {
			select {
			case m, ok := <-claim.Messages():
				if !ok {
					break fill
				}
				batch = append(batch, m)
			case <-timer.C:
				break fill
			}
		}
		timer.Stop()
		tx, err := h.pool.Begin(ctx)
		if err != nil {
			return err
		}
		for _, m := range batch {
			if err := insert(ctx, tx, m); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		sess.MarkMessage(batch[len(batch)-1], "")
	}
}
