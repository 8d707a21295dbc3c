package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code}) }
	plain := errors.New("account closed")
	for _, tc := range []struct {
		name      string
		err, herr error
		want      errKind
	}{
		{"handler error", fmt.Errorf("handler: %w", plain), plain, errHandler},
		{"permanent handler error", inbox.Permanent(plain), inbox.Permanent(plain), errPermanent},
		{"deadlock in handler", pg("40P01"), pg("40P01"), errRetry},
		{"serialization failure in handler", pg("40001"), pg("40001"), errRetry},
		{"handler deadline", context.DeadlineExceeded, context.DeadlineExceeded, errHandler},
		{"terminated backend", pg("57P01"), nil, errRetry},
		{"connection exception", pg("08006"), nil, errRetry},
		{"too many connections", pg("53300"), nil, errRetry},
		{"conn closed", fmt.Errorf("begin: %w", pgconn.ErrConnClosed), nil, errRetry},
		{"unexpected EOF", fmt.Errorf("begin: %w", io.ErrUnexpectedEOF), nil, errRetry},
		{"key in flight", fmt.Errorf("x: %w", inbox.ErrInFlight), nil, errRetry},
		{"invalid message", fmt.Errorf("x: %w", inbox.ErrInvalidMessage), nil, errPermanent},
		{"fingerprint mismatch", fmt.Errorf("x: %w", inbox.ErrFingerprintMismatch), nil, errPermanent},
		{"missing table", pg("42P01"), nil, errOperator},
		{"permission denied", pg("42501"), nil, errOperator},
		{"undefined column", pg("42703"), nil, errOperator},
		{"business table missing in handler", pg("42P01"), pg("42P01"), errOperator},
		{"grant revoked in handler", pg("42501"), pg("42501"), errOperator},
		{"statement timeout in handler", pg("57014"), pg("57014"), errHandler},
		{"read-only after failover", pg("25006"), nil, errRetry},
		{"lock not available", pg("55P03"), nil, errRetry},
		{"unknown error of the adapter's SQL", pg("XX000"), nil, errUnknown},
		{"deferred constraint at commit", &commitError{err: &pgconn.PgError{Code: "23505"}}, nil, errHandler},
		{"connection lost at commit", &commitError{err: io.ErrUnexpectedEOF}, nil, errRetry},
	} {
		require.Equal(t, tc.want, classify(tc.err, tc.herr), tc.name)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	h := &Loop{cfg: Config{ConsumerConfig: inbox.ConsumerConfig{RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: time.Second}}}
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 50: time.Second} {
		got := h.backoff(n)
		require.InDelta(t, float64(want), float64(got), float64(want)*0.2+1, "retry %d", n)
	}
}

// TestDefaultRetryScheduleRidesOutARestart: with the default settings, a
// message whose handler keeps failing transiently (a downstream service
// restarting) is retried for minutes, with capped waits, before it is
// dead-lettered (issue 19: it used to be about 2s).
func TestDefaultRetryScheduleRidesOutARestart(t *testing.T) {
	t.Parallel()
	o := Config{}.WithDefaults()
	h := &Loop{cfg: o}
	var window time.Duration
	for n := 1; n < o.MaxAttempts; n++ { // a wait after every attempt but the last
		d := h.backoff(n)
		require.LessOrEqual(t, d, o.MaxRetryBackoff*6/5, "wait %d is capped", n)
		window += d
	}
	require.GreaterOrEqual(t, window, 2*time.Minute, "retries span at least two minutes")
	require.LessOrEqual(t, window, 5*time.Minute, "a poison message holds its partition at most minutes")
	require.LessOrEqual(t, o.MaxRetryBackoff, 30*time.Second, "a recovered downstream is noticed within seconds")
}

func TestErrorText(t *testing.T) {
	t.Parallel()
	long := make([]byte, 5000)
	for i := range long {
		long[i] = 'x'
	}
	require.Len(t, errorText(errors.New(string(long))), 4096)
	require.Equal(t, "a b\uFFFD", errorText(errors.New("a\x00 b\xff")))
}
