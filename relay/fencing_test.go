package relay

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// An instance that lost its lane (paused past its lease, then resumed) can
// neither count attempts on nor park the rows it had claimed: the lane's
// epoch moved on. It still deletes what it published (those records are in
// Kafka whoever owns the lane now: deleting them only spares a duplicate).
// The lane's new owner claims and settles the rest.
func TestFencedFinishAfterLaneMoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, createLanesSQL, 1)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx, outbox.Message{Topic: "t", Key: []byte("a"), Value: []byte("1")},
		outbox.Message{Topic: "t", Key: []byte("b"), Value: []byte("2")}))
	require.NoError(t, tx.Commit(ctx))

	heartbeat := func(instance string) {
		var held, released, live int
		require.NoError(t, db.Pool.QueryRow(ctx, heartbeatSQL, instance, "1 hour", 1, "0s", true, false).Scan(&held, &released, &live, new(int), new(int)))
	}
	old := testRelay(Config{Pool: db.Pool, BatchSize: 10, Lanes: 1}, "old")
	heartbeat("old")
	c, err := old.claimSlots(ctx, old.floors.order(nil))
	require.NoError(t, err)
	claimed := c.rows
	require.Len(t, claimed, 2)

	// "old" stalls past its lease; "new" takes the lane over.
	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_relay_lanes SET expires_at = now() - interval '1 second';
		UPDATE pgbox_relay_instances SET expires_at = now() - interval '1 second' WHERE instance = 'old'`)
	require.NoError(t, err)
	heartbeat("new")

	// The stale instance's finish deletes its published row, and neither
	// counts nor parks the failed one.
	var deleted int
	var parked []int64
	require.NoError(t, db.Pool.QueryRow(ctx, finishSQL,
		[]int64{claimed[0].id},
		[]int64{claimed[1].id}, []int64{claimed[1].epoch}, []string{"boom"}, 1, []bool{false}, "0s",
		[]pgtype.UUID{{Bytes: claimed[0].eventID, Valid: true}}, []pgtype.UUID{{Bytes: claimed[1].eventID, Valid: true}}).Scan(&deleted, &parked, nil, nil, nil))
	require.Equal(t, 1, deleted)
	require.Empty(t, parked)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox WHERE attempts = 0 AND parked_at IS NULL`).Scan(&n))
	require.Equal(t, 1, n)
	again, err := old.claimSlots(ctx, old.floors.order(nil))
	require.NoError(t, err)
	require.Empty(t, again.rows, "a stale instance claims nothing")
	require.Empty(t, again.meta.slots, "and owns no slot")

	// The new owner settles them under its own epoch.
	fresh := testRelay(Config{Pool: db.Pool, BatchSize: 10, Lanes: 1}, "new")
	c, err = fresh.claimSlots(ctx, fresh.floors.order(nil))
	require.NoError(t, err)
	mine := c.rows
	require.Len(t, mine, 1)
	require.Equal(t, claimed[1].id, mine[0].id)
	require.NotEqual(t, claimed[1].epoch, mine[0].epoch)
	require.NoError(t, db.Pool.QueryRow(ctx, finishSQL,
		[]int64{mine[0].id},
		[]int64{}, []int64{}, []string{}, 1, []bool{}, "0s",
		[]pgtype.UUID{{Bytes: mine[0].eventID, Valid: true}}, []pgtype.UUID{}).Scan(&deleted, &parked, nil, nil, nil))
	require.Equal(t, 1, deleted)
}
