package integration_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
)

// TestPgbouncerTransactionMode runs the whole chain (outbox.Write, the relay,
// the consumer adapter with Inbox.Process and ProcessBatch, and cleanup)
// through pgbouncer in transaction pool mode, with the settings
// docs/operations/pgbouncer.md gives: a pgx query mode without named prepared
// statements (each of the three: cache_describe, exec, simple_protocol) and
// the relay's NoListen. Migrations run directly (goose takes a session
// advisory lock).
func TestPgbouncerTransactionMode(t *testing.T) {
	bouncer := pgbouncerURL(t)
	for _, mode := range []string{"cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) { testPgbouncer(t, bouncer, mode) })
	}
}

func testPgbouncer(t *testing.T, bouncer, mode string) {
	checkLeaks(t)
	const keys, perKey = 16, 30
	total := keys * perKey

	name, direct := newDatabase(t)
	parts := withParam(t, withDatabase(t, bouncer, name), "default_query_exec_mode", mode)
	addrs := newBroker(t)
	c := newChain(t, parts, direct, addrs)

	ctx, cancel := context.WithCancel(context.Background())
	defer c.wg.Wait()
	defer cancel()
	c.startRelay(ctx, "relay-a")
	c.startRelay(ctx, "relay-b")
	one := c.startConsumer(ctx, paymentsGroup, 1)      // Inbox.Process
	batched := c.startConsumer(ctx, paymentsGroup, 16) // Inbox.ProcessBatch

	require.NoError(t, c.write(ctx, keys, 1, perKey, 0))
	c.waitPaid(total, 3*time.Minute)
	c.verify(keys, perKey)
	t.Logf("member stats: %+v / %+v", one.Stats(), batched.Stats())

	// A rewind: a new group re-reads the orders topic from the start under
	// the same inbox consumer: every event is a duplicate, no second effect.
	rewind := c.startConsumer(ctx, paymentsGroup+"-rewind", 16)
	waitFor(t, 2*time.Minute, "the rewound group to see every event again", func() (bool, string) {
		s := rewind.Stats()
		return s.Duplicates >= uint64(total), fmt.Sprintf("%+v", s)
	})
	require.Zero(t, rewind.Stats().Processed, "a redelivered event was processed again")
	c.verify(keys, perKey)

	// Cleanup through pgbouncer, beside other clients' transactions.
	checkCleanup(t, c, total)
}

// checkCleanup runs cleanup passes through pgbouncer while other clients run
// short transactions on the same pgbouncer pool (so consecutive statements of
// one client land on different server connections), and checks that every
// pass runs (none finds the cleanup lock taken: there is no other cleaner),
// the expired inbox keys are deleted, and no lock is left behind in the
// server.
func checkCleanup(t *testing.T, c *chain, total int) {
	ctx, cancel := context.WithCancel(context.Background())
	var busy sync.WaitGroup
	defer busy.Wait()
	defer cancel()
	for range 6 {
		busy.Go(func() {
			for ctx.Err() == nil {
				_ = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `SELECT pg_sleep(0.002)`)
					return err
				})
			}
		})
	}

	admin, err := sarama.NewClusterAdmin(c.addrs, kafkatest.Config())
	require.NoError(t, err)
	defer admin.Close()
	// The topics keep records a minute (retention.ms and segment.ms): Kafka
	// drops them all (DeleteRecords stands in for the retention check), and
	// with the 24h default buffer a clock a day ahead makes every key expired.
	ends, err := admin.ListOffsets(map[string]map[int32]int64{ordersTopic: {0: -1, 1: -1, 2: -1, 3: -1}}, nil)
	require.NoError(t, err)
	drop := map[int32]int64{}
	for p, r := range ends[ordersTopic] {
		require.True(t, r.Err == nil || errors.Is(r.Err, sarama.ErrNoError), "list offsets: %v", r.Err)
		drop[p] = r.Offset
	}
	require.NoError(t, admin.DeleteRecords(ordersTopic, drop))
	cl, err := cleanup.New(cleanup.Config{Pool: newPool(t, c.url, 2), Admin: cleanupsarama.New(admin), BatchSize: 100,
		Now: func() time.Time { return time.Now().Add(25 * time.Hour) }})
	require.NoError(t, err)
	var deleted int64
	for pass := range 8 {
		rep, err := cl.RunOnce(ctx)
		require.NoError(t, err, "cleanup pass %d", pass)
		require.False(t, rep.Locked, "cleanup pass %d found the cleanup lock taken, with no other cleaner running: a lock leaked", pass)
		deleted += rep.Deleted
	}
	require.EqualValues(t, total, deleted, "cleanup deleted %d inbox keys, want every one of %d", deleted, total)
	require.Zero(t, c.count(`SELECT count(*) FROM pgbox_inbox`))
	require.Zero(t, c.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`),
		"advisory locks left held in the database after every cleanup pass returned")
}
