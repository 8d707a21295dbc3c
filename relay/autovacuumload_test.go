package relay_test

// Migration 00150 (ALTER TABLE ... SET autovacuum
// thresholds on pgbox_outbox and the relay's tables), from its review: applied under load,
// beside a VACUUM holding its lock, beside a pg_dump-like snapshot.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
)

// 00150 runs under load: a relay claiming and publishing, two writers
// committing rows through outbox.Write, and, in turn, nothing else, a
// pg_dump-like snapshot (ACCESS SHARE, held), a VACUUM of pgbox_outbox
// and one of pgbox_relay_instances (SHARE UPDATE EXCLUSIVE held for 2 s,
// as a long manual VACUUM or an anti-wraparound autovacuum, which no lock
// request cancels, holds it). The step waits for the VACUUMs and for
// nothing else; no writer waits for it and the relay keeps publishing
// throughout; no deadlock. What does wait: a relay starting
// (Relay.ensureLanes: LOCK TABLE pgbox_relay_lanes IN SHARE ROW EXCLUSIVE
// MODE) while the step holds pgbox_relay_lanes and waits for a later
// table. Every row written arrives.
func TestQuietAutovacuumUnderLoad(t *testing.T) {
	ctx := context.Background()
	db := testdb.Empty(t)
	sqlDB := db.SQL(t)
	p, err := migrations.NewProvider(sqlDB, migrations.Config{LockID: 150150150150})
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 140)
	require.NoError(t, err)

	cluster := kafkatest.New(t, kfake.SeedTopics(3, "events"))
	b := &testBundle{db: db, cluster: cluster, addrs: cluster.ListenAddrs(), topic: "events", channel: "pgbox_" + db.Schema}
	start(t, b.config("a"))

	var written, maxWriteNs atomic.Int64
	stopWriters := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stopWriters:
					return
				default:
				}
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					return outbox.Write(ctx, tx, outbox.Message{Topic: "events", Key: fmt.Appendf(nil, "w%d-%d", w, i%50), Value: []byte("v")})
				})
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				if d := time.Since(t0).Nanoseconds(); d > maxWriteNs.Load() {
					maxWriteNs.Store(d) // racy max, good enough for a bound
				}
				written.Add(1)
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(time.Second) // the relay holds its lanes and publishes

	cases := []struct {
		name  string
		hold  func(t *testing.T) (release func())
		waits bool   // the step waits for the holder
		lanes bool   // a relay's start (ensureLanes) waits for the step
		table string // the table the step waits on
	}{
		{name: "nothing held", hold: func(*testing.T) func() { return func() {} }},
		{name: "a pg_dump-like snapshot", hold: func(t *testing.T) func() {
			_, release := db.HoldSnapshot(t, "pg_dump")
			return release
		}},
		{name: "VACUUM of pgbox_outbox", waits: true, table: "pgbox_outbox", hold: vacuumLike(db, "pgbox_outbox")},
		{name: "VACUUM of pgbox_relay_instances", waits: true, lanes: true, table: "pgbox_relay_instances", hold: vacuumLike(db, "pgbox_relay_instances")},
	}
	for i, c := range cases {
		if i > 0 {
			_, err := p.DownTo(ctx, 140)
			require.NoError(t, err)
		}
		release := c.hold(t)
		timer := time.AfterFunc(2*time.Second, release)
		maxWriteNs.Store(0)
		w0, o0 := written.Load(), int64(b.outboxCount(t, "true"))
		t0 := time.Now()
		migrated := make(chan error, 1)
		var stepTook time.Duration
		go func() {
			_, err := p.UpTo(ctx, 150)
			stepTook = time.Since(t0)
			migrated <- err
		}()
		time.Sleep(700 * time.Millisecond)
		// Who waits, 0.7 s in.
		rows, err := db.Pool.Query(ctx, `SELECT a.application_name || ': ' || l.mode || ' on ' || coalesce(c.relname, l.locktype)
			FROM pg_locks l JOIN pg_stat_activity a USING (pid) LEFT JOIN pg_class c ON c.oid = l.relation WHERE NOT l.granted`)
		require.NoError(t, err)
		waiting, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		// A relay starting now: ensureLanes's lock, bounded.
		startErr := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '300ms'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `LOCK TABLE pgbox_relay_lanes IN SHARE ROW EXCLUSIVE MODE`)
			return err
		})
		w1, o1 := written.Load(), int64(b.outboxCount(t, "true"))
		require.NoError(t, <-migrated)
		took := stepTook
		timer.Stop()
		release()
		published := (w1 - w0) + o0 - o1
		t.Logf("%s: 00150 took %v; waiting at 0.7 s: %q; a relay's ensureLanes lock then: %v; max write %v; rows published in the first 0.7 s+: %d (written %d)",
			c.name, took.Round(time.Millisecond), waiting, startErr, time.Duration(maxWriteNs.Load()).Round(time.Millisecond), published, w1-w0)
		if c.waits {
			require.GreaterOrEqual(t, took, 1500*time.Millisecond, "the step waits for the VACUUM's lock")
			require.Contains(t, waiting, ": ShareUpdateExclusiveLock on "+c.table, "the step (goose's connection has no application_name) waits on the vacuumed table")
			for _, wt := range waiting {
				require.Contains(t, wt, "ShareUpdateExclusiveLock on ", "nothing but the step waits")
			}
		} else {
			require.Less(t, took, 1500*time.Millisecond)
		}
		if c.lanes {
			require.Error(t, startErr, "a relay starting waits for the step, which holds pgbox_relay_lanes while it waits for the next table")
			require.Equal(t, "55P03", pgerr.Code(startErr), "lock_timeout")
		} else {
			require.NoError(t, startErr)
		}
		require.Less(t, time.Duration(maxWriteNs.Load()), time.Second, "no writer waits for the step")
		require.Positive(t, published, "the relay publishes while the step runs")
	}

	close(stopWriters)
	wg.Wait()
	waitFor(t, "every written row published", func() bool { return b.outboxCount(t, "true") == 0 })
	got := kafkatest.ReadAll(t, cluster.ListenAddrs(), "events", int(written.Load()), 30*time.Second)
	require.GreaterOrEqual(t, len(got), int(written.Load()))
}

// vacuumLike holds table's SHARE UPDATE EXCLUSIVE lock, VACUUM's, in an
// open transaction of a session named "vacuum" until release.
func vacuumLike(db *testdb.DB, table string) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		t.Helper()
		ctx := context.Background()
		cfg, err := pgx.ParseConfig(db.URL)
		require.NoError(t, err)
		cfg.RuntimeParams["application_name"] = "vacuum"
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `BEGIN`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `LOCK TABLE `+table+` IN SHARE UPDATE EXCLUSIVE MODE`)
		require.NoError(t, err)
		var once sync.Once
		release := func() { once.Do(func() { _ = conn.Close(context.Background()) }) }
		t.Cleanup(release)
		return release
	}
}
