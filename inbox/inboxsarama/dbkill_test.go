package inboxsarama_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
)

// The consumers' database connections are killed (pg_terminate_backend) over
// and over while they work, at any point of their transactions, commits
// included: every event still gets exactly one business row.
func TestConsumerDatabaseConnectionsKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := cgSetup(t, 3)
	evs := events("e", 3000)
	b.ProduceEvents(t, evs...)

	app := "pgbox-cg-kill-" + b.DB.Schema
	pool := poolWithAppName(t, b.DB, app, 8)
	ib := newTestInbox(t, "svc", inbox.ByOffset())
	opts := inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{RetryBackoff: 5 * time.Millisecond, MaxRetryBackoff: 50 * time.Millisecond}}
	h1 := mustHandler(t, pool, ib, effect, opts)
	opts.BatchSize = 25
	h2 := mustHandler(t, pool, ib, effect, opts)

	killed := 0
	kill := func() {
		var n int
		require.NoError(t, b.DB.Pool.QueryRow(ctx,
			`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		killed += n
	}
	m1 := startMember(t, b.Addrs, "svc", []string{b.Topic}, h1)
	m2 := startMember(t, b.Addrs, "svc", []string{b.Topic}, h2)
	// Kill every 20-60 ms; while a kill finds the consumers without progress
	// since the previous one (a slow, loaded machine reconnects slowly), the
	// pause doubles up to a second, so kills keep landing at every point of
	// a transaction without starving the consumers.
	last, pause, stalled := -1, time.Duration(0), time.Now()
	for {
		rows, _ := b.Effects(t)
		if rows >= len(evs) {
			break
		}
		if rows > last {
			last, pause, stalled = rows, time.Duration(20+killed%5*10)*time.Millisecond, time.Now()
		} else {
			pause = min(2*pause, time.Second)
		}
		if time.Since(stalled) > 2*time.Minute {
			t.Fatalf("consumers made no progress for 2 minutes under connection kills (%d of %d rows, %d backends killed)", rows, len(evs), killed)
		}
		kill()
		time.Sleep(pause)
	}
	m1.stop()
	m2.stop()

	rows, distinct := b.Effects(t)
	require.Equal(t, len(evs), distinct, "no event lost")
	require.Equal(t, len(evs), rows, "no event applied twice")
	st1, st2 := h1.Stats(), h2.Stats()
	require.Positive(t, st1.TransientErrors+st2.TransientErrors, "the kills hit the consumers")
	require.Zero(t, st1.DeadLettered+st2.DeadLettered)
	require.Zero(t, st1.Failures+st2.Failures, "killed connections never count as handler failures")
	t.Logf("killed %d backends; transient errors %d; duplicates %d", killed,
		st1.TransientErrors+st2.TransientErrors, st1.Duplicates+st2.Duplicates)
}
