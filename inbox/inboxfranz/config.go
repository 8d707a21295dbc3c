package inboxfranz

import (
	"fmt"
	"time"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/consume"
)

// CommitIntervalDefault is Config.CommitInterval's default (the Java
// client's auto.commit.interval.ms is 5s; sarama's 1s). The defaults of the
// settings both adapters share are inbox's (inbox.BatchSizeDefault…).
const CommitIntervalDefault = time.Second

// LeaveTimeoutDefault is Config.LeaveTimeout's default: well inside
// Kubernetes' 30s termination grace period, which kgo's own wait (up to the
// group's rebalance timeout, 60s by default, when a rebalance is under way)
// is not.
const LeaveTimeoutDefault = 10 * time.Second

// Config configures NewConsumer. The zero value is usable: one message per
// transaction, 25 attempts over about three minutes, dead letters to
// "<topic>.dlq", no topic ids, offsets committed every second.
//
// The settings both adapters share (BatchSize, BatchHandler, BatchWait, MaxAttempts,
// RetryBackoff, MaxRetryBackoff, DeadLetterTopic, DrainTimeout, Logger) are
// [inbox.ConsumerConfig]'s, documented there with their defaults
// (inbox.BatchSizeDefault…) and sentinels (inbox.NoBatchWait…), the same
// for inboxsarama.
type Config struct {
	inbox.ConsumerConfig

	// TopicIDs, when true, asks the cluster for each claimed topic's id (a
	// metadata request, Kafka ≥ 2.8), and inbox.Message.TopicID is set from
	// it, so that ByOffset keys of a topic deleted and recreated under the
	// same name never collide with the old topic's. The id is formatted as
	// inboxsarama formats it, so both adapters build the same keys. When the
	// broker reports no id, messages carry none. Decide before the first
	// deployment: turning it on changes ByOffset keys of messages not yet
	// committed. Defaults to false (no topic ids).
	TopicIDs bool

	// CommitOffsets commits each transaction's offset synchronously after
	// its commit (one broker round trip per transaction) instead of every
	// CommitInterval. It narrows the window of redeliveries after a crash,
	// which the inbox deduplicates anyway. Defaults to false.
	CommitOffsets bool

	// CommitInterval is how often the offsets of committed transactions are
	// committed to Kafka (always also when a partition is revoked and when
	// Run returns). Defaults to CommitIntervalDefault (1s).
	CommitInterval time.Duration

	// LeaveTimeout bounds how long Close waits for the client to leave the
	// group (a rebalance under way, members that died mid-join, a broker
	// that does not answer). Past it, Close closes the client without
	// waiting further: the group notices the member gone after its session
	// timeout (kgo.SessionTimeout) instead, and its partitions are
	// redelivered from the last committed offset, which the inbox dedupes.
	// Defaults to LeaveTimeoutDefault (10s).
	LeaveTimeout time.Duration
}

// core is the loop's share of the settings.
func (o Config) core() consume.Config {
	return consume.Config{Name: "inboxfranz", ConsumerConfig: o.ConsumerConfig}
}

func (o Config) validate() error {
	if o.CommitInterval < 0 {
		return fmt.Errorf("inboxfranz: Config.CommitInterval is negative (%v): use 0 for the default, or CommitOffsets to commit after every transaction", o.CommitInterval)
	}
	if o.LeaveTimeout < 0 {
		return fmt.Errorf("inboxfranz: Config.LeaveTimeout is negative (%v): use 0 for the default (%v), or a positive bound", o.LeaveTimeout, LeaveTimeoutDefault)
	}
	return nil
}
