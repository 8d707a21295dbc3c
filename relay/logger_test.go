package relay

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// A nil Logger means slog.Default(), never silence. Not parallel: it swaps
// the process-wide default logger.
func TestNilLoggerUsesSlogDefault(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	Config{}.withDefaults().Logger.Error("relay failed", "lane", 3)
	require.Contains(t, buf.String(), "relay failed")
}
