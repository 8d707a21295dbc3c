package relay_test

// Issue 32 case 3: crash recovery without a postmaster restart.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/pgcluster"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A throwaway cluster where nothing flushes WAL but the WAL writer
// (synchronous_commit off everywhere, no checkpoint for an hour, no
// background writer, whose page writes flush WAL first), and the
// test pauses the WAL writer. A relay publishes a wave of rows whose WAL is
// never flushed; one backend is SIGKILLed, the postmaster resets and
// replays (pg_postmaster_start_time unchanged): the wave never happened,
// and the sequence hands its ids out again, below the floors the relay
// reached. Every row committed after the recovery is published, each key
// in order, by the relay that kept running.
func TestFloorSafeCrashRecoveryWithoutRestart(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("pausing the WAL writer needs to signal the server's processes (run as root)")
	}
	ctx := context.Background()
	cl, err := pgcluster.Start(ctx, pgcluster.Config{Settings: []string{
		"synchronous_commit = off", "wal_writer_delay = 10s", "checkpoint_timeout = 1h", "max_wal_size = 10GB",
		"restart_after_crash = on", "bgwriter_lru_maxpages = 0", "autovacuum = off"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Destroy(false) })
	db, drop, err := testdb.Create(ctx, cl.URL("postgres"), "crash_", true)
	require.NoError(t, err)
	t.Cleanup(func() { _ = drop() })
	kc := kafkatest.New(t, kfake.SeedTopics(3, "events"))
	b := &testBundle{db: db, cluster: kc, addrs: kc.ListenAddrs(), topic: "events", channel: "pgbox_" + db.Schema}
	cfg := b.config("crash")
	// A quiet relay that polls (NoListen: behind pgbouncer in transaction
	// mode): between polls its pool's connections sit idle and are
	// replaced silently (pgxpool pings a connection idle for over a
	// second), so no claim fails on the reset; its leases outlive the
	// recovery, so its lanes keep their epochs.
	const poll = 3 * time.Second
	cfg.NoListen, cfg.PollInterval, cfg.HeartbeatInterval, cfg.LeaseTTL = true, poll, 5*time.Second, time.Minute
	_ = start(t, cfg)
	events := collect(t, b, "events")

	want := map[string][]string{}
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	wave := func(n int) {
		<-mu
		defer func() { mu <- struct{}{} }()
		var msgs []outbox.Message
		for i := range n {
			k := fmt.Sprintf("k-%d", i%40)
			want[k] = append(want[k], strconv.Itoa(len(want[k])+1))
			msgs = append(msgs, msg("events", k, want[k][len(want[k])-1]))
		}
		for i := 0; i < len(msgs); i += 20 {
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs[i:min(i+20, len(msgs))]...) })
			require.NoError(t, err)
		}
	}
	wave(200)
	events.requireOrder(t, want, 30*time.Second)
	_, err = db.Pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(t, err)

	var walwriter int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&walwriter))
	require.NoError(t, syscall.Kill(walwriter, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(walwriter, syscall.SIGCONT) })
	var started time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&started))

	// A wave published, its WAL never flushed.
	wave(400)
	events.requireOrder(t, want, 30*time.Second)
	time.Sleep(3 * poll) // the floors settle above it

	victim, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	var pid int
	require.NoError(t, victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL)) // the OOM killer
	_ = victim.Close(ctx)
	// The postmaster tells every child to quit at once; the paused WAL
	// writer gets that signal first thing when continued, before it could
	// flush, so the recovery is quick (no wait for it to be killed).
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, syscall.Kill(walwriter, syscall.SIGCONT))
	var again time.Time
	waitFor(t, "crash recovery", func() bool {
		db.Pool.Reset() // the test's own connections died with the reset
		return db.Pool.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&again) == nil
	})
	require.Equal(t, started, again, "the postmaster reset, it did not restart")
	var left int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&left))
	var seq int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value('pgbox_outbox_id_seq'), 0)`).Scan(&seq))
	t.Logf("after recovery: the sequence at %d (the lost wave took ids up to ~600)", seq)

	// Rows committed after the recovery: their ids are reissued.
	wave(200)
	events.requireOrder(t, want, 30*time.Second)
}
