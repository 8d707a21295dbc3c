package consume

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests (the loop's own and the guarantee
// suite's, which run both adapters) if goroutines are left running when they
// end. sarama's metrics library keeps one process-wide ticker goroutine.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}
