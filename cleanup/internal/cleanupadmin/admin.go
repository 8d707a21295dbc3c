// Package cleanupadmin is the Kafka-client-neutral interface through which
// package cleanup reads Kafka: each topic's retention settings and each
// partition's log start offset. Users see it as cleanup.Admin,
// cleanup.TopicConfig and cleanup.LogStarts (aliases). It imports no Kafka
// client, so a service embeds cleanup with the client it already has:
// package cleanupsarama implements Admin over sarama, package cleanupkgo over
// franz-go's kadm. Both pass one test body against the embedded broker
// (TestAdmins).
//
// The interface lives here (not in cleanup) so that the implementations
// beside cleanup need not import it, and cleanup's own tests, which are
// internal, can drive them without an import cycle. Being internal, it adds
// no public name.
package cleanupadmin

import "context"

// Admin reads what the cleaner needs from Kafka. Implementations honour ctx:
// a call returns soon after ctx is done, whatever the broker does.
type Admin interface {
	// TopicConfigs reads the named configs of every topic, in as few
	// requests as the client allows. It returns an error only when Kafka
	// could not be asked or did not answer at all; a topic Kafka answered
	// for with an error gets a TopicConfig whose NotFound or Err says so. A
	// topic missing from the map was missing from Kafka's answer.
	TopicConfigs(ctx context.Context, topics, names []string) (map[string]TopicConfig, error)

	// LogStarts reads every partition's log start offset (ListOffsets with
	// the earliest timestamp, -2: the first offset Kafka can still deliver,
	// remote storage included) and each topic's id. It returns an error
	// only when Kafka could not be asked at all; per-topic and per-partition
	// failures are in the result.
	LogStarts(ctx context.Context, topics []string) (map[string]LogStarts, error)
}

// TopicConfig is Kafka's answer about one topic's configs.
type TopicConfig struct {
	// Values holds the configs Kafka returned, by name; sensitive ones are
	// left out.
	Values map[string]string
	// NotFound is set when Kafka does not know the topic.
	NotFound bool
	// Err is the error Kafka answered with for this topic (an authorization
	// failure, for example); nil when NotFound says it all.
	Err error
}

// LogStarts is Kafka's answer about one topic's partitions.
type LogStarts struct {
	// ID is the topic's id (Kafka 2.8 and later), "" when the broker or the
	// client does not give it.
	ID string
	// Offsets holds the log start offset of every partition Kafka gave one
	// for.
	Offsets map[int32]int64
	// Failed holds the partitions Kafka did not give an offset for, with
	// the reason (no leader, for example).
	Failed map[int32]error
	// NotFound is set when Kafka does not know the topic.
	NotFound bool
	// Err is the error Kafka answered with for the whole topic; nil when
	// NotFound says it all.
	Err error
}
