package inboxsarama_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if goroutines are left running when
// they end (a claim, pool or broker connection the code forgot to stop).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakOptions...)
}

// sarama's metrics library keeps one process-wide ticker goroutine.
var leakOptions = []goleak.Option{goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")}
