package inbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if goroutines are left running when
// they end (a claim, pool or broker connection the code forgot to stop).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakOptions...)
}

var leakOptions []goleak.Option
