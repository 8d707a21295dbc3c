package inbox_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
)

// Benchmarks compare pgbox with the hand-written pgx code it replaces, in the
// same run, each on its own fresh schema and one dedicated connection. Run:
//
//	make bench PKG=./inbox/... BENCH=Process
//
// One benchmark op is benchTxns transactions (benchBatches batches), so
// BENCHTIME=1x already measures thousands of messages; raise BENCHTIME (e.g.
// 5x) for steadier figures.
//
// msgs/s, the figure to compare, is the rate of the median chunk of
// benchChunk transactions (the median, as benchstat uses across runs): the two
// sides run one after the other, and when the machine or the PostgreSQL
// server (its WAL fsyncs) is shared with other work, that work's bursts land
// on one side or the other and swing the whole-run mean by ±50%, while the
// median stays within a few percent. total-msgs/s is the whole-run mean.
const (
	benchTxns    = 3000
	benchBatches = 300
	benchBatch   = 100
	benchChunk   = 20
)

const (
	benchBusinessOne  = `INSERT INTO payments (event, amount) VALUES ($1, 100)`
	benchBusinessMany = `INSERT INTO payments (event, amount) SELECT unnest($1::text[]), 100`
)

func benchConn(b *testing.B) (*pgxpool.Conn, *pgxpool.Pool) {
	b.Helper()
	db := testdb.New(b)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, event text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(b, err)
	// A live service's inbox is large and analyzed: give both sides 100,000
	// earlier keys of the same consumer, so the planner knows the consumer has
	// many rows. (On an empty, analyzed table it would scan all of the
	// consumer's index entries for `key = ANY($2)`, a plan that gets slower
	// with every batch and would handicap the baseline.)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", record_at)
		SELECT 'payments-svc', 'history/0/' || g, 'history', 0, g, now() FROM generate_series(1, 100000) g`)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE pgbox_inbox`)
	require.NoError(b, err)
	c, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	b.Cleanup(c.Release)
	return c, db.Pool
}

func benchMsg(offset int64) inbox.Message {
	return inbox.Message{Topic: "orders", Partition: 1, Offset: offset,
		Value: []byte(`{"order":"o-` + strconv.FormatInt(offset, 10) + `","amount":100}`), Timestamp: time.Now()}
}

// timeChunks runs txn n times, timing chunks of benchChunk calls, and reports
// msgs/s from the median chunk and total-msgs/s over the whole run.
func timeChunks(b *testing.B, n, msgsPerTxn int, txn func(i int) error) {
	b.Helper()
	var chunks []time.Duration
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < n; i += benchChunk {
		t0 := time.Now()
		for j := i; j < min(i+benchChunk, n); j++ {
			if err := txn(j); err != nil {
				b.Fatal(err)
			}
		}
		if i+benchChunk <= n {
			chunks = append(chunks, time.Since(t0))
		}
	}
	total := time.Since(start)
	b.StopTimer()
	slices.Sort(chunks)
	median := chunks[len(chunks)/2]
	b.ReportMetric(float64(benchChunk*msgsPerTxn)/median.Seconds(), "msgs/s")
	b.ReportMetric(float64(n*msgsPerTxn)/total.Seconds(), "total-msgs/s")
}

func BenchmarkProcess(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, txn func(c *pgxpool.Conn, off int64) error) {
		c, _ := benchConn(b)
		off := int64(0)
		for range 50 { // warm the statement caches
			off++
			require.NoError(b, txn(c, off))
		}
		timeChunks(b, b.N*benchTxns, 1, func(int) error {
			off++
			return txn(c, off)
		})
	}

	b.Run("pgbox", func(b *testing.B) {
		ib, err := inbox.New(inbox.Config{Consumer: "payments-svc"})
		require.NoError(b, err)
		run(b, func(c *pgxpool.Conn, off int64) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				_, err := ib.Process(ctx, tx, benchMsg(off), func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
					_, err := tx.Exec(ctx, benchBusinessOne, m.String())
					return err
				})
				return err
			})
		})
	})

	b.Run("baseline", func(b *testing.B) {
		run(b, func(c *pgxpool.Conn, off int64) error {
			m := benchMsg(off)
			key := m.Topic + "/" + strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10)
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", record_at)
					VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
					"payments-svc", key, m.Topic, m.Partition, m.Offset, m.Timestamp)
				if err != nil || tag.RowsAffected() == 0 {
					return err
				}
				_, err = tx.Exec(ctx, benchBusinessOne, m.String())
				return err
			})
		})
	})
}

func BenchmarkProcessBatch100(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, batch func(c *pgxpool.Conn, ms []inbox.Message) error) {
		c, _ := benchConn(b)
		off := int64(0)
		next := func() []inbox.Message {
			ms := make([]inbox.Message, benchBatch)
			for i := range ms {
				off++
				ms[i] = benchMsg(off)
			}
			return ms
		}
		for range 5 {
			require.NoError(b, batch(c, next()))
		}
		batches := make([][]inbox.Message, b.N*benchBatches) // built before timing
		for i := range batches {
			batches[i] = next()
		}
		timeChunks(b, len(batches), benchBatch, func(i int) error { return batch(c, batches[i]) })
	}

	// Both sides write the business rows the same way: one multi-row INSERT
	// per batch of the new messages.
	b.Run("pgbox", func(b *testing.B) {
		ib, err := inbox.New(inbox.Config{Consumer: "payments-svc"})
		require.NoError(b, err)
		run(b, func(c *pgxpool.Conn, ms []inbox.Message) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				events := make([]string, 0, len(ms))
				_, err := ib.ProcessBatch(ctx, tx, ms, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
					events = append(events, m.String())
					return nil
				})
				if err != nil || len(events) == 0 {
					return err
				}
				_, err = tx.Exec(ctx, benchBusinessMany, events)
				return err
			})
		})
	})

	b.Run("baseline", func(b *testing.B) {
		run(b, func(c *pgxpool.Conn, ms []inbox.Message) error {
			keys := make([]string, len(ms))
			for i, m := range ms {
				keys[i] = m.Topic + "/" + strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10)
			}
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, `SELECT key FROM pgbox_inbox WHERE consumer = $1 AND key = ANY($2)`, "payments-svc", keys)
				if err != nil {
					return err
				}
				seen, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					return err
				}
				have := make(map[string]bool, len(seen))
				for _, k := range seen {
					have[k] = true
				}
				var nk, nt, events []string
				var np []int32
				var no []int64
				var nr []pgtype.Timestamptz
				for i, m := range ms {
					if have[keys[i]] {
						continue
					}
					have[keys[i]] = true
					nk, nt, np, no = append(nk, keys[i]), append(nt, m.Topic), append(np, m.Partition), append(no, m.Offset)
					nr = append(nr, pgtype.Timestamptz{Time: m.Timestamp, Valid: true})
					events = append(events, m.String())
				}
				if len(nk) == 0 {
					return nil
				}
				if _, err := tx.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", record_at)
					SELECT $1, unnest($2::text[]), unnest($3::text[]), unnest($4::int4[]), unnest($5::int8[]), unnest($6::timestamptz[])`,
					"payments-svc", nk, nt, np, no, nr); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, benchBusinessMany, events)
				return err
			})
		})
	})
}
