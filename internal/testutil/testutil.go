// Package testutil holds pgbox's test helpers that are not about a database
// or a broker (see internal/testdb and internal/kafkatest for those).
package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// pollInterval is how often Eventually checks its condition.
const pollInterval = 20 * time.Millisecond

// Eventually polls cond until it returns true, failing the test (with what,
// naming the condition) if it has not within timeout. Unlike testify's
// Eventually it calls cond on the test's goroutine, so cond may use require.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pollInterval)
	}
}

// SyncBuffer is a log destination that goroutines may share (a
// slog.TextHandler's writer in a test that reads the log).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
