package relay_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/relay"
)

// lockedBuffer is a log destination the relay's goroutines may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runUntilError runs r and returns Run's error, failing the test unless Run
// returned on its own within limit.
func runUntilError(t *testing.T, r *relay.Relay, limit time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit+30*time.Second)
	defer cancel()
	start := time.Now()
	err := r.Run(ctx)
	require.NoError(t, ctx.Err(), "Run did not stop by itself")
	require.Less(t, time.Since(start), limit)
	return err
}

func requireNeedsOperator(t *testing.T, err error, code, fix string, logs *lockedBuffer) {
	t.Helper()
	require.ErrorIs(t, err, relay.ErrNeedsOperator)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, code, pgErr.Code)
	require.ErrorContains(t, err, fix)
	require.Contains(t, logs.String(), "level=ERROR")
	require.Contains(t, logs.String(), fix)
}

// Started against a schema where migrations were not run, Run returns
// within seconds with an error naming the fix, logged at ERROR.
func TestRunMigrationsNotRun(t *testing.T) {
	t.Parallel()
	db := testdb.Empty(t)
	c := kafkatest.New(t, kfake.SeedTopics(1, "events"))
	b := &testBundle{db: db, cluster: c, addrs: c.ListenAddrs(), topic: "events", channel: "pgbox_" + db.Schema}
	var logs lockedBuffer
	cfg := b.config("a")
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r, err := relay.New(cfg)
	require.NoError(t, err)
	err = runUntilError(t, r, 10*time.Second)
	requireNeedsOperator(t, err, "42P01", "relay migrate up", &logs)
}

// The relay's role loses its grants on pgbox's tables while it runs: Run
// returns within seconds with the error (it used to retry forever at WARN).
func TestRunGrantsRevoked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := testutil.NewRole(t, b.db)
	pool, err := pgxpool.New(context.Background(), role.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var logs lockedBuffer
	cfg := b.configWithPool(pool, "a")
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r, err := relay.New(cfg)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for i := range 10 {
		b.write(t, msg(b.topic, keyed(i), "v"))
	}
	require.Len(t, readTopic(t, b, b.topic, 10), 10, "published while granted")

	role.Revoke(t)
	revoked := time.Now()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run kept going after the grants were revoked")
	}
	require.Less(t, time.Since(revoked), 10*time.Second)
	requireNeedsOperator(t, err, "42501", "grant", &logs)
}
