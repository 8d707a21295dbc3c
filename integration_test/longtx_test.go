package integration_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestLongTransaction runs the chain beside a long REPEATABLE READ
// transaction (a reporting query, or a session left idle in transaction,
// holding its snapshot for tens of seconds). While it is open the relay keeps
// publishing and consumers keep paying, in per-key order, but the rows the
// relay deletes cannot be vacuumed. Once it ends they can: VACUUM leaves no
// dead tuples, and a second wave of the same size fits in the space the
// first one left (the outbox does not grow without bound).
func TestLongTransaction(t *testing.T) {
	checkLeaks(t)
	const keys, perKey = 16, 50
	hold := 25 * time.Second

	_, direct := newDatabase(t)
	c := newChain(t, direct, direct, newBroker(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer c.wg.Wait()
	defer cancel()
	c.startRelay(ctx, "relay-a")
	c.startConsumer(ctx, paymentsGroup, 1)
	c.startConsumer(ctx, paymentsGroup, 1)

	// The long transaction: a report over the outbox and the payments,
	// then idle in transaction with its snapshot.
	report, err := c.direct.Begin(ctx)
	require.NoError(t, err)
	defer report.Rollback(context.Background()) //nolint:errcheck // committed below; rollback after commit is a no-op
	_, err = report.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	var n int
	require.NoError(t, report.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgbox_outbox) + (SELECT count(*) FROM payments)`).Scan(&n))
	opened := time.Now()

	// Wave 1, paced over about half the hold: the relay and the consumers
	// get all of it through while the snapshot is held (the transaction stays
	// open until then, and for at least hold).
	require.NoError(t, c.write(ctx, keys, 1, perKey, 250*time.Millisecond))
	c.waitPaid(keys*perKey, 2*time.Minute)
	var xminHeld bool
	require.NoError(t, c.direct.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'idle in transaction' AND backend_xmin IS NOT NULL`).Scan(&xminHeld))
	require.True(t, xminHeld, "the long transaction holds no snapshot: the test proves nothing")
	vacuum(t, c)
	require.Positive(t, deadTuples(t, c), "VACUUM removed the relay's deleted rows despite the open snapshot")
	size1 := outboxSize(t, c)

	time.Sleep(time.Until(opened.Add(hold)))
	require.NoError(t, report.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
	require.NoError(t, report.Commit(ctx))
	t.Logf("long transaction held %s; outbox %d bytes after wave 1", time.Since(opened).Round(time.Second), size1)

	// VACUUM skips a page whose cleanup lock it cannot get at once (the
	// relay's polls pin the outbox's pages), and before PostgreSQL 15 its
	// statistics reach readers up to a second late: vacuum until it reports
	// no dead rows left.
	waitFor(t, 30*time.Second, "VACUUM to remove the dead outbox rows once the long transaction ended", func() (bool, string) {
		vacuum(t, c)
		n := deadTuples(t, c)
		return n == 0, fmt.Sprintf("%d dead tuples; snapshots held: %s", n, snapshotHolders(t, c))
	})

	// Wave 2, as large, reuses the space.
	require.NoError(t, c.write(ctx, keys, perKey+1, 2*perKey, 0))
	c.waitPaid(2*keys*perKey, 2*time.Minute)
	vacuum(t, c)
	size2 := outboxSize(t, c)
	t.Logf("outbox %d bytes after wave 2", size2)
	require.LessOrEqual(t, size2, size1, "the outbox grew although the first wave's space was free")
	c.verify(keys, 2*perKey)
}

func vacuum(t *testing.T, c *chain) {
	t.Helper()
	_, err := c.direct.Exec(context.Background(), `VACUUM pgbox_outbox`)
	require.NoError(t, err)
}

// deadTuples is pgbox_outbox's dead tuple count as the last VACUUM left it
// (the rows it could not remove).
func deadTuples(t *testing.T, c *chain) int64 {
	t.Helper()
	var n int64
	// A transaction of its own: statistics are read once per transaction.
	err := pgx.BeginFunc(context.Background(), c.direct, func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(), `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgbox_outbox'::regclass`).Scan(&n)
	})
	require.NoError(t, err)
	return n
}

// snapshotHolders lists the sessions whose snapshot holds vacuum back.
func snapshotHolders(t *testing.T, c *chain) string {
	t.Helper()
	var s string
	require.NoError(t, c.direct.QueryRow(context.Background(), `SELECT coalesce(string_agg(
		format('pid %s %s (%s) xmin %s: %s', pid, state, backend_type, backend_xmin, left(query, 60)), '; '), 'none')
		FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()`).Scan(&s))
	return s
}

func outboxSize(t *testing.T, c *chain) int64 {
	t.Helper()
	var n int64
	require.NoError(t, c.direct.QueryRow(context.Background(), `SELECT pg_table_size('pgbox_outbox')`).Scan(&n))
	return n
}
