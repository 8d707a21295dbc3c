package cleanup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgbox/pgbox/cleanup/internal/cleanupadmin"
)

// Admin is what the cleaner reads from Kafka: topic configs and log start
// offsets, through a Kafka-client-neutral interface. Package cleanupsarama
// implements it over a sarama ClusterAdmin, package cleanupkgo over
// franz-go's kadm.Client: cleanup itself links neither client. Its two
// methods honour ctx: TopicConfigs(ctx, topics, names) reads the named
// configs of every topic, LogStarts(ctx, topics) every partition's log start
// offset (ListOffsets, earliest) and each topic's id; each returns an error
// only when Kafka could not be asked at all, and per-topic failures in its
// answer.
type Admin = cleanupadmin.Admin

// TopicConfig and LogStarts are an Admin's answers: TopicConfig holds a
// topic's config Values by name, or NotFound, or the Err Kafka answered with;
// LogStarts holds a topic's ID, each partition's log start Offsets, the
// Failed partitions with their reasons, or NotFound, or Err.
type (
	TopicConfig = cleanupadmin.TopicConfig
	LogStarts   = cleanupadmin.LogStarts
)

// Reason says why Kafka's config gives a topic no time window (see
// TopicReport.Reason): why its keys of unknown position are kept.
type Reason string

// Reasons a topic is skipped. Each is also the value logged under "reason".
const (
	// ReasonInfiniteRetention: the topic has retention.ms = -1; Kafka keeps
	// its records forever, so a key can be redelivered at any time.
	ReasonInfiniteRetention Reason = "infinite_retention"
	// ReasonCompacted: cleanup.policy is compact without delete; the latest
	// record of every Kafka key is kept forever.
	ReasonCompacted Reason = "compacted"
	// ReasonCompactDelete: cleanup.policy is compact,delete. Kafka's log
	// cleaner rewrites cleaned segments in groups of up to segment.bytes
	// whatever their time span, and retention deletes a segment by its
	// newest record, so a record can outlive retention.ms + segment.ms by as
	// much as a group spans: the time rule is unsafe. Keys whose position is
	// known are pruned by the exact rule; the others are kept.
	ReasonCompactDelete Reason = "compact_delete"
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
	// ReasonKafkaUnreachable: the request failed or timed out.
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
// topic through admin, within timeout. It never fails as a whole: every topic
// gets either its time window or a reason.
func describeTopics(ctx context.Context, admin Admin, timeout time.Duration, topics []string) map[string]kafkaTopic {
	out := make(map[string]kafkaTopic, len(topics))
	if len(topics) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	answer, err := admin.TopicConfigs(ctx, topics, configNames)
	if err != nil {
		err = unreachable(ctx, timeout, err)
		for _, t := range topics {
			out[t] = kafkaTopic{reason: ReasonKafkaUnreachable, err: err}
		}
		return out
	}
	for _, t := range topics {
		r, ok := answer[t]
		out[t] = parseTopic(t, r, ok)
	}
	return out
}

// unreachable names a Kafka call that ran out of time as such.
func unreachable(ctx context.Context, timeout time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no answer within %v: %w", timeout, err)
	}
	return err
}

// topicPositions is what Kafka says about one topic's partitions: the log
// start offset of each, for the exact rule.
type topicPositions struct {
	id     string
	starts map[int32]int64 // partitions Kafka gave a log start offset for
	err    error           // why the exact rule cannot run for (some of) the topic
}

// readLogStarts reads every topic's log start offsets through admin, within
// timeout. It never fails as a whole: a topic Kafka gave no offsets for has
// no starts and an err.
func readLogStarts(ctx context.Context, admin Admin, timeout time.Duration, topics []string) map[string]topicPositions {
	out := make(map[string]topicPositions, len(topics))
	if len(topics) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	answer, err := admin.LogStarts(ctx, topics)
	if err != nil {
		err = fmt.Errorf("%s: %w", ReasonKafkaUnreachable, unreachable(ctx, timeout, err))
		for _, t := range topics {
			out[t] = topicPositions{err: err}
		}
		return out
	}
	for _, t := range topics {
		ls, ok := answer[t]
		tp := topicPositions{id: ls.ID, starts: ls.Offsets}
		switch {
		case !ok:
			tp.err = errors.New("topic missing from the ListOffsets answer")
		case ls.NotFound:
			tp.err = fmt.Errorf("%s: Kafka does not know the topic", ReasonTopicNotFound)
		case ls.Err != nil:
			tp.err = fmt.Errorf("list offsets: %w", ls.Err)
		case len(ls.Failed) > 0:
			var errs []error
			for _, p := range slices.Sorted(maps.Keys(ls.Failed)) {
				errs = append(errs, fmt.Errorf("partition %d: %w", p, ls.Failed[p]))
			}
			tp.err = fmt.Errorf("no log start offset for %d partitions (their keys are kept): %w", len(ls.Failed), errors.Join(errs...))
		}
		out[t] = tp
	}
	return out
}

func parseTopic(name string, r TopicConfig, answered bool) kafkaTopic {
	switch {
	case !answered:
		return kafkaTopic{reason: ReasonConfigUnreadable, err: errors.New("topic missing from the DescribeConfigs response")}
	case r.NotFound:
		return kafkaTopic{reason: ReasonTopicNotFound, err: fmt.Errorf("topic %q: Kafka does not know it", name)}
	case r.Err != nil:
		return kafkaTopic{reason: ReasonConfigUnreadable, err: r.Err}
	}
	vals := r.Values
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
	if !ok && !infiniteMs(rv) {
		return keep(ReasonConfigUnreadable, "retention.ms %q is not a number of milliseconds (0..%d), -1 or %d", rv, maxMs, int64(math.MaxInt64))
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
		return keep(ReasonInfiniteRetention, "retention.ms=%s (forever)", strings.TrimSpace(rv))
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
	hasDelete, hasCompact := false, false
	for tok := range strings.SplitSeq(policy, ",") {
		switch strings.TrimSpace(tok) {
		case "delete":
			hasDelete = true
		case "compact":
			hasCompact = true
		default:
			return ReasonUnknownPolicy, fmt.Sprintf("holds %q, which pgbox does not recognise (known: delete, compact)", strings.TrimSpace(tok))
		}
	}
	if !hasDelete {
		return ReasonCompacted, "has no delete: Kafka keeps the latest record of each key forever"
	}
	if hasCompact {
		return ReasonCompactDelete, "compacts: the log cleaner merges segments without regard to their time span, so a record can outlive retention.ms + segment.ms; only the exact rule (log start offset) prunes it"
	}
	return "", ""
}

// maxMs is the longest duration in milliseconds a time.Duration holds.
const maxMs = int64(1<<63-1) / int64(time.Millisecond)

// infiniteMs reports whether v is one of Kafka's "forever" values for
// retention.ms: -1, or Long.MAX_VALUE (9223372036854775807), which some tools
// write for "never delete" and Kafka treats alike.
func infiniteMs(v string) bool {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return err == nil && (n == -1 || n == math.MaxInt64)
}

// parseMs parses a non-negative millisecond count that converts to a
// time.Duration without overflow.
func parseMs(v string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 || n > maxMs {
		return 0, false
	}
	return n, true
}
