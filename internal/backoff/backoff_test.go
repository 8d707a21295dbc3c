package backoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/backoff"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 500: time.Second} {
		for range 50 {
			got := backoff.Delay(100*time.Millisecond, time.Second, n)
			require.InDelta(t, float64(want), float64(got), float64(want)*0.2+1, "retry %d", n)
		}
	}
	require.Zero(t, backoff.Delay(0, time.Second, 3), "no base, no wait")
	require.Positive(t, backoff.Delay(time.Millisecond, 0, 80), "no cap does not overflow")
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	b := backoff.Backoff{Base: 10 * time.Millisecond, Limit: 40 * time.Millisecond}
	require.InDelta(t, float64(10*time.Millisecond), float64(b.Next()), float64(2*time.Millisecond)+1)
	require.InDelta(t, float64(20*time.Millisecond), float64(b.Next()), float64(4*time.Millisecond)+1)
	require.InDelta(t, float64(40*time.Millisecond), float64(b.Next()), float64(8*time.Millisecond)+1)
	require.InDelta(t, float64(40*time.Millisecond), float64(b.Next()), float64(8*time.Millisecond)+1)
	require.Equal(t, 4, b.Attempts())
	b.Reset()
	require.InDelta(t, float64(10*time.Millisecond), float64(b.Next()), float64(2*time.Millisecond)+1)
}

func TestSleep(t *testing.T) {
	t.Parallel()
	require.True(t, backoff.Sleep(context.Background(), time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, backoff.Sleep(ctx, time.Hour))
	require.False(t, backoff.Sleep(ctx, 0))
}
