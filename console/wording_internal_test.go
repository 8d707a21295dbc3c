package console

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/cleanup"
)

// TestTimeRuleNamesItsCutoff (issue 33 item 12): the cleanup page's time
// rule showed "kept 15.0d (until <a past date>)": the date is the cutoff
// (now − window: keys from before it go), not when anything expires.
func TestTimeRuleNamesItsCutoff(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	window := 15 * 24 * time.Hour
	ru := ruleOf(cleanup.TopicReport{Topic: "orders.v1", Timed: true, Window: window, Cutoff: now.Add(-window),
		RetentionMs: (14 * 24 * time.Hour).Milliseconds(), SegmentMs: (23 * time.Hour).Milliseconds()})
	require.Equal(t, "time rule: keys are kept 15.0d; those from before 2026-11-12 12:00:00Z (the cutoff) go", ru.Fallback)
	require.NotContains(t, ru.Fallback, "until")
}

// TestOneSampleChartDrawsADot (issue 33 item 12): a chart of one sample
// drew a one-point polyline, which shows nothing; each line of one sample
// gets a dot.
func TestOneSampleChartDrawsADot(t *testing.T) {
	t.Parallel()
	now := time.Now()
	bin := now.Add(-30 * time.Second)
	c := layout(now, []time.Time{bin}, map[string]map[time.Time]sample{"orders.v1": {bin: {backlog: 5, published: 60}}})
	require.Len(t, c.Backlog.Lines, 1)
	require.NotNil(t, c.Backlog.Lines[0].Dot)
	require.NotNil(t, c.Rate.Lines[0].Dot)
	h, err := New(Config{DB: (*pgxpool.Pool)(nil)}) // templates only: no query runs
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, h.pages["overview"].ExecuteTemplate(&buf, "panel", c.Backlog))
	require.Contains(t, buf.String(), `<circle class="dot"`)
	require.Contains(t, buf.String(), `fill="#2563eb"`)

	// Two samples draw a line, no dots.
	c = layout(now, []time.Time{bin.Add(-time.Minute), bin}, map[string]map[time.Time]sample{"orders.v1": {bin: {backlog: 5}}})
	require.Nil(t, c.Backlog.Lines[0].Dot)
	require.Equal(t, 2, len(strings.Fields(c.Backlog.Lines[0].Points)))
}
