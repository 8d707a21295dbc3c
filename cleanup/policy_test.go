package cleanup

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// configResult is what a broker answers for one topic: only the names in cfg
// (a nil value leaves the name out of the answer).
func configResult(topic string, cfg map[string]*string) *sarama.ConfigResourceResult {
	r := &sarama.ConfigResourceResult{Type: sarama.TopicResource, Name: topic}
	for k, v := range cfg {
		if v != nil {
			r.Configs = append(r.Configs, sarama.ConfigEntry{Name: k, Value: *v})
		}
	}
	return r
}

// stubAdmin is cleanup's one-method Admin answering fixed configs, for values
// no broker would hand out.
type stubAdmin map[string]map[string]*string

func (s stubAdmin) DescribeConfigs(res []*sarama.ConfigResource, _ sarama.DescribeConfigsOptions) ([]*sarama.ConfigResourceResult, error) {
	var out []*sarama.ConfigResourceResult
	for _, r := range res {
		out = append(out, configResult(r.Name, s[r.Name]))
	}
	return out, nil
}

// cleanup.policy is read as Kafka reads it (a comma-separated list, spaces
// trimmed), and a topic is pruned only when every token is known and delete is
// among them. Every value pgbox cannot interpret keeps the keys.
func TestParseTopicPolicyAndValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name             string
		policy, ret, seg *string
		reason           Reason
		errHas           []string
	}{
		{name: "delete", policy: ptr("delete")},
		{name: "compact,delete", policy: ptr("compact,delete")},
		{name: "spaces", policy: ptr(" delete , compact ")},
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
		{name: "ret-overflow", policy: ptr("delete"), ret: ptr("9223372036854775807"), reason: ReasonConfigUnreadable, errHas: []string{"9223372036854775807"}},
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
			k := parseTopic("topic-"+tc.name, configResult("topic-"+tc.name, map[string]*string{
				"cleanup.policy": tc.policy, "retention.ms": ret, "segment.ms": seg,
			}))
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
	k := parseTopic("forever-ish", configResult("forever-ish", map[string]*string{
		"cleanup.policy": ptr("delete"), "retention.ms": huge, "segment.ms": huge,
	}))
	require.Equal(t, Reason(""), k.reason, "%v", k.err)
	tr := c.plan("forever-ish", k, fixedNow())
	require.True(t, tr.Skipped)
	require.Equal(t, ReasonConfigUnreadable, tr.Reason)
	require.ErrorContains(t, tr.Err, "forever-ish")
}

// Keys of topics Kafka keeps forever (compact only, an empty policy, a policy
// pgbox does not know) survive a pass however old they are; compact,delete is
// pruned by time. Real topics on the embedded broker.
func TestKeepForeverPoliciesSurviveCleanup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	short := map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Minute)}
	kept := map[string]Reason{
		"compact-only": ReasonCompacted,
		"empty-policy": ReasonEmptyPolicy,
		"tiered":       ReasonUnknownPolicy,
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
	}
	rep, err := b.cleaner(t, Config{Now: func() time.Time { return now }, Buffer: time.Minute}).RunOnce(context.Background())
	require.NoError(t, err)
	for topic, reason := range kept {
		tr, ok := rep.Topic(topic)
		require.True(t, ok, topic)
		require.True(t, tr.Skipped, topic)
		require.Equal(t, reason, tr.Reason, "%s: %v", topic, tr.Err)
		require.Equal(t, []string{"ancient"}, b.keys(t, topic), topic)
	}
	tr, _ := rep.Topic("compact-delete")
	require.False(t, tr.Skipped, "%v", tr.Err)
	require.Empty(t, b.keys(t, "compact-delete"))

	// A value the broker would never hand out, through the one-method Admin.
	b.insertKey(t, "odd", "ancient", now.Add(-365*24*time.Hour), nil)
	c := b.cleaner(t, Config{Now: func() time.Time { return now }, Admin: stubAdmin{
		"odd": {"cleanup.policy": ptr("delete"), "retention.ms": ptr("forever"), "segment.ms": ptr("1")},
	}})
	rep, err = c.RunOnce(context.Background())
	require.NoError(t, err)
	tr, _ = rep.Topic("odd")
	require.Equal(t, ReasonConfigUnreadable, tr.Reason)
	require.Equal(t, []string{"ancient"}, b.keys(t, "odd"))
}
