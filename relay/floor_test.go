package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// floorBundle is one relay's claim loop without Kafka: claims take rows,
// "publishing" them is deleting them with the finish statement, and the
// floors move as after a real batch.
type floorBundle struct {
	t  *testing.T
	db *testdb.DB
	r  *Relay
}

func newFloorBundle(t *testing.T) *floorBundle {
	t.Helper()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, createLanesSQL, 1)
	require.NoError(t, err)
	var held, released, live int
	require.NoError(t, db.Pool.QueryRow(ctx, heartbeatSQL, "me", "1 hour", 1, "0s", true, false).Scan(&held, &released, &live, new(int), new(int)))
	r := testRelay(Config{Pool: db.Pool, BatchSize: 500, Lanes: 1}, "me")
	// The lease the heartbeat above took, as the relay's own heartbeat
	// records it: a relay claims only under a confirmed lease.
	r.t0 = time.Now()
	r.leaseUntil.Store(int64(time.Hour))
	return &floorBundle{t: t, db: db, r: r}
}

// writeRows commits n rows over keys keys, 100 to a transaction.
func (b *floorBundle) writeRows(n, keys int, prefix string) {
	b.writeKeys(n, func(j int) []byte { return fmt.Appendf(nil, "%s-%d", prefix, j%keys) })
}

// writeKeys commits n rows, row j with key key(j), 100 to a transaction.
func (b *floorBundle) writeKeys(n int, key func(j int) []byte) {
	ctx := context.Background()
	for i := 0; i < n; i += 100 {
		msgs := make([]outbox.Message, 0, 100)
		for j := i; j < min(n, i+100); j++ {
			msgs = append(msgs, outbox.Message{Topic: "t", Key: key(j), Value: []byte("v")})
		}
		require.NoError(b.t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
	}
}

// drain claims and "publishes" until a claim finds nothing; it returns the
// ids taken.
func (b *floorBundle) drain() []int64 { return b.drainOnly(nil) }

// settle claims until slot's floor has passed every row written so far.
// Floors rise only past ids no running writing transaction can still
// commit below, and that horizon is the cluster's: another test's writing
// transaction holds it for as long as it runs.
func (b *floorBundle) settle(slot int) {
	ctx := context.Background()
	var top int64
	require.NoError(b.t, b.db.Pool.QueryRow(ctx, `SELECT pg_sequence_last_value(pg_get_serial_sequence('pgbox_outbox', 'id'))`).Scan(&top))
	deadline := time.Now().Add(time.Minute)
	for b.r.floors.floor[slot] <= top {
		require.True(b.t, time.Now().Before(deadline), "slot %d's floor stayed at %d below %d for a minute", slot, b.r.floors.floor[slot], top)
		require.Empty(b.t, b.drain())
		time.Sleep(20 * time.Millisecond)
	}
}

// claimBlocks is how many blocks of pgbox_outbox_claim_idx one claim of
// slot reads, from its floor or from the slot's start.
func (b *floorBundle) claimBlocks(slot int32, useFloors bool) int64 {
	ctx := context.Background()
	args := b.r.testClaimArgs([]int32{slot}, 125, 500)
	if !useFloors {
		args[3] = []int64{0} // the slot's floor
	}
	var blocks int64
	require.NoError(b.t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		const fetched = `SELECT pg_stat_get_xact_blocks_fetched('pgbox_outbox_claim_idx'::regclass)`
		var before, after int64
		if err := tx.QueryRow(ctx, fetched).Scan(&before); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, claimSQL, args...)
		if err != nil {
			return err
		}
		rows.Close()
		if err := tx.QueryRow(ctx, fetched).Scan(&after); err != nil {
			return err
		}
		blocks = after - before
		return rows.Err()
	}))
	return blocks
}

// Under a held xmin horizon every published row's index entry stays, and a
// claim that starts at a slot's first entry walks all of them: its cost
// grows for as long as the hold lasts (the issue measured 976 blocks for a
// one-slot claim against 3). The floor starts the slot past them, so the
// blocks one claim reads stay flat as dead rows pile up.
func TestFloorHeldHorizon(t *testing.T) {
	t.Parallel()
	b := newFloorBundle(t)
	b.db.HoldSnapshot(t, "floor-test")
	// Keys of one slot, so its dead entries fill many index pages.
	const busy = 7
	var keys [][]byte
	for i := 0; len(keys) < 20; i++ {
		if k := fmt.Appendf(nil, "k-%d", i); slot.Of(k, [16]byte{}) == busy {
			keys = append(keys, k)
		}
	}
	const wave = 8_000
	var first int64
	for round := 1; round <= 4; round++ {
		b.writeKeys(wave, func(j int) []byte { return keys[j%len(keys)] })
		require.Len(t, b.drain(), wave)
		b.settle(busy)
		withFloor, fromStart := b.claimBlocks(busy, true), b.claimBlocks(busy, false)
		t.Logf("%d dead rows in slot %d: a claim of it reads %d index blocks from its floor, %d from its start",
			round*wave, busy, withFloor, fromStart)
		if round == 1 {
			first = withFloor
			continue
		}
		require.LessOrEqual(t, withFloor, first+1, "blocks per claim stay flat as dead rows grow")
		require.Greater(t, fromStart, int64(round)*10, "the dead rows are there: a claim from the slot's start walks them")
	}
	var left int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_outbox`).Scan(&left))
	require.Zero(t, left, "all published")
}

// A writing transaction that took its outbox id early and commits late (a
// long transaction: a batch job, a session idle in transaction) holds no
// floor: once it is the only one running below a settled sample, floors
// pass its ids provisionally, so claims stay at the newest rows; when it
// commits, one claim rescans from the settled bound and its rows are all
// claimed, none skipped.
func TestFloorLongWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newFloorBundle(t)
	b.writeRows(1000, 50, "before")
	require.Len(t, b.drain(), 1000)

	long, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(ctx) }()
	// Every slot gets a row from the long transaction.
	var msgs []outbox.Message
	for i := range 2000 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "long-%d", i), Value: []byte("v")})
	}
	require.NoError(t, outbox.Write(ctx, long, msgs...))
	var lowest, xid int64
	require.NoError(t, long.QueryRow(ctx, `SELECT min(id), pg_current_xact_id()::text::bigint FROM pgbox_outbox`).Scan(&lowest, &xid))

	// Others write and are published meanwhile, with higher ids. The
	// snapshot is the cluster's: another test's transaction that began
	// before this one's samples (make test runs packages side by side) is
	// an older writer until it ends, and hides this one meanwhile; it
	// ends, this one does not.
	for round := 0; round < 5 || !slices.Contains(b.r.floors.writers, xid); round++ {
		require.Less(t, round, 30, "the long writer is watched (writers %v)", b.r.floors.writers)
		b.writeRows(2000, 500, "other")
		require.Len(t, b.drain(), 2000, "other keys keep flowing")
	}
	passed := 0
	for s := range 256 {
		if b.r.floors.epoch[s] != 0 && b.r.floors.floor[s] > lowest {
			passed++
		}
	}
	require.Positive(t, passed, "floors passed the open transaction's ids (claims do not walk what was deleted since it began)")

	require.NoError(t, long.Commit(ctx))
	got := b.drain()
	require.Len(t, got, 2000, "the long transaction's rows, none skipped")
	for _, id := range got {
		require.GreaterOrEqual(t, id, lowest)
	}
}

// A rewind: the floor passes rows a parked row holds back; retrying the
// parked row, by inspect's action or by hand in psql (the outbox's trigger
// writes the rewind record), makes the next claim of its slot start at it
// again, so it and the rows it held are claimed.
func TestFloorRewindAfterRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newFloorBundle(t)
	b.writeRows(3, 1, "held") // three rows of one key
	var first int64
	var slot int16
	require.NoError(t, b.db.Pool.QueryRow(ctx, `UPDATE pgbox_outbox SET parked_at = now()
		WHERE id = (SELECT min(id) FROM pgbox_outbox) RETURNING id, slot`).Scan(&first, &slot))
	require.Empty(t, b.drain(), "the parked row holds its key's later rows")
	b.writeRows(200, 100, "free")
	require.Len(t, b.drain(), 200)
	b.settle(int(slot))
	require.Greater(t, b.r.floors.floor[slot], first+2, "the floor passed the held rows")

	// An operator's hand-written UPDATE, as psql would run it: the outbox's
	// trigger records the rewind (inspect's retry runs the same UPDATE).
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = NULL WHERE id = $1`, first)
	require.NoError(t, err)
	require.Equal(t, []int64{first, first + 1, first + 2}, b.drain(), "the retried row, then the rows it held, in id order")
	require.Empty(t, b.drain(), "a rewind is applied once (the relay remembers the newest it read)")
}

// A writing transaction whose transaction id is above every completed one
// appears in no snapshot's list of running transactions (a snapshot's xmax
// is the newest completed id plus one): a floor rule that trusted the
// snapshot's xmax let empty claims raise the floors past its row, which was
// then never published (the chaos harness lost rows this way). Claims with
// nothing to publish while it runs leave the floors below its row.
func TestFloorTransactionAboveSnapshotXmax(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newFloorBundle(t)
	b.writeRows(500, 50, "before")
	require.Len(t, b.drain(), 500)

	open, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = open.Rollback(ctx) }()
	require.NoError(t, outbox.Write(ctx, open, outbox.Message{Topic: "t", Key: []byte("late"), Value: []byte("v")}))
	for range 5 {
		require.Empty(t, b.drain(), "nothing visible yet")
	}
	require.NoError(t, open.Commit(ctx))
	require.Len(t, b.drain(), 1, "the late row is published")
}

// claimSlots claims slots with their remembered floors, as a pass would
// (without the sweep).
func (r *Relay) claimSlots(ctx context.Context, slots []int32) (claimed, error) {
	a := r.floors.args(slots, false)
	return r.claim(ctx, &a)
}

// testClaimArgs are claimSQL's arguments for slots (nil: every slot, in
// probe order) with their remembered floors.
func (r *Relay) testClaimArgs(slots []int32, perSlot, batch int) []any {
	if slots == nil {
		slots = r.floors.order(nil)
	}
	a := r.floors.args(slots, false)
	a.instance, a.lanes, a.perSlot, a.batch = r.id, r.cfg.Lanes, perSlot, batch
	return a.sql()
}
