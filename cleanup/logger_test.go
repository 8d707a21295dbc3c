package cleanup

import (
	"bytes"
	"context"
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

	b := setup(t)
	_, err := b.cleaner(t, Config{}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Contains(t, buf.String(), "cleanup pass done")
}
