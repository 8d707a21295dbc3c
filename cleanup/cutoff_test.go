package cleanup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCutoffsWithoutLock: Cutoffs gives each topic the window a pass would
// use, while another cleaner's pass holds the cleanup lease (it never waits on it).
func TestCutoffsWithoutLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, "c-finite", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(10 * time.Minute)})
	b.topic(t, "c-compact", map[string]string{"cleanup.policy": "compact"})

	// Another cleaner's pass holds the lease.
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO pgbox_cleanup_lease (owner, expires_at) VALUES ('other-cleaner', now() + interval '1 hour')`)
	require.NoError(t, err)

	now := fixedNow()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := Cutoffs(ctx, CutoffsConfig{Admin: b.admin, Buffer: time.Hour, Topics: map[string]Topic{"c-forced": {Window: 3 * time.Hour}}},
		[]string{"c-finite", "c-compact", "c-missing", "c-forced"}, now)
	require.NoError(t, err)
	require.Len(t, got, 4)

	require.Equal(t, "c-finite", got[0].Topic)
	require.False(t, got[0].Skipped)
	require.Equal(t, 2*time.Hour+10*time.Minute, got[0].Window)
	requireSameTime(t, now.Add(-got[0].Window), got[0].Cutoff)

	require.False(t, got[1].Skipped, "the exact rule applies")
	require.False(t, got[1].Timed)
	require.Equal(t, map[int32]int64{0: 0}, got[1].LogStarts)
	require.Equal(t, ReasonCompacted, got[1].Reason)

	require.True(t, got[2].Skipped)
	require.Equal(t, ReasonTopicNotFound, got[2].Reason)

	require.False(t, got[3].Skipped, "a forced window decides a topic Kafka does not know")
	require.True(t, got[3].Forced)
	require.Equal(t, 3*time.Hour, got[3].Window)
}

// TestCutoffsValidation: Admin is required, bad settings are named, and a
// cleaner's own settings give the same rules.
func TestCutoffsValidation(t *testing.T) {
	t.Parallel()
	_, err := Cutoffs(context.Background(), CutoffsConfig{}, []string{"x"}, time.Now())
	require.ErrorContains(t, err, "missing Admin")
	_, err = Cutoffs(context.Background(), CutoffsConfig{Admin: nopDescriber{}, Buffer: -time.Second}, []string{"x"}, time.Now())
	require.ErrorContains(t, err, "Buffer")
	_, err = Cutoffs(context.Background(), CutoffsConfig{Admin: nopDescriber{}, Topics: map[string]Topic{"t": {Window: -2}}}, []string{"x"}, time.Now())
	require.ErrorContains(t, err, `Topics["t"].Window`)
	full := Config{Admin: nopDescriber{}, Buffer: time.Minute, Window: time.Hour, KafkaTimeout: time.Second,
		Topics: map[string]Topic{"t": {Buffer: NoBuffer}}, BatchSize: 10}
	require.Equal(t, CutoffsConfig{Admin: nopDescriber{}, Buffer: time.Minute, Window: time.Hour, KafkaTimeout: time.Second,
		Topics: map[string]Topic{"t": {Buffer: NoBuffer}}}, full.CutoffsConfig())
	got, err := Cutoffs(context.Background(), CutoffsConfig{Admin: nopDescriber{}}, nil, time.Now())
	require.NoError(t, err)
	require.Empty(t, got)
}

type nopDescriber struct{}

func (nopDescriber) TopicConfigs(context.Context, []string, []string) (map[string]TopicConfig, error) {
	return nil, nil
}

func (nopDescriber) LogStarts(context.Context, []string) (map[string]LogStarts, error) {
	return nil, nil
}
