package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServiceFitsOnOneScreen: a reader opening examples/demo finds the
// payment service's use of pgbox in service.go, on one screen: the
// migration, the consumer whose adapter runs inbox.Process in the consumer's
// transaction, and outbox.Write in that transaction. The harness (producer,
// duplicates, checks) lives in internal/harness.
func TestServiceFitsOnOneScreen(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("service.go")
	require.NoError(t, err)
	src := string(b)
	for _, call := range []string{"migrations.Up(ctx,", "inbox.New(", "inboxsarama.NewHandler(", "outbox.Write(ctx, tx,"} {
		require.Contains(t, src, call)
	}
	require.LessOrEqual(t, strings.Count(src, "\n"), 110, "service.go should stay one screen: move helpers to wiring.go or internal/harness")
}
