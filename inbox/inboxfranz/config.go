package inboxfranz

import (
	"fmt"
	"time"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/consume"
)

// Defaults of Config. They are inboxsarama's: a service moving from one
// client to the other keeps its behaviour.
const (
	// BatchSizeDefault is Config.BatchSize's default: one message per
	// transaction.
	BatchSizeDefault = consume.BatchSizeDefault
	// BatchWaitDefault is Config.BatchWait's default.
	BatchWaitDefault = consume.BatchWaitDefault
	// MaxAttemptsDefault is Config.MaxAttempts's default. With the default
	// backoff the 24 waits between the first and the last attempt add up to
	// about three minutes: long enough to ride out a downstream service's
	// restart or a failover before a healthy message is dead-lettered. The
	// price: a poison message holds its partition that long. A handler that
	// knows an error cannot pass returns Permanent(err) and skips the wait.
	MaxAttemptsDefault = consume.MaxAttemptsDefault
	// RetryBackoffDefault is Config.RetryBackoff's default.
	RetryBackoffDefault = consume.RetryBackoffDefault
	// MaxRetryBackoffDefault is Config.MaxRetryBackoff's default.
	MaxRetryBackoffDefault = consume.MaxRetryBackoffDefault
	// DeadLetterSuffixDefault is appended to the source topic's name to make
	// the dead-letter topic when Config.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = consume.DeadLetterSuffixDefault
	// DrainTimeoutDefault is Config.DrainTimeout's default.
	DrainTimeoutDefault = consume.DrainTimeoutDefault
	// CommitIntervalDefault is Config.CommitInterval's default (the Java
	// client's auto.commit.interval.ms is 5s; sarama's 1s).
	CommitIntervalDefault = time.Second
)

// Sentinels for the Config durations whose zero is a meaningful value (a
// zero field means the default).
const (
	// NoBatchWait asks Config.BatchWait for no wait: a batch is what is
	// already buffered.
	NoBatchWait time.Duration = -1
	// NoRetryBackoff asks Config.RetryBackoff for no wait between retries.
	NoRetryBackoff time.Duration = -1
	// NoDrainTimeout asks Config.DrainTimeout for none: a transaction in
	// flight when its partition is revoked is rolled back at once.
	NoDrainTimeout time.Duration = -1
)

// ErrPermanent is what errors.Is finds in an error made with Permanent (it
// is inbox.ErrPermanent, as inboxsarama's is).
var ErrPermanent = inbox.ErrPermanent

// Permanent marks a handler error as one that retrying cannot fix: the
// message is dead-lettered at once instead of retried up to
// Config.MaxAttempts. Permanent(nil) is nil. It is inbox.Permanent.
func Permanent(err error) error { return inbox.Permanent(err) }

// Stats counts what a Consumer did since it was made. Processed and
// Duplicates count committed transactions only.
type Stats = inbox.ConsumerStats

// Config configures NewConsumer. The zero value is usable: one message per
// transaction, 25 attempts over about three minutes, dead letters to
// "<topic>.dlq", no topic ids, offsets committed every second.
//
// The settings both adapters share (BatchSize, BatchHandler, BatchWait, MaxAttempts,
// RetryBackoff, MaxRetryBackoff, DeadLetterTopic, DrainTimeout, Logger) are
// [inbox.ConsumerConfig]'s, documented there; their defaults are this
// package's XxxDefault constants, the same as inboxsarama's.
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
}

// core is the loop's share of the settings.
func (o Config) core() consume.Config {
	return consume.Config{Name: "inboxfranz", ConsumerConfig: o.ConsumerConfig}
}

func (o Config) validate() error {
	if o.CommitInterval < 0 {
		return fmt.Errorf("inboxfranz: Config.CommitInterval is negative (%v): use 0 for the default, or CommitOffsets to commit after every transaction", o.CommitInterval)
	}
	return nil
}
