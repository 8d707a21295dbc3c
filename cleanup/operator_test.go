package cleanup

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

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

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

// runUntilError runs c.Run and returns its error, failing the test unless
// Run returned by itself within limit.
func runUntilError(t *testing.T, c *Cleaner, limit time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit+30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("Run did not stop within %v", limit)
		return nil
	}
}

func requireNeedsOperator(t *testing.T, err error, code, fix string, logs *lockedBuffer) {
	t.Helper()
	require.ErrorIs(t, err, ErrNeedsOperator)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, code, pgErr.Code)
	require.ErrorContains(t, err, fix)
	require.Contains(t, logs.String(), "level=ERROR")
	require.Contains(t, logs.String(), fix)
}

// Against a schema where migrations were not run, Run stops at once with
// an error naming the fix (it used to log and try again every Interval).
func TestRunMigrationsNotRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	empty := testdb.Empty(t)
	var logs lockedBuffer
	c := b.cleaner(t, Config{Pool: empty.Pool, Interval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	err := runUntilError(t, c, 10*time.Second)
	requireNeedsOperator(t, err, "42P01", "relay migrate up", &logs)
}

// The cleaner's role loses its grants while Run runs: Run returns within
// seconds with the error.
func TestRunGrantsRevoked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "orders", map[string]string{"retention.ms": ms(time.Hour)})
	b.insertKey(t, "orders", "k1", time.Now(), nil)
	role := testutil.NewRole(t, b.db)
	pool, err := pgxpool.New(context.Background(), role.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var logs lockedBuffer
	c := b.cleaner(t, Config{Pool: pool, Interval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testutil.Eventually(t, 30*time.Second, "two passes while granted", func() bool { return c.Stats().Passes >= 2 })
	require.Zero(t, c.Stats().PassErrors)

	role.Revoke(t)
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept going after the grants were revoked")
	}
	requireNeedsOperator(t, err, "42501", "grant", &logs)
}
