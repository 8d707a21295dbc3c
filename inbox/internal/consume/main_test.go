package consume

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if goroutines are left running when
// they end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
