package cleanup

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A zero that means something is asked for with a sentinel, never silently
// replaced by the default; other negative values are rejected with an error
// that says how to ask for what the user wants.
func TestZeroValueConvention(t *testing.T) {
	t.Parallel()
	k := kafkaTopic{retention: time.Hour, segment: 10 * time.Minute, retentionMs: 3_600_000, segmentMs: 600_000}
	now := fixedNow()
	window := func(cfg Config, topic string) TopicReport {
		t.Helper()
		cfg.Pool, cfg.Admin = nil, stubAdmin{}
		c := &Cleaner{cfg: cfg.withDefaults()}
		return c.plan(topic, k, topicPositions{}, now)
	}
	require.Equal(t, time.Hour+10*time.Minute+BufferDefault, window(Config{}, "t").Window, "zero is the default")
	require.Equal(t, time.Hour+10*time.Minute, window(Config{Buffer: NoBuffer}, "t").Window, "NoBuffer is a zero buffer")
	require.Equal(t, time.Hour+10*time.Minute, window(Config{Topics: map[string]Topic{"t": {Buffer: NoBuffer}}}, "t").Window)
	require.Equal(t, time.Hour+10*time.Minute+BufferDefault, window(Config{Topics: map[string]Topic{"t": {Buffer: NoBuffer}}}, "other").Window)

	// NoWindow turns a Config.Window off for one topic.
	inf := kafkaTopic{reason: ReasonInfiniteRetention}
	c := &Cleaner{cfg: Config{Window: time.Hour, Topics: map[string]Topic{"keep": {Window: NoWindow}}}.withDefaults()}
	require.True(t, c.plan("keep", inf, topicPositions{}, now).Skipped)
	require.Equal(t, time.Hour, c.plan("forced", inf, topicPositions{}, now).Window)

	// Pause: zero is PauseDefault, NoPause is no pause.
	require.Equal(t, PauseDefault, Config{}.withDefaults().Pause)
	require.Equal(t, time.Duration(0), Config{Pause: NoPause}.withDefaults().Pause)
	require.Equal(t, 5*time.Millisecond, Config{Pause: 5 * time.Millisecond}.withDefaults().Pause)

	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Pause: -2 * time.Millisecond}, "cleanup.NoPause"},
		{Config{Buffer: -2}, "cleanup.NoBuffer"},
		{Config{Topics: map[string]Topic{"t": {Buffer: -time.Second}}}, "cleanup.NoBuffer"},
		{Config{Topics: map[string]Topic{"t": {Window: -time.Hour}}}, "cleanup.NoWindow"},
		{Config{BatchSize: -1}, "BatchSize"},
		{Config{Interval: -time.Second}, "Interval"},
	} {
		tc.cfg.Pool, tc.cfg.Admin = nil, stubAdmin{}
		err := tc.cfg.validate()
		require.ErrorContains(t, err, tc.want)
	}
	ok := Config{Buffer: NoBuffer, Pause: NoPause, Topics: map[string]Topic{"t": {Buffer: NoBuffer, Window: NoWindow}}, Admin: stubAdmin{}}
	err := ok.validate()
	require.ErrorContains(t, err, "missing Pool", "only the pool is missing")
	require.NotContains(t, err.Error(), "negative")
}
