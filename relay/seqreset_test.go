package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A claim reads the sequence and then waits on the marker row (a session
// holds it here; under load, any slow claim) while an operator sets the
// sequence back and the first writer after that takes its id: its
// trigger moves the sequence forward to the seq_hw it reads, the one from
// before that claim. The claim then raises seq_hw to what it read before
// the reset, the next writer moves the sequence past that, and no claim
// ever reads the sequence lower than before. The relay's settled bound,
// held down to the old seq_hw until then, lets the floors pass the first
// writer's row while it is uncommitted: the row waited for the sweep
// (here an hour), and a key's later row went out before it
// (TestAttack150SequenceResetOverDeadRows/setval, under make test in stop
// 51). The relay now records each sample at most at the seq_hw its claim
// left (floor.go's recorded; migration 00170's header). FAILS on dd543d8:
// the second writer's row is never published.
func TestSequenceResetUnderALateClaimKeepsFirstRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, cfg, _, hw := hwAttack(t)

	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	var holderPID int32
	require.NoError(t, holder.QueryRow(ctx, `SELECT pg_backend_pid() FROM pgbox_relay_marker FOR UPDATE`).Scan(&holderPID))
	// A thousand ids without rows: the next claim reads the sequence far
	// above seq_hw, raises it, and waits for the holder.
	_, err = b.db.Pool.Exec(ctx, `SELECT nextval('pgbox_outbox_id_seq') FROM generate_series(1, 1000)`)
	require.NoError(t, err)
	waitFor(t, "a claim waits on the marker row", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE '%pgbox_outbox_claim2%'`, holderPID).Scan(&n))
		return n > 0
	})

	_, err = b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)
	// The first writer's trigger moves the sequence forward to the seq_hw
	// it reads (and holds the lock that serializes such moves until it
	// commits); the second's finds it moved and takes the next id.
	insert := func(tx pgx.Tx, key string) (id int64) {
		t.Helper()
		require.NoError(t, tx.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ($1, $2, '1') RETURNING id`,
			b.topic, key).Scan(&id))
		return id
	}
	first, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	second, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = second.Rollback(ctx) }()
	firstID, secondID := insert(first, "first"), insert(second, "second")
	require.Equal(t, []int64{hw + 1, hw + 2}, []int64{firstID, secondID}, "the sequence moved forward to the seq_hw the writers read")
	require.NoError(t, first.Commit(ctx))

	// Claims wait (the lock a claim takes first) once the waiting claim
	// has ended: so none reads the sequence before the next writer moves
	// it past what that claim read.
	blocker, blocked := queueClaimBlocker(t, b)
	require.NoError(t, holder.Commit(ctx)) // the claim goes on, raises seq_hw, ends
	blocked()
	var hwNow int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT seq_hw FROM pgbox_relay_marker`).Scan(&hwNow))
	require.Greater(t, hwNow, hw+900, "the waiting claim raised seq_hw to what it read before the reset")
	b.write(t, msg(b.topic, "next", "1"))
	var nextID int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id FROM pgbox_outbox WHERE key = 'next'`).Scan(&nextID))
	require.Greater(t, nextID, hwNow, "the next writer's trigger moved the sequence past the raised seq_hw")
	require.NoError(t, blocker.Commit(ctx))
	t.Logf("seq_hw %d, then %d; the writers' rows %d, %d and %d", hw, hwNow, firstID, secondID, nextID)
	require.Len(t, arrivedKey(t, b, "first", 1, 15*time.Second), 1)
	require.Len(t, arrivedKey(t, b, "next", 1, 15*time.Second), 1)
	time.Sleep(5 * cfg.PollInterval) // claims move the floors
	require.NoError(t, second.Commit(ctx))
	require.Len(t, arrivedKey(t, b, "second", 1, 10*time.Second), 1,
		"the second writer's row published (left in the outbox: %d)", b.outboxCount(t, "true"))
}
