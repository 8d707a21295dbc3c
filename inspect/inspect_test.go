package inspect_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

func TestMain(m *testing.M) {
	// sarama's metrics registry starts a process-wide ticker on first use.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

func exec(t *testing.T, db *testdb.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// outboxRows inserts n unparked rows of topic in slot, created age ago.
func outboxRows(t *testing.T, db *testdb.DB, topic string, slot, n int, age time.Duration) {
	t.Helper()
	exec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, value, created_at)
		SELECT gen_random_uuid(), $2, $1, 'v', now() - $4::interval FROM generate_series(1, $3)`, topic, slot, n, age.String())
}

func inboxKeys(t *testing.T, db *testdb.DB, consumer, topic string, n int, age time.Duration) {
	t.Helper()
	exec(t, db, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at)
		SELECT $1, $2 || '-' || $4 || '-' || g, $2, 0, g, now() - $4::interval FROM generate_series(1, $3) g`, consumer, topic, n, age.String())
}

// TestReadExact: below the exact limit every count is exact, by topic and
// lane; ages come from the oldest rows; the lane table's count groups lanes.
func TestReadExact(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	exec(t, db, `INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at, epoch)
		VALUES (0, 2, 'relay-a', now() + interval '1 minute', 7), (1, 2, NULL, '-infinity', 3)`)
	exec(t, db, `INSERT INTO pgbox_relay_instances (instance, expires_at) VALUES ('relay-a', now() + interval '1 minute')`)
	outboxRows(t, db, "orders", 0, 3, time.Hour)   // lane 0
	outboxRows(t, db, "orders", 3, 2, time.Minute) // lane 1
	outboxRows(t, db, "payments", 5, 4, 0)         // lane 1
	exec(t, db, `UPDATE pgbox_outbox SET parked_at = now(), attempts = 5, last_error = 'too large'
		WHERE id = (SELECT max(id) FROM pgbox_outbox WHERE topic = 'payments')`)
	inboxKeys(t, db, "svc", "orders", 5, 2*time.Hour)
	inboxKeys(t, db, "svc", "orders", 5, time.Minute)
	inboxKeys(t, db, "audit", "orders", 2, 30*time.Minute)
	exec(t, db, `INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", attempts, error, dlq_topic)
		VALUES ('svc', 'orders', 0, 1, 3, 'boom', 'orders.dlq')`)

	snap, err := inspect.Read(ctx, db.Pool, inspect.Config{})
	require.NoError(t, err)
	require.Equal(t, 2, snap.LaneCount)
	require.Equal(t, []inspect.TopicBacklog{
		{Topic: "orders", Lane: 0, Unpublished: 3},
		{Topic: "orders", Lane: 1, Unpublished: 2},
		{Topic: "payments", Lane: 1, Unpublished: 3},
	}, snap.Topics)
	require.Equal(t, int64(8), snap.Outbox.Unpublished)
	require.False(t, snap.Outbox.Estimated)
	require.Equal(t, int64(1), snap.Outbox.Parked)
	require.Equal(t, []inspect.TopicCount{{Topic: "payments", Count: 1}}, snap.ParkedTopics)
	require.Len(t, snap.Parked, 1)
	require.Equal(t, "too large", snap.Parked[0].LastError)
	require.InDelta(t, time.Hour.Seconds(), *snap.Outbox.OldestAge, 5)
	require.Len(t, snap.LaneAges, 2)
	require.InDelta(t, time.Hour.Seconds(), *snap.LaneAges[0].OldestAge, 5)
	require.InDelta(t, time.Minute.Seconds(), *snap.LaneAges[1].OldestAge, 5)

	require.Len(t, snap.Lanes, 2)
	require.True(t, snap.Lanes[0].Held)
	require.Equal(t, "relay-a", snap.Lanes[0].Owner)
	require.False(t, snap.Lanes[1].Held)
	require.Len(t, snap.Instances, 1)
	require.True(t, snap.Instances[0].Live)

	require.Len(t, snap.Inbox, 2)
	require.Equal(t, "audit", snap.Inbox[0].Consumer)
	require.Equal(t, int64(2), snap.Inbox[0].Keys)
	require.InDelta(t, (30 * time.Minute).Seconds(), snap.Inbox[0].OldestAge, 5)
	require.Equal(t, "svc", snap.Inbox[1].Consumer)
	require.Equal(t, int64(10), snap.Inbox[1].Keys)
	require.False(t, snap.Inbox[1].Estimated)
	require.InDelta(t, (2 * time.Hour).Seconds(), snap.Inbox[1].OldestAge, 5)
	require.Contains(t, snap.Cutoffs, "unknown")
	require.Equal(t, []inspect.DeadCount{{Consumer: "svc", Topic: "orders", Count: 1}}, snap.Dead)

	var text strings.Builder
	snap.WriteText(&text)
	for _, want := range []string{"OUTBOX: 8 unpublished, 1 parked, oldest unpublished 1h (lanes: 2)", "too large",
		"RELAY INSTANCES (2 lanes, 1 unowned)", "relay-a", "audit", "DEAD LETTERS"} {
		require.Contains(t, text.String(), want)
	}
}

// TestReadEstimates: past the exact limit, counts are planner estimates,
// marked so; ages stay exact.
func TestReadEstimates(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	outboxRows(t, db, "orders", 1, 3000, time.Hour)
	outboxRows(t, db, "payments", 2, 1000, time.Minute)
	inboxKeys(t, db, "svc", "orders", 2000, time.Hour)
	exec(t, db, `ANALYZE pgbox_outbox`)
	exec(t, db, `ANALYZE pgbox_inbox`)

	snap, err := inspect.Read(ctx, db.Pool, inspect.Config{ExactLimit: 100})
	require.NoError(t, err)
	require.True(t, snap.Outbox.Estimated)
	require.InDelta(t, 4000, snap.Outbox.Unpublished, 400)
	require.Len(t, snap.Topics, 2)
	require.Equal(t, "orders", snap.Topics[0].Topic)
	require.Equal(t, -1, snap.Topics[0].Lane)
	require.True(t, snap.Topics[0].Estimated)
	require.InDelta(t, 3000, snap.Topics[0].Unpublished, 300)
	require.InDelta(t, 1000, snap.Topics[1].Unpublished, 300)
	require.InDelta(t, time.Hour.Seconds(), *snap.Outbox.OldestAge, 5)

	require.Len(t, snap.Inbox, 1)
	require.True(t, snap.Inbox[0].Estimated)
	require.InDelta(t, 2000, snap.Inbox[0].Keys, 200)
}

// TestReadSchemaMissing: without the tables, the error says what to run.
func TestReadSchemaMissing(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	_, err := inspect.Read(context.Background(), db.Pool, inspect.Config{})
	require.Error(t, err)
	require.True(t, errors.Is(err, inspect.ErrSchemaMissing), "%v", err)
	require.ErrorContains(t, err, "relay migrate up")
}

// TestReadNeverWaitsOnCleanupLock: a held cleanup lease does not delay a
// snapshot; a table locked by someone else makes the snapshot fail within
// its statement timeout rather than hang.
func TestReadNeverWaitsOnCleanupLock(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	inboxKeys(t, db, "svc", "orders", 3, time.Minute)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// A cleaner's pass holds the lease, and a transaction keeps its row locked.
	_, err = conn.Exec(ctx, `INSERT INTO pgbox_cleanup_lease (owner, expires_at) VALUES ('other-cleaner', now() + interval '1 hour')`)
	require.NoError(t, err)
	ltx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = ltx.Exec(ctx, `SELECT 1 FROM pgbox_cleanup_lease FOR UPDATE`)
	require.NoError(t, err)

	// Were the snapshot to wait on the lease, the statement timeout would fail it.
	snap, err := inspect.Read(ctx, db.Pool, inspect.Config{StatementTimeout: time.Second})
	require.NoError(t, err)
	require.Len(t, snap.Inbox, 1)
	require.NoError(t, ltx.Rollback(ctx))

	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE pgbox_outbox IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	start := time.Now()
	_, err = inspect.Read(ctx, db.Pool, inspect.Config{StatementTimeout: 300 * time.Millisecond})
	require.ErrorContains(t, err, "statement timeout")
	require.Less(t, time.Since(start), 10*time.Second, "the statement timeout bounds the wait")
}

// TestOptionsValidation: negative settings are named.
func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := inspect.Read(ctx, nil, inspect.Config{ExactLimit: -1, StatementTimeout: -time.Second, ParkedList: -1, Lanes: -1})
	require.ErrorContains(t, err, "nil database")
	require.ErrorContains(t, err, "ExactLimit -1")
	require.ErrorContains(t, err, "StatementTimeout -1s")
	require.ErrorContains(t, err, "ParkedList -1")
	require.ErrorContains(t, err, "Lanes -1 is out of range")
	db := testdb.New(t)
	// More lanes than slots: no relay accepts it, a snapshot would show
	// lanes that cannot exist.
	_, err = inspect.Read(ctx, db.Pool, inspect.Config{Lanes: 257})
	require.ErrorContains(t, err, "Lanes 257 is out of range (use 1..256, as the relays do")
	_, err = inspect.Read(ctx, db.Pool, inspect.Config{Lanes: 256})
	require.NoError(t, err)
}

// TestReadCutoffs: each consumer's oldest key is compared with its topic's
// cleanup window read from Kafka; overdue and never-pruned topics say so.
func TestReadCutoffs(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	cluster := kafkatest.New(t)
	ms := func(d time.Duration) *string { s := strconv.FormatInt(d.Milliseconds(), 10); return &s }
	kafkatest.CreateTopic(t, cluster.ListenAddrs(), "orders", 1, map[string]*string{"retention.ms": ms(time.Hour), "segment.ms": ms(10 * time.Minute)})
	compact := "compact"
	kafkatest.CreateTopic(t, cluster.ListenAddrs(), "ledger", 1, map[string]*string{"cleanup.policy": &compact})
	admin, err := sarama.NewClusterAdmin(cluster.ListenAddrs(), kafkatest.Config())
	require.NoError(t, err)
	defer func() { _ = admin.Close() }()
	inboxKeys(t, db, "svc", "orders", 2, 3*time.Hour)
	inboxKeys(t, db, "svc", "ledger", 2, time.Hour)

	snap, err := inspect.Read(context.Background(), db.Pool, inspect.Config{Cutoffs: &cleanup.CutoffsConfig{Admin: cleanupsarama.New(admin), Buffer: time.Hour}})
	require.NoError(t, err)
	require.Contains(t, snap.Cutoffs, "from Kafka topic configs")
	require.Len(t, snap.Inbox, 2)
	ledger, orders := snap.Inbox[0], snap.Inbox[1]
	require.Equal(t, "ledger", ledger.Topic)
	require.Nil(t, ledger.Window)
	require.Equal(t, "exact rule only; never pruned by time: compacted", ledger.Note)
	require.Equal(t, "orders", orders.Topic)
	require.InDelta(t, (2*time.Hour + 10*time.Minute).Seconds(), *orders.Window, 0.001)
	require.InDelta(t, -(50 * time.Minute).Seconds(), *orders.Margin, 5)
	require.True(t, orders.Cutoff.Equal(snap.Time.Add(-(2*time.Hour + 10*time.Minute))))
	require.Contains(t, orders.Note, "overdue")
}

// TestBacklogEstimateWithoutAnalyze: past the exact limit the backlog
// follows the rows written since the last ANALYZE (migration 00150 makes
// the outbox's analyzes rare: after 10,000 changed rows), parked rows not
// counted; an outbox never analyzed still reports its live rows. (The
// review of 00150: 8,000 rows were reported as the exact limit, 1,000,
// until the next analyze.)
func TestBacklogEstimateWithoutAnalyze(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, analyzed := range []bool{true, false} {
		db := testdb.New(t)
		exec(t, db, `ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`)
		if analyzed {
			outboxRows(t, db, "orders", 1, 20, time.Minute)
			exec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, parked_at)
				SELECT gen_random_uuid(), 3, 'orders', convert_to('p' || i, 'UTF8'), 'v', now() FROM generate_series(1, 500) i`)
			// The inserts' statistics first: sent after ANALYZE set the live
			// count, they would be counted twice.
			require.Eventually(t, func() bool {
				var n int64
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_stat_get_tuples_inserted('pgbox_outbox'::regclass)`).Scan(&n))
				return n == 520
			}, 30*time.Second, 100*time.Millisecond)
			exec(t, db, `ANALYZE pgbox_outbox`)
			outboxRows(t, db, "orders", 1, 7980, 0)
		} else {
			outboxRows(t, db, "orders", 1, 8000, 0)
		}
		// Backends send their statistics a second or so after a transaction
		// (an idle one, within 10 s).
		var snap *inspect.Snapshot
		require.Eventually(t, func() bool {
			var err error
			snap, err = inspect.Read(ctx, db.Pool, inspect.Config{})
			require.NoError(t, err)
			return snap.Outbox.Unpublished > int64(inspect.ExactLimitDefault)
		}, 30*time.Second, 200*time.Millisecond, "analyzed %v: the backlog stays at the exact limit", analyzed)
		require.True(t, snap.Outbox.Estimated)
		require.InDelta(t, 8000, snap.Outbox.Unpublished, 200, "analyzed %v: parked rows not counted", analyzed)
		if analyzed {
			require.Len(t, snap.Topics, 1)
			require.InDelta(t, 8000, snap.Topics[0].Unpublished, 800)
		}
	}
}
