package cleanup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// Reason says why a topic's keys were not pruned.
type Reason string

// Reasons a topic is skipped. Each is also the value logged under "reason".
const (
	// ReasonInfiniteRetention: the topic has retention.ms = -1; Kafka keeps
	// its records forever, so a key can be redelivered at any time.
	ReasonInfiniteRetention Reason = "infinite_retention"
	// ReasonCompacted: cleanup.policy is compact without delete; the latest
	// record of every Kafka key is kept forever. (compact,delete is pruned by
	// time: Kafka deletes its old segments as for delete.)
	ReasonCompacted Reason = "compacted"
	// ReasonEmptyPolicy: cleanup.policy is empty; newer Kafka releases accept
	// it and then delete nothing by time.
	ReasonEmptyPolicy Reason = "empty_cleanup_policy"
	// ReasonUnknownPolicy: cleanup.policy holds a token pgbox does not
	// recognise (anything but delete and compact, e.g. "delete,tiered"); pgbox
	// cannot tell how long Kafka keeps the records, so it keeps the keys.
	ReasonUnknownPolicy Reason = "unknown_cleanup_policy"
	// ReasonPolicyMissing: Kafka's answer has no cleanup.policy for the topic.
	ReasonPolicyMissing Reason = "cleanup_policy_missing"
	// ReasonTopicNotFound: Kafka does not know the topic (deleted, or a typo).
	ReasonTopicNotFound Reason = "topic_not_found"
	// ReasonKafkaUnreachable: the DescribeConfigs request failed or timed out.
	ReasonKafkaUnreachable Reason = "kafka_unreachable"
	// ReasonConfigUnreadable: Kafka answered, but not with a usable
	// retention.ms, segment.ms and cleanup.policy for the topic (an error
	// code such as an authorization failure, or a missing or invalid value).
	ReasonConfigUnreadable Reason = "config_unreadable"
)

// kafkaTopic is what Kafka says about one topic's retention.
type kafkaTopic struct {
	retention, segment time.Duration // valid when reason == ""
	retentionMs        int64
	segmentMs          int64
	policy             string
	reason             Reason
	err                error // detail for reason
}

var configNames = []string{"retention.ms", "segment.ms", "cleanup.policy"}

// describeTopics reads retention.ms, segment.ms and cleanup.policy of every
// topic in one DescribeConfigs call (sarama sends all topic resources in one
// request to one broker). It never fails as a whole: every topic gets either
// its window or a reason.
func describeTopics(ctx context.Context, admin ConfigDescriber, timeout time.Duration, topics []string) map[string]kafkaTopic {
	out := make(map[string]kafkaTopic, len(topics))
	if len(topics) == 0 {
		return out
	}
	res := make([]*sarama.ConfigResource, len(topics))
	for i, t := range topics {
		res[i] = &sarama.ConfigResource{Type: sarama.TopicResource, Name: t, ConfigNames: configNames}
	}

	// sarama's admin calls take no context: run the call aside so that a
	// cancelled ctx or a hung broker does not hold the pass. The goroutine ends
	// when sarama's own network timeouts fire.
	type answer struct {
		results []*sarama.ConfigResourceResult
		err     error
	}
	ch := make(chan answer, 1)
	go func() {
		r, err := admin.DescribeConfigs(res, sarama.DescribeConfigsOptions{})
		ch <- answer{r, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var a answer
	select {
	case a = <-ch:
	case <-timer.C:
		a.err = fmt.Errorf("no answer within %v", timeout)
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	if a.err != nil {
		for _, t := range topics {
			out[t] = kafkaTopic{reason: ReasonKafkaUnreachable, err: fmt.Errorf("describe configs: %w", a.err)}
		}
		return out
	}

	byName := make(map[string]*sarama.ConfigResourceResult, len(a.results))
	for _, r := range a.results {
		if r != nil && r.Type == sarama.TopicResource {
			byName[r.Name] = r
		}
	}
	for _, t := range topics {
		out[t] = parseTopic(t, byName[t])
	}
	return out
}

func parseTopic(name string, r *sarama.ConfigResourceResult) kafkaTopic {
	if r == nil {
		return kafkaTopic{reason: ReasonConfigUnreadable, err: errors.New("topic missing from the DescribeConfigs response")}
	}
	if r.ErrorCode != sarama.ErrNoError {
		err := error(r.ErrorCode)
		if r.ErrorMsg != "" {
			err = fmt.Errorf("%w: %s", r.ErrorCode, r.ErrorMsg)
		}
		if r.ErrorCode == sarama.ErrUnknownTopicOrPartition {
			return kafkaTopic{reason: ReasonTopicNotFound, err: err}
		}
		return kafkaTopic{reason: ReasonConfigUnreadable, err: err}
	}
	vals := make(map[string]string, 3)
	for _, e := range r.Configs {
		if e.Sensitive {
			continue
		}
		vals[e.Name] = e.Value
	}
	var k kafkaTopic
	keep := func(reason Reason, format string, args ...any) kafkaTopic {
		k.reason, k.err = reason, fmt.Errorf("topic %q: "+format, append([]any{name}, args...)...)
		return k
	}
	policy, ok := vals["cleanup.policy"]
	if !ok {
		return keep(ReasonPolicyMissing, "cleanup.policy missing from the answer")
	}
	k.policy = policy
	rv, ok := vals["retention.ms"]
	if !ok {
		return keep(ReasonConfigUnreadable, "retention.ms missing from the answer")
	}
	ret, ok := parseMs(rv)
	if !ok && strings.TrimSpace(rv) != "-1" {
		return keep(ReasonConfigUnreadable, "retention.ms %q is not a number of milliseconds (0..%d) or -1", rv, maxMs)
	}
	if !ok {
		ret = -1
	}
	k.retentionMs = ret
	sv, ok := vals["segment.ms"]
	if !ok {
		return keep(ReasonConfigUnreadable, "segment.ms missing from the answer")
	}
	seg, ok := parseMs(sv)
	if !ok {
		return keep(ReasonConfigUnreadable, "segment.ms %q is not a number of milliseconds (0..%d)", sv, maxMs)
	}
	k.segmentMs = seg
	if reason, why := policyKeeps(policy); reason != "" {
		return keep(reason, "cleanup.policy %q %s", policy, why)
	}
	if ret == -1 {
		return keep(ReasonInfiniteRetention, "retention.ms=-1")
	}
	k.retention = time.Duration(ret) * time.Millisecond
	k.segment = time.Duration(seg) * time.Millisecond
	return k
}

// policyKeeps reads cleanup.policy as Kafka does (a comma-separated list,
// spaces trimmed). Only a list of known tokens that includes delete lets Kafka
// delete records by time; anything else keeps the keys, with the reason.
func policyKeeps(policy string) (Reason, string) {
	if strings.TrimSpace(policy) == "" {
		return ReasonEmptyPolicy, "is empty: Kafka deletes nothing by time"
	}
	hasDelete := false
	for tok := range strings.SplitSeq(policy, ",") {
		switch strings.TrimSpace(tok) {
		case "delete":
			hasDelete = true
		case "compact":
		default:
			return ReasonUnknownPolicy, fmt.Sprintf("holds %q, which pgbox does not recognise (known: delete, compact)", strings.TrimSpace(tok))
		}
	}
	if !hasDelete {
		return ReasonCompacted, "has no delete: Kafka keeps the latest record of each key forever"
	}
	return "", ""
}

// maxMs is the longest duration in milliseconds a time.Duration holds.
const maxMs = int64(1<<63-1) / int64(time.Millisecond)

// parseMs parses a non-negative millisecond count that converts to a
// time.Duration without overflow.
func parseMs(v string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 || n > maxMs {
		return 0, false
	}
	return n, true
}
