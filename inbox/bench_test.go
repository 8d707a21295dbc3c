package inbox_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/delayproxy"
	"github.com/pgbox/pgbox/internal/testdb"
)

// Benchmarks compare pgbox with the hand-written pgx code it replaces, in the
// same run, each side on its own fresh schema and one dedicated connection
// (through the delaying proxy when PGBOX_BENCH_DELAY is set: make
// bench-remote):
//
//	make bench PKG=./inbox/...
//	make bench-remote PKG=./inbox/... BENCH=Interleaved BENCHTIME=3x
//
// One op is benchTxns transactions (benchBatches batches), so BENCHTIME=1x
// already measures thousands of messages. The two sides alternate chunks of
// benchChunk transactions within one run, so bursts of other work on a
// shared machine (CPU, the server's WAL fsyncs) land on both alike; each
// chunk is timed whole (every statement of its transactions, commit
// included). Each benchmark reports both sides' rates over their median
// chunk and their ratio (x-baseline).
//
// Baselines: Process against the same two statements hand-written
// (INSERT … ON CONFLICT DO NOTHING, then the business INSERT);
// ProcessBatch against the common two-step pattern (SELECT … = ANY, then
// INSERT the new keys); the watermark modes against the business INSERT
// alone, with no dedup at all. The SQL benchmarks measure ProcessSQL and
// ProcessBatchSQL in a database/sql transaction (pgx's stdlib driver, one
// connection) against Process and ProcessBatch on pgx as their baseline:
// their x-baseline is what the same guarantees cost through database/sql.
const (
	benchTxns    = 3000
	benchBatches = 300
	benchBatch   = 100
	benchChunk   = 20
)

const (
	benchConsumer     = "payments-svc"
	benchBusinessOne  = `INSERT INTO payments (event, amount) VALUES ($1, 100)`
	benchBusinessMany = `INSERT INTO payments (event, amount) SELECT unnest($1::text[]), 100`
)

// benchConn returns a dedicated connection to a fresh schema.
func benchConn(b *testing.B) *pgxpool.Conn {
	b.Helper()
	return benchConnOn(b, testdb.New(b), func() {})
}

// benchConnOn is benchConn on db, with prepare run after the seed and
// before VACUUM ANALYZE.
func benchConnOn(b *testing.B, db *testdb.DB, prepare func()) *pgxpool.Conn {
	b.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, event text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(b, err)
	// A live service's inbox is large and analyzed: give both sides 100,000
	// earlier keys of the same consumer, so the planner knows the consumer has
	// many rows. (On an empty, analyzed table it would scan all of the
	// consumer's index entries for `key = ANY($2)`, a plan that gets slower
	// with every batch and would handicap the baseline.)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", record_at)
		SELECT $1, 'history/0/' || g, 'history', 0, g, now() FROM generate_series(1, 100000) g`, benchConsumer)
	require.NoError(b, err)
	prepare()
	_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE pgbox_inbox`)
	require.NoError(b, err)
	c, err := delayproxy.Pool(b, db.Pool).Acquire(ctx)
	require.NoError(b, err)
	b.Cleanup(c.Release)
	return c
}

func benchMsg(offset int64) inbox.Message {
	return inbox.Message{Topic: "orders", Partition: 1, Offset: offset,
		Value: []byte(`{"order":"o-` + strconv.FormatInt(offset, 10) + `","amount":100}`), Timestamp: time.Now()}
}

func offsetKey(m inbox.Message) string {
	return m.Topic + "/" + strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10)
}

// A side is one way of doing a benchmark's unit of work: one transaction.
type side func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error

// pgboxOne: Process and one business INSERT per transaction.
func pgboxOne(b *testing.B) side { return pgboxOneWith(b, inbox.Config{Consumer: benchConsumer}) }

// pgboxWatermarkOne: pgboxOne in watermark mode.
func pgboxWatermarkOne(b *testing.B) side {
	return pgboxOneWith(b, inbox.Config{Consumer: benchConsumer, Dedup: inbox.DedupWatermark})
}

func pgboxOneWith(b *testing.B, cfg inbox.Config) side {
	ib, err := inbox.New(cfg)
	require.NoError(b, err)
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			_, err := ib.Process(ctx, tx, ms[0], func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				_, err := tx.Exec(ctx, benchBusinessOne, m.String())
				return err
			})
			return err
		})
	}
}

// baselineOne: the same two statements hand-written with pgx.
func baselineOne(context.Context) side {
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
		m := ms[0]
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", record_at)
				VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
				benchConsumer, offsetKey(m), m.Topic, m.Partition, m.Offset, m.Timestamp)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			_, err = tx.Exec(ctx, benchBusinessOne, m.String())
			return err
		})
	}
}

// pgboxBatch: ProcessBatch, then one multi-row business INSERT of the new
// messages (both sides write business rows the same way).
func pgboxBatch(b *testing.B) side { return pgboxBatchWith(b, inbox.Config{Consumer: benchConsumer}) }

// pgboxWatermarkBatch: pgboxBatch in watermark mode.
func pgboxWatermarkBatch(b *testing.B) side {
	return pgboxBatchWith(b, inbox.Config{Consumer: benchConsumer, Dedup: inbox.DedupWatermark})
}

func pgboxBatchWith(b *testing.B, cfg inbox.Config) side {
	ib, err := inbox.New(cfg)
	require.NoError(b, err)
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
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
	}
}

// baselineBatch: the common two-step pattern, SELECT … WHERE key = ANY($1),
// then INSERT … SELECT unnest(…) of the keys not found.
func baselineBatch(context.Context) side {
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
		keys := make([]string, len(ms))
		for i, m := range ms {
			keys[i] = offsetKey(m)
		}
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT key FROM pgbox_inbox WHERE consumer = $1 AND key = ANY($2)`, benchConsumer, keys)
			if err != nil {
				return err
			}
			seen, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			have := make(map[string]bool, len(ms))
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
				benchConsumer, nk, nt, np, no, nr); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, benchBusinessMany, events)
			return err
		})
	}
}

// plainOne: the business INSERT alone, in a transaction, no dedup.
func plainOne(context.Context) side {
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, benchBusinessOne, ms[0].String())
			return err
		})
	}
}

// plainBatch: the multi-row business INSERT alone, no dedup.
func plainBatch(context.Context) side {
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
		events := make([]string, len(ms))
		for i, m := range ms {
			events[i] = m.String()
		}
		return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, benchBusinessMany, events)
			return err
		})
	}
}

// sqlDB returns, opening it on the first call, a database/sql handle with
// one connection to c's server and schema (through the same proxy).
func sqlDB(b *testing.B, c *pgxpool.Conn, db **sql.DB) *sql.DB {
	if *db == nil {
		*db = stdlib.OpenDB(*c.Conn().Config().Copy())
		(*db).SetMaxOpenConns(1)
		b.Cleanup(func() { _ = (*db).Close() })
	}
	return *db
}

// inSQLTx runs fn in a database/sql transaction and commits it.
func inSQLTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// pgboxOneSQL: pgboxOne through database/sql (ProcessSQL).
func pgboxOneSQL(b *testing.B) side {
	ib, err := inbox.New(inbox.Config{Consumer: benchConsumer})
	require.NoError(b, err)
	var db *sql.DB
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
		return inSQLTx(ctx, sqlDB(b, c, &db), func(tx *sql.Tx) error {
			_, err := ib.ProcessSQL(ctx, tx, ms[0], func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
				_, err := tx.ExecContext(ctx, benchBusinessOne, m.String())
				return err
			})
			return err
		})
	}
}

// pgboxBatchSQL: pgboxBatch through database/sql (ProcessBatchSQL).
func pgboxBatchSQL(b *testing.B) side {
	ib, err := inbox.New(inbox.Config{Consumer: benchConsumer})
	require.NoError(b, err)
	var db *sql.DB
	return func(ctx context.Context, c *pgxpool.Conn, ms []inbox.Message) error {
		return inSQLTx(ctx, sqlDB(b, c, &db), func(tx *sql.Tx) error {
			events := make([]string, 0, len(ms))
			_, err := ib.ProcessBatchSQL(ctx, tx, ms, func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
				events = append(events, m.String())
				return nil
			})
			if err != nil || len(events) == 0 {
				return err
			}
			_, err = tx.ExecContext(ctx, benchBusinessMany, events)
			return err
		})
	}
}

// runner holds one side's connection and the messages it will process.
type runner struct {
	do    side
	c     *pgxpool.Conn
	units [][]inbox.Message
	next  int
	times []time.Duration // per chunk
	total time.Duration
}

func newRunner(b *testing.B, do side, units, size int) *runner {
	return newRunnerOn(b, do, benchConn(b), 0, units, size)
}

// newRunnerOn is newRunner on connection c, its messages' offsets following
// offset base.
func newRunnerOn(b *testing.B, do side, c *pgxpool.Conn, base int64, units, size int) *runner {
	r := &runner{do: do, c: c}
	off := base
	mk := func() []inbox.Message {
		ms := make([]inbox.Message, size)
		for i := range ms {
			off++
			ms[i] = benchMsg(off)
		}
		return ms
	}
	for range 5 { // warm the statement caches
		require.NoError(b, do(context.Background(), r.c, mk()))
	}
	r.units = make([][]inbox.Message, units)
	for i := range r.units {
		r.units[i] = mk()
	}
	return r
}

// chunk runs up to benchChunk units and records the time taken.
func (r *runner) chunk(b *testing.B) bool {
	n := min(benchChunk, len(r.units)-r.next)
	if n == 0 {
		return false
	}
	ctx := context.Background()
	t0 := time.Now()
	for _, ms := range r.units[r.next : r.next+n] {
		if err := r.do(ctx, r.c, ms); err != nil {
			b.Fatal(err)
		}
	}
	d := time.Since(t0)
	r.total += d
	if n == benchChunk {
		r.times = append(r.times, d)
	}
	r.next += n
	return true
}

// rates returns msgs/s of the median full chunk and over everything.
func (r *runner) rates(size int) (median, total float64) {
	slices.Sort(r.times)
	m := r.times[len(r.times)/2]
	return float64(benchChunk*size) / m.Seconds(), float64(len(r.units)*size) / r.total.Seconds()
}

func interleaved(b *testing.B, pg, base func(*testing.B) side, units, size int) {
	compare(b, newRunner(b, pg(b), b.N*units, size), newRunner(b, base(b), b.N*units, size), size)
}

// compare runs p's and q's chunks in turn and reports p as pgbox, q as the
// baseline.
func compare(b *testing.B, p, q *runner, size int) {
	b.ResetTimer()
	for p.chunk(b) && q.chunk(b) {
	}
	b.StopTimer()
	pm, pt := p.rates(size)
	qm, qt := q.rates(size)
	b.ReportMetric(pm, "pgbox-msgs/s")
	b.ReportMetric(qm, "baseline-msgs/s")
	b.ReportMetric(pm/qm, "x-baseline")
	b.ReportMetric(pt/qt, "x-baseline-total") // over all chunks, not the median
}

func baselineSide(f func(context.Context) side) func(*testing.B) side {
	return func(*testing.B) side { return f(context.Background()) }
}

func BenchmarkProcessInterleaved(b *testing.B) {
	interleaved(b, pgboxOne, baselineSide(baselineOne), benchTxns, 1)
}

func BenchmarkProcessBatch100Interleaved(b *testing.B) {
	interleaved(b, pgboxBatch, baselineSide(baselineBatch), benchBatches, benchBatch)
}

func BenchmarkProcessWatermarkInterleaved(b *testing.B) {
	interleaved(b, pgboxWatermarkOne, baselineSide(plainOne), benchTxns, 1)
}

func BenchmarkProcessBatch100WatermarkInterleaved(b *testing.B) {
	interleaved(b, pgboxWatermarkBatch, baselineSide(plainBatch), benchBatches, benchBatch)
}

func BenchmarkProcessSQLInterleaved(b *testing.B) {
	interleaved(b, pgboxOneSQL, pgboxOne, benchTxns, 1)
}

func BenchmarkProcessBatch100SQLInterleaved(b *testing.B) {
	interleaved(b, pgboxBatchSQL, pgboxBatch, benchBatches, benchBatch)
}
