// Package integration_test proves pgbox's guarantees end to end: the whole
// chain in real OS processes (internal/harness), with faults.
package integration_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// sarama's metrics registry starts one process-wide meter goroutine that
	// never stops (rcrowley/go-metrics).
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}
