package inspect_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/pgcluster"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// standby connects to url as a physical WAL receiver does (replication=true),
// on a temporary physical slot when slot is not empty, starts streaming and
// sends one hot_standby_feedback message saying its oldest query needs xmin
// (an xid8). It returns the WAL sender's pid; closing the connection (at
// cleanup) ends the hold and drops the slot.
func standby(t *testing.T, url, slot string, xmin uint64) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, url+"&replication=true&application_name=horizon-standby")
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	start := "START_REPLICATION PHYSICAL "
	if slot != "" {
		_, err := conn.Exec(ctx, "CREATE_REPLICATION_SLOT "+slot+" TEMPORARY PHYSICAL RESERVE_WAL").ReadAll()
		require.NoError(t, err)
		start = "START_REPLICATION SLOT " + slot + " PHYSICAL "
	}
	res, err := conn.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll()
	require.NoError(t, err)
	lsn := string(res[0].Rows[0][2])
	conn.Frontend().Send(&pgproto3.Query{String: start + lsn})
	require.NoError(t, conn.Frontend().Flush())
	for {
		msg, err := conn.ReceiveMessage(ctx)
		require.NoError(t, err)
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			require.Failf(t, "START_REPLICATION", "%s", e.Message)
		}
		if _, ok := msg.(*pgproto3.CopyBothResponse); ok {
			break
		}
	}
	// Hot standby feedback: 'h', send time (µs since 2000-01-01), xmin and
	// its epoch, catalog_xmin and its epoch (none).
	buf := []byte{'h'}
	buf = binary.BigEndian.AppendUint64(buf, uint64(time.Since(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()))
	buf = binary.BigEndian.AppendUint32(buf, uint32(xmin))
	buf = binary.BigEndian.AppendUint32(buf, uint32(xmin>>32))
	buf = binary.BigEndian.AppendUint64(buf, 0)
	conn.Frontend().Send(&pgproto3.CopyData{Data: buf})
	require.NoError(t, conn.Frontend().Flush())
	return int(conn.PID())
}

// TestHorizonClusterWideHolders, on a private cluster (the shared test
// server runs with max_prepared_transactions = 0, and a replica's hold
// would stall every other test's VACUUM): a prepared transaction, a
// session of another database that wrote, a replica's
// hot_standby_feedback without a slot and through a physical slot each
// hold pgbox's tables and are listed with their kind; a read-only snapshot
// in another database is not; each is gone once it lets go.
func TestHorizonClusterWideHolders(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Settings: []string{"fsync = off", "max_prepared_transactions = 4"}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Destroy(false)) })
	require.NoError(t, c.CreateDatabase(ctx, "other"))
	db, drop, err := testdb.Create(ctx, c.URL("postgres"), "t_", true)
	require.NoError(t, err)
	t.Cleanup(func() { _ = drop() })
	burn := func() {
		_, err := db.Pool.Exec(ctx, `SELECT pg_current_xact_id()`)
		require.NoError(t, err)
	}
	read := func() inspect.Horizon {
		snap, err := inspect.Read(ctx, db.Pool, everyHolder)
		require.NoError(t, err)
		return snap.Horizon
	}
	byName := func(h inspect.Horizon, k inspect.HolderKind, name string) (inspect.HorizonHolder, bool) {
		for _, x := range h.Holders {
			if x.Kind == k && x.Name == name {
				return x, true
			}
		}
		return inspect.HorizonHolder{}, false
	}

	// A prepared transaction.
	p := connectAs(t, db.URL, "", "horizon-prepare")
	p.exec(t, `BEGIN`)
	p.exec(t, `INSERT INTO pgbox_outbox (event_id, slot, topic, value) VALUES (gen_random_uuid(), 0, 'orders', 'v')`)
	p.exec(t, `PREPARE TRANSACTION 'horizon-gid'`)
	// Another database: one session that wrote, one read-only snapshot.
	otherURL := c.URL("other")
	w := connectAs(t, otherURL, "", "horizon-other-writer")
	w.exec(t, `BEGIN`)
	w.exec(t, `SELECT pg_current_xact_id()`)
	r := connectAs(t, otherURL, "", "horizon-other-reader")
	r.exec(t, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	r.exec(t, `SELECT count(*) FROM pg_class`)
	// Replicas: feedback without a slot, and through one.
	var xmin uint64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&xmin))
	replica := standby(t, c.URL("postgres"), "", xmin)
	slotted := standby(t, c.URL("postgres"), "horizon_slot", xmin)
	burn()

	var h inspect.Horizon
	// The WAL senders apply the feedback when they next read.
	testutil.Eventually(t, 30*time.Second, "the replicas' feedback to show", func() bool {
		h = read()
		_, ok := byName(h, inspect.HolderSlot, "horizon_slot")
		return listed(h, replica) && ok
	})

	x, ok := byName(h, inspect.HolderPrepared, "horizon-gid")
	require.True(t, ok, "prepared transaction not listed: %+v", h.Holders)
	require.Equal(t, "postgres", x.Database)
	require.Equal(t, pgcluster.SuperUser, x.User)
	require.Zero(t, x.PID)
	require.NotNil(t, x.AgeSeconds)
	require.Positive(t, *x.AgeSeconds)
	require.GreaterOrEqual(t, x.AgeTransactions, int64(1))

	x = find(t, h, w.pid)
	require.Equal(t, inspect.HolderOtherDatabase, x.Kind)
	require.Equal(t, "other", x.Database)
	require.Equal(t, "idle in transaction", x.State)
	require.False(t, listed(h, r.pid), "a read-only snapshot in another database holds only that database")

	x = find(t, h, replica)
	require.Equal(t, inspect.HolderReplica, x.Kind)
	require.Equal(t, uint32(xmin), x.Xmin)
	require.Equal(t, "horizon-standby", x.Application)
	require.Nil(t, x.AgeSeconds, "a replica's feedback has no start time")
	x, _ = byName(h, inspect.HolderSlot, "horizon_slot")
	require.Equal(t, slotted, x.PID, "the slot names the WAL sender using it")
	require.Equal(t, uint32(xmin), x.Xmin)
	require.GreaterOrEqual(t, x.AgeTransactions, int64(1))
	for _, k := range []inspect.HolderKind{inspect.HolderPrepared, inspect.HolderOtherDatabase, inspect.HolderReplica, inspect.HolderSlot} {
		s, ok := kind(h, k)
		require.True(t, ok, k)
		require.GreaterOrEqual(t, h.AgeTransactions, s.AgeTransactions)
	}

	// Each lets go.
	p.exec(t, `ROLLBACK PREPARED 'horizon-gid'`)
	w.exec(t, `COMMIT`)
	_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'horizon-standby'`)
	require.NoError(t, err)
	testutil.Eventually(t, 30*time.Second, "the holders to leave the list once they let go", func() bool {
		h = read()
		_, slot := byName(h, inspect.HolderSlot, "horizon_slot")
		_, prep := byName(h, inspect.HolderPrepared, "horizon-gid")
		return !slot && !prep && !listed(h, w.pid) && !listed(h, replica)
	})
}
