package inboxsarama_test

import (
	"context"
	"fmt"
	"sync"
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
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// benchMessages is how many records each consumer run reads.
const benchMessages = 20_000

const benchInsert = `INSERT INTO effects (event, topic, partition, "offset") VALUES ($1, $2, $3, $4)`

// BenchmarkConsumer: records consumed per second through the adapter
// (inboxsarama.NewHandler: Process or ProcessBatch, business INSERT,
// commit, mark) against a plain sarama consumer group doing the same business
// INSERT without dedup (one autocommit INSERT per record at batch 1; one
// transaction of 100 INSERTs at batch 100). 20k records pre-produced on 4
// partitions; each run is a new consumer group reading them all. The clock
// runs from the first record handled to the last one committed, so group
// joins are not measured.
//
//	make bench PKG=./inbox/... BENCH=Consumer BENCHTIME=4x
func BenchmarkConsumer(b *testing.B) {
	env := newConsumerBench(b)
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch%d", batch), func(b *testing.B) {
			b.Run("pgbox", func(b *testing.B) { benchConsume(b, env.bundle, env.pgbox(batch), &env.runs) })
			b.Run("baseline", func(b *testing.B) { benchConsume(b, env.bundle, env.baseline(batch), &env.runs) })
		})
	}
}

// BenchmarkConsumerInterleaved is BenchmarkConsumer with the two sides
// alternating run by run (the order flipping each time), so bursts of other
// work on a shared machine hit both alike. It reports both rates and their
// ratio (x-baseline): the steadier figure.
func BenchmarkConsumerInterleaved(b *testing.B) {
	env := newConsumerBench(b)
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch%d", batch), func(b *testing.B) {
			var tp, tb time.Duration
			for i := range b.N {
				if i%2 == 0 {
					tp += consumeOnce(b, env.bundle, env.pgbox(batch), &env.runs)
					tb += consumeOnce(b, env.bundle, env.baseline(batch), &env.runs)
				} else {
					tb += consumeOnce(b, env.bundle, env.baseline(batch), &env.runs)
					tp += consumeOnce(b, env.bundle, env.pgbox(batch), &env.runs)
				}
			}
			n := float64(b.N * benchMessages)
			b.ReportMetric(n/tp.Seconds(), "pgbox-msgs/s")
			b.ReportMetric(n/tb.Seconds(), "baseline-msgs/s")
			b.ReportMetric(tb.Seconds()/tp.Seconds(), "x-baseline")
		})
	}
}

type consumerBench struct {
	b      *testing.B
	bundle *cgBundle
	runs   atomic.Int64
}

// newConsumerBench creates the schema and the broker, produces the records,
// and warms up (broker, connections, caches) with one untimed baseline run.
func newConsumerBench(b *testing.B) *consumerBench {
	db := testdb.New(b)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE effects (
		id bigserial PRIMARY KEY, event text NOT NULL, topic text NOT NULL,
		partition int NOT NULL, "offset" bigint NOT NULL)`)
	require.NoError(b, err)
	c := kafkatest.New(b, kfake.SeedTopics(4, "bench"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	env := &consumerBench{b: b, bundle: &cgBundle{db: db, kafka: c, addrs: c.ListenAddrs(), topic: "bench"}}
	env.bundle.produceEvents(b, events("ev", benchMessages)...)
	// A live service's inbox is large and vacuumed: start from 200k earlier
	// keys rather than an empty table that autovacuum keeps revisiting as it
	// grows during the runs.
	_, err = db.Pool.Exec(context.Background(), `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset")
		SELECT 'earlier-svc', 'bench/0/' || i, 'bench', 0, i FROM generate_series(1, 200000) AS i`)
	require.NoError(b, err)
	_, err = db.Pool.Exec(context.Background(), `VACUUM ANALYZE pgbox_inbox`)
	require.NoError(b, err)
	consumeOnce(b, env.bundle, env.baseline(100), &env.runs)
	return env
}

// pgbox: the adapter with the default inbox (ByOffset keys, fingerprints).
func (env *consumerBench) pgbox(batch int) makeHandler {
	return func(group string, clock *benchClock) (sarama.ConsumerGroupHandler, func() int64) {
		ib := newTestInbox(env.b, group, inbox.ByOffset())
		h := mustHandler(env.b, env.bundle.db.Pool, ib, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
			clock.begin()
			ev, _ := m.Header(eventHeader)
			_, err := tx.Exec(ctx, benchInsert, string(ev), m.Topic, m.Partition, m.Offset)
			return err
		}, inboxsarama.Options{BatchSize: batch})
		return h, func() int64 { return int64(h.Stats().Processed) }
	}
}

func (env *consumerBench) baseline(batch int) makeHandler {
	return func(group string, clock *benchClock) (sarama.ConsumerGroupHandler, func() int64) {
		h := &plainHandler{pool: env.bundle.db.Pool, batch: batch, clock: clock}
		return h, h.done.Load
	}
}

// benchClock measures from the first record handled.
type benchClock struct {
	once  sync.Once
	start time.Time
}

func (c *benchClock) begin() { c.once.Do(func() { c.start = time.Now() }) }

type makeHandler func(group string, clock *benchClock) (h sarama.ConsumerGroupHandler, done func() int64)

func benchConsume(b *testing.B, bundle *cgBundle, mk makeHandler, runs *atomic.Int64) {
	b.Helper()
	var total time.Duration
	for range b.N {
		total += consumeOnce(b, bundle, mk, runs)
	}
	b.ReportMetric(float64(b.N*benchMessages)/total.Seconds(), "msgs/s")
}

// consumeOnce reads all benchMessages records with a new consumer group and
// returns the time from the first record handled to the last one committed.
func consumeOnce(b *testing.B, bundle *cgBundle, mk makeHandler, runs *atomic.Int64) time.Duration {
	group := fmt.Sprintf("bench-%d", runs.Add(1))
	clock := &benchClock{}
	h, done := mk(group, clock)
	cg, err := sarama.NewConsumerGroup(bundle.addrs, group, cgConfig())
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, []string{bundle.topic}, h); err != nil && ctx.Err() == nil {
				b.Logf("consume: %v", err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Minute)
	for done() < benchMessages {
		if time.Now().After(deadline) {
			b.Fatalf("consumed %d of %d records", done(), benchMessages)
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(clock.start)
	cancel()
	<-finished
	require.NoError(b, cg.Close())
	require.EqualValues(b, benchMessages, done(), "each record handled once")
	return elapsed
}

// plainHandler is what a service without pgbox writes: the business INSERT,
// then MarkMessage. No dedup: a redelivery would insert again.
type plainHandler struct {
	pool  *pgxpool.Pool
	batch int
	clock *benchClock
	done  atomic.Int64
}

func (h *plainHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *plainHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *plainHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	insert := func(ctx context.Context, q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, m *sarama.ConsumerMessage) error {
		h.clock.begin()
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
			h.done.Add(1)
			continue
		}
		timer := time.NewTimer(inboxsarama.BatchWaitDefault)
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
		h.done.Add(int64(len(batch)))
	}
}
