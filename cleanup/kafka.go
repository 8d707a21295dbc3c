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
	// ReasonCompacted: cleanup.policy contains compact; the latest record of
	// every Kafka key is kept forever.
	ReasonCompacted Reason = "compacted"
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
		out[t] = parseTopic(byName[t])
	}
	return out
}

func parseTopic(r *sarama.ConfigResourceResult) kafkaTopic {
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
	unreadable := func(format string, args ...any) kafkaTopic {
		k.reason, k.err = ReasonConfigUnreadable, fmt.Errorf(format, args...)
		return k
	}
	policy, ok := vals["cleanup.policy"]
	if !ok {
		return unreadable("cleanup.policy missing from the answer")
	}
	k.policy = policy
	rv, ok := vals["retention.ms"]
	if !ok {
		return unreadable("retention.ms missing from the answer")
	}
	ret, err := strconv.ParseInt(strings.TrimSpace(rv), 10, 64)
	if err != nil || ret < -1 {
		return unreadable("retention.ms %q is not a number of milliseconds or -1", rv)
	}
	k.retentionMs = ret
	sv, ok := vals["segment.ms"]
	if !ok {
		return unreadable("segment.ms missing from the answer")
	}
	seg, err := strconv.ParseInt(strings.TrimSpace(sv), 10, 64)
	if err != nil || seg < 0 {
		return unreadable("segment.ms %q is not a number of milliseconds", sv)
	}
	k.segmentMs = seg
	for p := range strings.SplitSeq(policy, ",") {
		if strings.TrimSpace(p) == "compact" {
			k.reason, k.err = ReasonCompacted, fmt.Errorf("cleanup.policy=%s", policy)
			return k
		}
	}
	if ret == -1 {
		k.reason, k.err = ReasonInfiniteRetention, errors.New("retention.ms=-1")
		return k
	}
	k.retention = msDuration(ret)
	k.segment = msDuration(seg)
	return k
}

// msDuration converts milliseconds to a Duration, saturating instead of
// overflowing (a retention of centuries is "forever" for our purpose).
func msDuration(ms int64) time.Duration {
	const maxMs = int64(1<<63-1) / int64(time.Millisecond)
	if ms > maxMs/4 {
		ms = maxMs / 4
	}
	return time.Duration(ms) * time.Millisecond
}
