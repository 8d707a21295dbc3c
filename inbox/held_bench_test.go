package inbox_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// PGBOX_BENCH_HELD_KEYS sets how many deleted keys the held benchmarks
// start from (default 2,000,000).
const benchHeldEnv = "PGBOX_BENCH_HELD_KEYS"

// BenchmarkProcessHeld and BenchmarkProcessBatch100Held (issue 26): Process
// and ProcessBatch after cleanup deleted millions of the consumer's keys,
// with a snapshot held (as pg_dump holds one) so that VACUUM cannot remove
// them, against the same deletes vacuumed away, in the same run. Each side
// has a database of its own (the hold is per database) holding 100,000
// live keys and N deleted ones of the partition the messages continue (so
// new keys sort among the dead ones in the unique index). Chunks alternate
// as in the other benchmarks; pgbox-msgs/s is the held side,
// baseline-msgs/s the unheld one, x-baseline their ratio.
func BenchmarkProcessHeld(b *testing.B) {
	heldInterleaved(b, pgboxOne, benchTxns, 1)
}

func BenchmarkProcessBatch100Held(b *testing.B) {
	heldInterleaved(b, pgboxBatch, benchBatches, benchBatch)
}

func heldInterleaved(b *testing.B, pg func(*testing.B) side, units, size int) {
	dead := 2_000_000
	if v := os.Getenv(benchHeldEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, benchHeldEnv)
		dead = n
	}
	compare(b, newRunnerOn(b, pg(b), heldConn(b, dead, true), int64(dead), b.N*units, size),
		newRunnerOn(b, pg(b), heldConn(b, dead, false), int64(dead), b.N*units, size), size)
}

// heldConn is benchConn in a database of its own whose inbox had dead keys
// (offsets 1..dead of partition 1 of "orders", as benchMsg names them)
// deleted, with a snapshot taken before the delete and held to the end when
// hold is set, and vacuumed otherwise.
func heldConn(b *testing.B, dead int, hold bool) *pgxpool.Conn {
	b.Helper()
	db := testdb.NewDatabase(b)
	return benchConnOn(b, db, func() {
		ctx := context.Background()
		_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", record_at)
			SELECT $1, 'orders/1/' || g, 'orders', 1, g, now() FROM generate_series(1, $2::int) g`, benchConsumer, dead)
		require.NoError(b, err)
		if hold {
			db.HoldSnapshot(b, "held-bench")
		}
		_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_inbox WHERE topic = 'orders'`)
		require.NoError(b, err)
	})
}
