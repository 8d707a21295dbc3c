package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// writeCounted runs the business transaction the ordering tests use: bump
// the key's counter (which serializes writers of one key, as a business row
// lock does) and write the new count as the event.
func writeCounted(ctx context.Context, b *testBundle, key string) error {
	return pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, `UPDATE counters SET n = n + 1 WHERE key = $1 RETURNING n`, key).Scan(&n); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, outbox.Message{Topic: b.topic, Key: []byte(key), Value: []byte(strconv.Itoa(n))})
	})
}

func createCounters(t testing.TB, b *testBundle, keys int) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE counters (key text PRIMARY KEY, n int NOT NULL DEFAULT 0);
		INSERT INTO counters (key) SELECT 'key-' || lpad(g::text, 3, '0') FROM generate_series(0, `+strconv.Itoa(keys-1)+`) g`)
	require.NoError(t, err)
}

// checkOrder asserts what a consumer sees: every count 1..n of every key,
// each key on one partition, and in order once duplicates are dropped
// (a duplicate repeats an earlier record: same value, same event id). It
// returns the number of duplicates.
func checkOrder(t testing.TB, b *testBundle, got []*sarama.ConsumerMessage) int {
	t.Helper()
	want := map[string]int{}
	rows, err := b.db.Pool.Query(context.Background(), `SELECT key, n FROM counters`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		want[k] = n
	}
	require.NoError(t, rows.Err())

	partition := map[string]int32{}
	next := map[string]int{}
	eventOf := map[string]string{} // key/count → event id
	dups := 0
	for _, m := range got { // ordered by (partition, offset)
		k := string(m.Key)
		n, err := strconv.Atoi(string(m.Value))
		require.NoError(t, err)
		if p, ok := partition[k]; ok {
			require.Equal(t, p, m.Partition, "key %s on two partitions", k)
		}
		partition[k] = m.Partition
		id, ok := header(m, relay.EventIDHeader)
		require.True(t, ok)
		kn := fmt.Sprintf("%s/%d", k, n)
		if n <= next[k] { // seen before: a duplicate
			require.Equal(t, eventOf[kn], id, "duplicate of %s carries the same event id", kn)
			dups++
			continue
		}
		require.Equal(t, next[k]+1, n, "key %s: count %d follows %d (out of order or lost)", k, n, next[k])
		next[k] = n
		eventOf[kn] = id
	}
	for k, n := range want {
		require.Equal(t, n, next[k], "key %s: all %d events arrived", k, n)
	}
	return dups
}

// 8 concurrent writers × 3 relay instances on 12 shared keys; one instance
// leaves and another joins mid-run. Every key's events arrive on one
// partition, in commit order.
func TestConcurrentWritersAndRelaysKeepKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const keys, writers, perWriter = 12, 8, 50
	createCounters(t, b, keys)

	cfgs := make([]func() *running, 0)
	_ = cfgs
	small := func(name string) *running {
		cfg := b.config(name)
		cfg.BatchSize = 16 // many small batches: more interleaving
		return start(t, cfg)
	}
	r1, r2, r3 := small("r1"), small("r2"), small("r3")
	_, _ = r1, r3

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for range perWriter {
				if err := writeCounted(ctx, b, keyed(rng.IntN(keys))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Churn while writers run: r2 leaves, r4 joins.
	waitFor(t, "some events published", func() bool { return r1.r.Stats().Published+r3.r.Stats().Published > 50 })
	r2.stop(t)
	small("r4")
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	got := readEvents(t, b, writers*perWriter)
	require.GreaterOrEqual(t, len(got), writers*perWriter)
	dups := checkOrder(t, b, got)
	t.Logf("%d records, %d duplicates", len(got), dups)
	waitFor(t, "outbox emptied", func() bool { return b.outboxCount(t, "true") == 0 })
}
