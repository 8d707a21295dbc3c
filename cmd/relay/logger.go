package main

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
)

// logger is the process's slog logger.
type logger = slog.Logger

// newLogger returns a text or JSON slog logger writing to w at the given
// level. Keys are snake_case; secrets never reach it (settings are logged
// through settings.redacted).
func newLogger(w io.Writer, format, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level)) // one of the enum's values: never fails
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// logSettings logs the effective settings, secrets redacted: every command
// at debug level, `run` once more at info when it starts.
func (a *app) logSettings(level slog.Level, msg string) {
	vals := a.set.redacted()
	attrs := make([]any, 0, 2*len(vals))
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		attrs = append(attrs, strings.ReplaceAll(k, "-", "_"), vals[k])
	}
	a.log.Log(context.Background(), level, msg, attrs...)
}
