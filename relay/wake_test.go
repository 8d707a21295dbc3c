package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/outbox"
)

// A relay that found rows recently watches the table itself: rows written
// without a notification are published at once, even one whose transaction
// took its id before a later row and committed after that row was published.
// Once idle it sets its sleeping flag; a Notify writer then wakes it, and the
// flag is cleared. The relay never polls after its first pass here, so only
// the watch and the notification can publish anything.
func TestWatchAndSleep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config("a")
	cfg.PollInterval = 1 << 62
	a := start(t, cfg)
	waitFor(t, "lanes held", func() bool { return a.r.Stats().Lanes == 8 })
	notifying, err := outbox.NewWriter(outbox.Config{Notify: true, Channel: b.channel})
	require.NoError(t, err)
	sleeping := func() bool {
		var s bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT sleeping FROM pgbox_relay_instances`).Scan(&s))
		return s
	}
	waitFor(t, "the idle relay's sleeping flag", sleeping)

	// Wake it: it is busy (watching) for two seconds from here, then may
	// sleep again; a loaded machine can take that long to read the topic,
	// so the flag is watched from before the write.
	cleared := watchCleared(ctx, t, b)
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		return notifying.Write(ctx, tx, msg(b.topic, "k0", "wake"))
	}))
	readTopic(t, b, b.topic, 1)
	waitFor(t, "the flag cleared", func() bool {
		select {
		case <-cleared:
			return true
		default:
			return false
		}
	})

	// A late commit with a lower id.
	late, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, late, msg(b.topic, "k1", "late")))
	b.write(t, msg(b.topic, "k2", "early"))
	readTopic(t, b, b.topic, 2)
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, late.Commit(ctx))
	got := readTopic(t, b, b.topic, 3)
	values := map[string]bool{}
	for _, m := range got {
		values[string(m.Value)] = true
	}
	require.Equal(t, map[string]bool{"wake": true, "early": true, "late": true}, values)

	// Idle again: the flag comes back, and a notification still wakes it.
	waitFor(t, "the sleeping flag again", sleeping)
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		return notifying.Write(ctx, tx, msg(b.topic, "k3", "wake again"))
	}))
	readTopic(t, b, b.topic, 4)
	waitFor(t, "published counted", func() bool { return a.r.Stats().Published == 4 })
}

// watchCleared polls the relay instance's sleeping flag until it reads false
// (or the test ends) and then closes the channel it returns.
func watchCleared(ctx context.Context, t *testing.T, b *testBundle) <-chan struct{} {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	cleared := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var s bool
			if err := b.db.Pool.QueryRow(ctx, `SELECT sleeping FROM pgbox_relay_instances`).Scan(&s); err == nil && !s {
				close(cleared)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return cleared
}
