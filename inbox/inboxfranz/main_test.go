package inboxfranz_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if goroutines are left running when
// they end (a partition loop, client or pool the code forgot to stop).
func TestMain(m *testing.M) {
	// sarama's metrics library keeps one process-wide ticker goroutine (a
	// sarama member shares a group with a franz-go one in a test).
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}
