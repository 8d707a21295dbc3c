package inboxfranz_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if goroutines are left running when
// they end (a partition loop, client or pool the code forgot to stop).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
