package relay_test

// Review of 00170's first version (4fa6073: the writers' trigger counted
// each move forward of a reset sequence, and the claim forgot its floors
// when the count changed): resets the count never saw. What landed instead
// (00170, floor.go's recorded) keeps the relay's settled bound at or below
// the seq_hw each sample's claim left, and moves a sequence set back
// mid-statement forward in the row trigger. Each test FAILS on 4fa6073.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/relay"
)

// settledAboveHW runs a relay on b until it has settled a sequence value S
// above seq_hw H (claims raise seq_hw only once it trails by more than 64)
// and drained the outbox; it returns S and H.
func settledAboveHW(t *testing.T, b *testBundle) (last, hw int64) {
	t.Helper()
	ctx := context.Background()
	seq := func() (last, hw int64) {
		t.Helper()
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_sequence_last_value('pgbox_outbox_id_seq'),
			(SELECT seq_hw FROM pgbox_relay_marker)`).Scan(&last, &hw))
		return last, hw
	}
	drained := func() bool { return b.outboxCount(t, "true") == 0 }
	for i := range 100 {
		b.write(t, msg(b.topic, "warm", strconv.Itoa(i)))
	}
	waitFor(t, "drained", drained)
	for i := 0; ; i++ {
		if last, hw := seq(); last-hw >= 8 {
			break
		}
		b.write(t, msg(b.topic, "warm", "more-"+strconv.Itoa(i)))
		waitFor(t, "drained", drained)
	}
	time.Sleep(time.Second) // claims settle the last sample, floors move up to seq_hw+1
	return seq()
}

// hwAttack starts a relay on a new bundle, its sweep an hour away (a row
// left below the floors stays there), and settles a sequence value above
// seq_hw (settledAboveHW).
func hwAttack(t *testing.T) (b *testBundle, cfg relay.Config, last, hw int64) {
	t.Helper()
	b = setup(t)
	cfg = b.config("a")
	cfg.SweepInterval = time.Hour
	start(t, cfg)
	last, hw = settledAboveHW(t, b)
	return b, cfg, last, hw
}

// queueClaimBlocker queues a request for the lock every claim takes first
// behind the claim holding it now (which waits on something else): once
// that claim has ended, no claim reads the sequence until blocker ends.
// locked returns once the request is granted.
func queueClaimBlocker(t *testing.T, b *testBundle) (blocker pgx.Tx, locked func()) {
	t.Helper()
	ctx := context.Background()
	blocker, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = blocker.Rollback(ctx) })
	var pid int32
	require.NoError(t, blocker.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	got := make(chan error, 1)
	go func() {
		_, err := blocker.Exec(ctx, `LOCK TABLE pgbox_outbox_rewinds IN EXCLUSIVE MODE`)
		got <- err
	}()
	waitFor(t, "the blocker queues behind the waiting claim", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE pid = $1 AND wait_event_type = 'Lock'`, pid).Scan(&n))
		return n > 0
	})
	return blocker, func() { t.Helper(); require.NoError(t, <-got) }
}

// insertGate is the advisory lock key resetDuringInsert's next statement
// waits on (a lock is the database's, the tests' schemas share it).
var insertGate atomic.Int64

// resetDuringInsert runs on exec an INSERT ... SELECT of rows rows of key
// whose row number wait is slow to compute (it waits on an advisory lock a
// session holds), sets the sequence back to 5 while it waits, and returns
// the statement's error.
func resetDuringInsert(t *testing.T, b *testBundle, exec interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, key string, rows, wait int) error {
	t.Helper()
	ctx := context.Background()
	lockKey := 170170 + insertGate.Add(1)
	gate, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer gate.Release()
	_, err = gate.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey)
	require.NoError(t, err)
	defer func() { _, _ = gate.Exec(ctx, `SELECT pg_advisory_unlock_all()`) }()
	wrote := make(chan error, 1)
	go func() {
		_, err := exec.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
			SELECT $1, $2, g::text::bytea FROM generate_series(1, $3::int) g
			 WHERE CASE WHEN g = $4 THEN pg_advisory_xact_lock_shared($5)::text = '' ELSE true END`, b.topic, key, rows, wait, lockKey)
		wrote <- err
	}()
	waitFor(t, "the statement waits at row "+strconv.Itoa(wait), func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND objid = $1`, lockKey).Scan(&n))
		return n > 0
	})
	_, err = b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)
	_, err = gate.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockKey)
	require.NoError(t, err)
	return <-wrote
}

// blockClaims holds the lock every claim takes first (after any claim in
// flight ended): no claim reads the sequence until release is called.
func blockClaims(t *testing.T, b *testBundle) (release func()) {
	t.Helper()
	ctx := context.Background()
	blocker, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = blocker.Exec(ctx, `LOCK TABLE pgbox_outbox_rewinds IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	done := false
	release = func() {
		if !done {
			done = true
			require.NoError(t, blocker.Commit(ctx))
		}
	}
	t.Cleanup(release)
	return release
}

func arrivedKey(t *testing.T, b *testBundle, key string, want int, within time.Duration) map[string]int {
	return valuesArrived(t, b, want, within, func(m *sarama.ConsumerMessage) bool { return string(m.Key) == key })
}

// ATTACK 1. An operator sets the sequence back to a value at or above
// seq_hw but below what the relay read and settled (seq_hw trails the
// claims' reads by up to 64). The writers' trigger finds the sequence at
// or above seq_hw: no move forward (nothing counted, on 4fa6073). One writer takes the
// first id again and holds it; another writes enough rows to carry the
// sequence past what the relay saw before any claim reads it (here the
// claims wait on a lock; under load, any slow claim or a busy writer).
// No claim ever reads the sequence lower than before, the count did not
// change, so the ident is the same: the relay keeps its settled bound from
// before the reset. Once a claim raises seq_hw past it, the floors pass
// the held row; when its writer ends, the rescan starts at that settled
// bound, above the row. The row waits for the sweep (an hour here).
// FAILS on 4fa6073.
func TestAttack170ResetAtOrAboveSeqHWIsNotCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, cfg, last, hw := hwAttack(t)

	release := blockClaims(t, b)
	_, err := b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', $1)`, hw)
	require.NoError(t, err)
	held, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = held.Rollback(ctx) }()
	var heldID int64
	require.NoError(t, held.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ($1, 'held', 'held')
		RETURNING id`, b.topic).Scan(&heldID))
	require.Equal(t, hw+1, heldID, "an id the relay read and settled is handed out again")
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
		SELECT $1, 'busy', g::text::bytea FROM generate_series(1, 100) g`, b.topic)
	require.NoError(t, err)
	var now int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_sequence_last_value('pgbox_outbox_id_seq')`).Scan(&now))
	require.Greater(t, now, last, "the sequence is past what the relay saw before any claim read it")
	t.Logf("settled %d, seq_hw %d; reset to %d; held row %d; sequence now %d", last, hw, hw, heldID, now)
	release()

	waitFor(t, "the busy rows published", func() bool { return b.outboxCount(t, "key = 'busy'") == 0 })
	time.Sleep(10 * cfg.PollInterval) // claims move the floors
	require.NoError(t, held.Commit(ctx))
	require.Len(t, arrivedKey(t, b, "held", 1, 10*time.Second), 1,
		"the held row published (left in the outbox: %d)", b.outboxCount(t, "true"))
}

// ATTACK 2. A writer's statement trigger runs (it takes the transaction id
// and finds the sequence above seq_hw: nothing to move), then an operator
// sets the sequence back, then the statement's rows take their ids: an
// INSERT ... SELECT whose first row is slow to compute (here it waits on an
// advisory lock), or a COPY. Its rows take ids below the relay's floors
// and settled bound (the row trigger gives each a fresh id, from the same
// reset sequence: below them too); the statement carries the sequence past
// what the relay saw before any claim reads it. Nothing is counted, the
// ident is the same; the writer is a long writer to the relay, and its
// end rescans from the settled bound, above its rows: when the writer
// commits, its rows below the floors wait for the sweep. FAILS on 4fa6073.
func TestAttack170ResetBetweenStatementTriggerAndIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, cfg, last, hw := hwAttack(t)

	release := blockClaims(t, b)
	writer, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	require.NoError(t, resetDuringInsert(t, b, writer, "slow", 200, 1))
	var now, low int64
	require.NoError(t, writer.QueryRow(ctx, `SELECT pg_sequence_last_value('pgbox_outbox_id_seq'),
		(SELECT count(*) FROM pgbox_outbox WHERE key = 'slow' AND id <= $1)`, hw).Scan(&now, &low))
	t.Logf("settled %d, seq_hw %d; reset to 5; sequence now %d; rows at or below seq_hw %d", last, hw, now, low)
	// On 4fa6073 about 30 of them (ids 7, 9, .. up to seq_hw: the row
	// trigger's fresh ids come from the same reset sequence); with the row
	// trigger moving the sequence forward, none.
	require.Greater(t, now, last, "the sequence is past what the relay saw before any claim read it")
	release()
	// Other writers go on; the claims probe every slot and move the floors.
	b.write(t, msg(b.topic, "busy", "1"))
	waitFor(t, "the busy row published", func() bool { return b.outboxCount(t, "key = 'busy'") == 0 })
	time.Sleep(10 * cfg.PollInterval)
	require.NoError(t, writer.Commit(ctx))

	got := arrivedKey(t, b, "slow", 200, 15*time.Second)
	require.Len(t, got, 200, "every row of the statement published (left in the outbox: %d)", b.outboxCount(t, "true"))
}

// ATTACK 3, end to end. A claim reads the sequence, then waits (here on the
// marker table, behind a session's ACCESS EXCLUSIVE request queued behind
// a writer that holds the table; under load, any slow claim) while an
// operator sets the sequence back and that writer's trigger moves it
// forward to seq_hw (counted, on 4fa6073, and the claim then read the new
// count: its ident was the new one, nothing "moved" in its rows
// statement). The claim returns its sequence read from before the reset,
// and the relay records it as a sample. A writer that starts after that
// claim's batch is recorded takes an id between seq_hw and that sample
// and holds it, and the writers carry the sequence past the sample before
// a claim reads it lower (here the claims wait on a lock): the sample
// settles while the held writer runs (its transaction id is above the
// sample's), and once seq_hw rises the floors pass its row; when it
// commits, the rescan starts above it. FAILS on 4fa6073.
func TestAttack170CountReadAfterSequenceLosesARow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, cfg, last, hw := hwAttack(t)

	writer, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	_, err = writer.Exec(ctx, `SELECT seq_hw FROM pgbox_relay_marker`) // holds ACCESS SHARE on the marker
	require.NoError(t, err)
	locker, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(ctx) }()
	var lockerPID int32
	require.NoError(t, locker.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&lockerPID))
	locked := make(chan error, 1)
	go func() {
		_, err := locker.Exec(ctx, `LOCK TABLE pgbox_relay_marker IN ACCESS EXCLUSIVE MODE`)
		locked <- err
	}()
	waitFor(t, "a claim waits behind the locker, after its sequence read", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE '%pgbox_outbox_claim2%'`, lockerPID).Scan(&n))
		return n > 0
	})
	_, err = b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)
	var firstID int64
	require.NoError(t, writer.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ($1, 'first', 'first')
		RETURNING id`, b.topic).Scan(&firstID))
	require.Equal(t, hw+1, firstID, "moved forward to seq_hw")
	require.NoError(t, writer.Commit(ctx))
	require.NoError(t, <-locked)
	// Claims wait (the lock a claim takes first) once the waiting claim
	// has ended: none reads the sequence lower than that claim's sample
	// before the writers below carry it past.
	blocker, blocked := queueClaimBlocker(t, b)
	require.NoError(t, locker.Rollback(ctx))
	blocked()
	// The waiting claim took the first row; its batch is recorded (the
	// next claim records it before it waits on the blocker).
	require.Len(t, arrivedKey(t, b, "first", 1, 10*time.Second), 1)
	waitFor(t, "the first row recorded", func() bool { return b.outboxCount(t, "true") == 0 })
	time.Sleep(2 * cfg.PollInterval)

	held, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = held.Rollback(ctx) }()
	var heldID int64
	require.NoError(t, held.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ($1, 'held', 'held')
		RETURNING id`, b.topic).Scan(&heldID))
	require.LessOrEqual(t, heldID, last, "an id the relay read before the reset is handed out again")
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
		SELECT $1, 'busy', g::text::bytea FROM generate_series(1, 100) g`, b.topic)
	require.NoError(t, err)
	require.NoError(t, blocker.Commit(ctx))
	waitFor(t, "the busy rows published", func() bool { return b.outboxCount(t, "key = 'busy'") == 0 })
	time.Sleep(10 * cfg.PollInterval) // claims move the floors
	t.Logf("read %d, seq_hw %d; the first row %d, the held row %d", last, hw, firstID, heldID)
	require.NoError(t, held.Commit(ctx))
	require.Len(t, arrivedKey(t, b, "held", 1, 10*time.Second), 1,
		"the held row published (left in the outbox: %d)", b.outboxCount(t, "true"))
}
