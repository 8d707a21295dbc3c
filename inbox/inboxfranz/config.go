package inboxfranz

import (
	"fmt"
	"log/slog"
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

// Headers added to a dead-letter record, after the original record's own:
// the same as inboxsarama's.
const (
	HeaderDLQError          = consume.HeaderDLQError          // the last error's text (at most 4 KiB)
	HeaderDLQAttempts       = consume.HeaderDLQAttempts       // attempts made, decimal
	HeaderDLQSourceTopic    = consume.HeaderDLQSourceTopic    // the topic consumed
	HeaderDLQSourceTopicID  = consume.HeaderDLQSourceTopicID  // its id, when known
	HeaderDLQSourcePart     = consume.HeaderDLQSourcePart     // its partition, decimal
	HeaderDLQSourceOffset   = consume.HeaderDLQSourceOffset   // its offset, decimal
	HeaderDLQConsumer       = consume.HeaderDLQConsumer       // inbox.Inbox.Consumer()
	HeaderDLQKey            = consume.HeaderDLQKey            // the inbox key, when the record had one
	HeaderDLQContentDropped = consume.HeaderDLQContentDropped // why the value and original headers were left out
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
type Config struct {
	// BatchSize is the most messages of one partition processed in one
	// transaction. Above 1, messages go through ProcessBatch (one round trip
	// for all their keys); a batch whose handler fails is retried message by
	// message, so one poison message cannot hold back the others. Defaults to
	// BatchSizeDefault (1: Process, one transaction per message).
	BatchSize int

	// BatchWait is how long a batch waits to fill up after its first message
	// arrived; messages already buffered never wait. NoBatchWait means no
	// wait. Defaults to BatchWaitDefault (10ms).
	BatchWait time.Duration

	// MaxAttempts is how many times the handler runs for one message before
	// the message is dead-lettered. Attempts are counted in PostgreSQL
	// (pgbox_consumer_attempts), so they survive restarts and rebalances,
	// and a sarama member of the same group sees them too; a run inside a
	// batch counts like any other. 1 means no retries. Database errors are
	// never the message's fault and do not count. Defaults to
	// MaxAttemptsDefault (25: about three minutes of retries, enough to ride
	// out a downstream restart; a poison message holds its partition that
	// long, unless the handler returns Permanent).
	MaxAttempts int

	// RetryBackoff is the wait before the second attempt; it doubles per
	// attempt (with ±20% jitter) up to MaxRetryBackoff. The same schedule
	// paces retries after transient database errors. NoRetryBackoff retries
	// at once. Defaults to RetryBackoffDefault (100ms).
	RetryBackoff time.Duration

	// MaxRetryBackoff caps the wait between attempts. Defaults to
	// MaxRetryBackoffDefault (10s).
	MaxRetryBackoff time.Duration

	// DeadLetterTopic is the topic dead-letter records are written to
	// (through the outbox, for the relay to publish). Defaults to the source
	// topic's name with DeadLetterSuffixDefault (".dlq") appended.
	DeadLetterTopic string

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

	// DrainTimeout is how long a transaction already running when its
	// partition is revoked (or Run's ctx is cancelled) may run on to commit;
	// past it, its context is cancelled and it rolls back. No new
	// transaction starts after the revocation. NoDrainTimeout rolls it back
	// at once. Defaults to DrainTimeoutDefault (5s); keep it well below the
	// group's rebalance timeout (kgo.RebalanceTimeout, 60s by default).
	DrainTimeout time.Duration

	// Logger receives retries (warn), dead letters, database errors, commit
	// failures and errors that need an operator (error). Defaults to
	// slog.Default() when nil.
	Logger *slog.Logger
}

// core is the loop's share of the settings.
func (o Config) core() consume.Config {
	return consume.Config{
		Name: "inboxfranz", BatchSize: o.BatchSize, BatchWait: o.BatchWait, MaxAttempts: o.MaxAttempts,
		RetryBackoff: o.RetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff, DeadLetterTopic: o.DeadLetterTopic,
		DrainTimeout: o.DrainTimeout, Logger: o.Logger,
	}
}

func (o Config) validate() error {
	if o.CommitInterval < 0 {
		return fmt.Errorf("inboxfranz: Config.CommitInterval is negative (%v): use 0 for the default, or CommitOffsets to commit after every transaction", o.CommitInterval)
	}
	return nil
}
