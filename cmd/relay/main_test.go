package main

import (
	"testing"
	"time"

	"github.com/pgbox/pgbox/internal/testutil"
)

// relayBin is the binary built once for the whole package's tests.
var relayBin string

func TestMain(m *testing.M) { testutil.MainWithBinary(m, "relay", &relayBin) }

// result is one finished run of the binary.
type result = testutil.Result

// runRelay runs the binary to completion (at most timeout), with only the
// environment given (see testutil.CleanEnv).
func runRelay(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	return testutil.RunToEnd(t, timeout, relayBin, env, args...)
}
