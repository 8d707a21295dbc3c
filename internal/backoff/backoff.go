// Package backoff is pgbox's one retry schedule: exponential, capped, with
// jitter so that many retriers (partitions, lanes, processes) spread out.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay returns the wait before retry n (n ≥ 1): base doubled n-1 times,
// capped at limit, then jittered by ±20%. A base ≤ 0 returns 0 (no wait);
// a limit ≤ 0 means no cap.
func Delay(base, limit time.Duration, n int) time.Duration {
	if base <= 0 {
		return 0
	}
	d := base
	for i := 1; i < n && (limit <= 0 || d < limit); i++ {
		if d >= time.Duration(1<<61) { // doubling again (plus jitter) could overflow
			break
		}
		d *= 2
	}
	if limit > 0 {
		d = min(d, limit)
	}
	j := time.Duration(float64(d) * (rand.Float64()*0.4 - 0.2))
	return max(d+j, 0)
}

// Backoff counts consecutive failures and hands out Delay for each. The zero
// value is not usable: set Base and Limit.
type Backoff struct {
	Base, Limit time.Duration
	n           int
}

// Next returns the wait before the next retry and counts one more failure.
func (b *Backoff) Next() time.Duration {
	b.n++
	return Delay(b.Base, b.Limit, b.n)
}

// Reset starts the schedule over (after a success).
func (b *Backoff) Reset() { b.n = 0 }

// Attempts returns the failures counted since the last Reset.
func (b *Backoff) Attempts() int { return b.n }

// Sleep waits d or until ctx ends; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
