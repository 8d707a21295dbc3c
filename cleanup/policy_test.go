package cleanup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// configResult is what a broker answers for one topic: only the names in cfg
// (a nil value leaves the name out of the answer).
func configResult(cfg map[string]*string) TopicConfig {
	r := TopicConfig{Values: map[string]string{}}
	for k, v := range cfg {
		if v != nil {
			r.Values[k] = *v
		}
	}
	return r
}

// stubAdmin is an Admin answering fixed configs, for values no broker would
// hand out, and no log start offsets.
type stubAdmin map[string]map[string]*string

func (s stubAdmin) TopicConfigs(_ context.Context, topics, _ []string) (map[string]TopicConfig, error) {
	out := map[string]TopicConfig{}
	for _, t := range topics {
		out[t] = configResult(s[t])
	}
	return out, nil
}

func (s stubAdmin) LogStarts(context.Context, []string) (map[string]LogStarts, error) {
	return nil, errors.New("stub: no offsets")
}

// cleanup.policy is read as Kafka reads it (a comma-separated list, spaces
// trimmed), and a topic has a time window only when every token is known,
// delete is among them and compact is not. Every value pgbox cannot interpret
// keeps the keys of unknown position.
func TestParseTopicPolicyAndValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name             string
		policy, ret, seg *string
		reason           Reason
		errHas           []string
	}{
		{name: "delete", policy: ptr("delete")},
		{name: "compact,delete", policy: ptr("compact,delete"), reason: ReasonCompactDelete, errHas: []string{"segments"}},
		{name: "spaces", policy: ptr(" delete , compact "), reason: ReasonCompactDelete},
		{name: "delete-twice", policy: ptr("delete, delete")},
		{name: "upper", policy: ptr("Delete"), reason: ReasonUnknownPolicy, errHas: []string{`"Delete"`}},
		{name: "compact", policy: ptr("compact"), reason: ReasonCompacted},
		{name: "empty", policy: ptr(""), reason: ReasonEmptyPolicy},
		{name: "blank", policy: ptr(" "), reason: ReasonEmptyPolicy},
		{name: "tiered", policy: ptr("delete,tiered"), reason: ReasonUnknownPolicy, errHas: []string{"tiered", "delete,tiered"}},
		{name: "empty-token", policy: ptr("delete,"), reason: ReasonUnknownPolicy},
		{name: "missing-policy", reason: ReasonPolicyMissing},
		{name: "infinite", policy: ptr("delete"), ret: ptr("-1"), reason: ReasonInfiniteRetention},
		{name: "ret-text", policy: ptr("delete"), ret: ptr("1h"), reason: ReasonConfigUnreadable, errHas: []string{"1h", "retention.ms"}},
		{name: "ret-negative", policy: ptr("delete"), ret: ptr("-2"), reason: ReasonConfigUnreadable, errHas: []string{"-2"}},
		// Kafka's Long.MAX_VALUE is its other "forever".
		{name: "ret-max-long", policy: ptr("delete"), ret: ptr("9223372036854775807"), reason: ReasonInfiniteRetention, errHas: []string{"9223372036854775807", "forever"}},
		{name: "ret-overflow", policy: ptr("delete"), ret: ptr("9223372036854775806"), reason: ReasonConfigUnreadable, errHas: []string{"9223372036854775806"}},
		{name: "seg-negative", policy: ptr("delete"), seg: ptr("-1"), reason: ReasonConfigUnreadable, errHas: []string{"segment.ms", "-1"}},
		{name: "seg-overflow", policy: ptr("delete"), seg: ptr("99999999999999999999"), reason: ReasonConfigUnreadable, errHas: []string{"99999999999999999999"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ret, seg := tc.ret, tc.seg
			if ret == nil {
				ret = ptr("3600000")
			}
			if seg == nil {
				seg = ptr("60000")
			}
			k := parseTopic("topic-"+tc.name, configResult(map[string]*string{
				"cleanup.policy": tc.policy, "retention.ms": ret, "segment.ms": seg,
			}), true)
			require.Equal(t, tc.reason, k.reason, "%v", k.err)
			if tc.reason == "" {
				require.NoError(t, k.err)
				require.Equal(t, time.Hour, k.retention)
				return
			}
			require.Error(t, k.err)
			require.Contains(t, k.err.Error(), "topic-"+tc.name, "the reason names the topic")
			for _, s := range tc.errHas {
				require.Contains(t, k.err.Error(), s)
			}
		})
	}
}

// Retention, segment and buffer that each fit but overflow together keep the
// keys rather than saturating into some window.
func TestPlanWindowOverflowKeeps(t *testing.T) {
	t.Parallel()
	huge := ptr("9000000000000") // ~285 years: fits a Duration alone
	c := &Cleaner{cfg: Config{Buffer: 24 * time.Hour}.withDefaults()}
	k := parseTopic("forever-ish", configResult(map[string]*string{
		"cleanup.policy": ptr("delete"), "retention.ms": huge, "segment.ms": huge,
	}), true)
	require.Equal(t, Reason(""), k.reason, "%v", k.err)
	tr := c.plan("forever-ish", k, topicPositions{}, fixedNow())
	require.True(t, tr.Skipped)
	require.Equal(t, ReasonConfigUnreadable, tr.Reason)
	require.ErrorContains(t, tr.Err, "forever-ish")
}

// Keys of unknown position of topics without a time window (compact only,
// compact,delete, an empty policy, a policy pgbox does not know) survive a
// pass however old they are; so do keys of known position on those topics
// while Kafka's log start has not moved. Real topics on the embedded broker.
// (TestExactRuleEveryPolicy moves the log start.)
func TestKeepForeverPoliciesSurviveCleanup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	short := map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Minute)}
	kept := map[string]Reason{
		"compact-only":   ReasonCompacted,
		"empty-policy":   ReasonEmptyPolicy,
		"tiered":         ReasonUnknownPolicy,
		"compact-delete": ReasonCompactDelete,
	}
	policies := map[string]string{"compact-only": "compact", "empty-policy": "", "tiered": "delete,tiered", "compact-delete": "compact,delete"}
	for topic, p := range policies {
		cfg := map[string]string{"cleanup.policy": p}
		for k, v := range short {
			cfg[k] = v
		}
		b.topic(t, topic, cfg)
		// Far older than retention.ms + segment.ms + buffer.
		b.insertKey(t, topic, "ancient", now.Add(-365*24*time.Hour), nil)
		b.insertAt(t, topic, "known", 0, 0, now.Add(-365*24*time.Hour))
	}
	rep, err := b.cleaner(t, Config{Now: func() time.Time { return now }, Buffer: time.Minute}).RunOnce(context.Background())
	require.NoError(t, err)
	for topic, reason := range kept {
		tr, ok := rep.Topic(topic)
		require.True(t, ok, topic)
		require.False(t, tr.Timed, topic)
		require.True(t, tr.Exact, topic)
		require.Equal(t, map[int32]int64{0: 0}, tr.LogStarts, topic)
		require.Equal(t, reason, tr.Reason, "%s: %v", topic, tr.Err)
		require.Equal(t, []string{"ancient", "known"}, b.keys(t, topic), topic)
	}

	// A value the broker would never hand out, through the one-method Admin.
	b.insertKey(t, "odd", "ancient", now.Add(-365*24*time.Hour), nil)
	c := b.cleaner(t, Config{Now: func() time.Time { return now }, Admin: stubAdmin{
		"odd": {"cleanup.policy": ptr("delete"), "retention.ms": ptr("forever"), "segment.ms": ptr("1")},
	}})
	rep, err = c.RunOnce(context.Background())
	require.NoError(t, err)
	tr, _ := rep.Topic("odd")
	require.Equal(t, ReasonConfigUnreadable, tr.Reason)
	require.Equal(t, []string{"ancient"}, b.keys(t, "odd"))
}
