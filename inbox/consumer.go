package inbox

import (
	"errors"
	"log/slog"
	"time"
)

// ErrPermanent is what errors.Is finds in an error made with Permanent.
var ErrPermanent = errors.New("permanent error")

// Permanent marks a handler error as one that retrying cannot fix (a
// malformed payload, a rule violation): the consumer adapters
// (inbox/inboxsarama, inbox/inboxfranz) dead-letter the message at once
// instead of retrying it up to their MaxAttempts. A handler written once for
// both Kafka clients returns it the same way. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// Headers the consumer adapters (inbox/inboxsarama, inbox/inboxfranz) add to
// a dead-letter record, after the original record's own. Like the relay's
// (outbox.EventIDHeader, "pgbox-event-id"), every header pgbox writes is
// named "pgbox-…", with dashes.
const (
	HeaderDLQError          = "pgbox-dlq-error"            // the last error's text (at most 4 KiB)
	HeaderDLQAttempts       = "pgbox-dlq-attempts"         // attempts made, decimal
	HeaderDLQSourceTopic    = "pgbox-dlq-source-topic"     // the topic consumed
	HeaderDLQSourceTopicID  = "pgbox-dlq-source-topic-id"  // its id, when known
	HeaderDLQSourcePart     = "pgbox-dlq-source-partition" // its partition, decimal
	HeaderDLQSourceOffset   = "pgbox-dlq-source-offset"    // its offset, decimal
	HeaderDLQConsumer       = "pgbox-dlq-consumer"         // Inbox.Consumer()
	HeaderDLQKey            = "pgbox-dlq-key"              // the inbox key, when the record had one
	HeaderDLQContentDropped = "pgbox-dlq-dropped"          // why the value and original headers were left out
)

// ConsumerStats counts what a consumer adapter (inboxsarama.Handler,
// inboxfranz.Consumer) did since it was made. Processed and Duplicates count
// committed transactions only.
type ConsumerStats struct {
	Processed       uint64 // messages whose handler ran and whose transaction committed
	Duplicates      uint64 // messages skipped as already processed, committed
	Failures        uint64 // handler attempts that failed (each counts toward MaxAttempts)
	TransientErrors uint64 // database errors retried, in any step (a claim's start, a message, a batch, recording an attempt, a dead letter); never counted as attempts
	OperatorErrors  uint64 // database errors that need an operator and ended a claim (not counted as attempts)
	Retries         uint64 // attempts repeated after a failure of either kind
	DeadLettered    uint64 // messages dead-lettered
	BatchFallbacks  uint64 // batches retried in parts after a failure: message by message, or cut at the message a batch handler failed
	Gaps            uint64 // watermark modes: committed messages that came after offsets never processed (logged)
}

// Defaults of ConsumerConfig, the same for both consumer adapters.
const (
	// BatchSizeDefault is ConsumerConfig.BatchSize's default: one message
	// per transaction (Process).
	BatchSizeDefault = 1
	// BatchWaitDefault is ConsumerConfig.BatchWait's default.
	BatchWaitDefault = 10 * time.Millisecond
	// MaxAttemptsDefault is ConsumerConfig.MaxAttempts's default. With the
	// default backoff (RetryBackoffDefault doubling to
	// MaxRetryBackoffDefault) the 24 waits between the first and the last
	// attempt add up to about three minutes: long enough to ride out a
	// downstream service's restart or a failover before a healthy message is
	// dead-lettered. The price: a poison message holds its partition that
	// long (the other partitions go on). A handler that knows an error
	// cannot pass returns Permanent(err) and skips the wait.
	MaxAttemptsDefault = 25
	// RetryBackoffDefault is ConsumerConfig.RetryBackoff's default.
	RetryBackoffDefault = 100 * time.Millisecond
	// MaxRetryBackoffDefault is ConsumerConfig.MaxRetryBackoff's default.
	MaxRetryBackoffDefault = 10 * time.Second
	// DeadLetterSuffixDefault is appended to the source topic's name to make
	// the dead-letter topic when ConsumerConfig.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = ".dlq"
	// DrainTimeoutDefault is ConsumerConfig.DrainTimeout's default.
	DrainTimeoutDefault = 5 * time.Second
)

// Sentinels for the ConsumerConfig durations whose zero is a meaningful value
// (a zero field means the default).
const (
	// NoBatchWait asks ConsumerConfig.BatchWait for no wait: a batch is what
	// is already buffered.
	NoBatchWait time.Duration = -1
	// NoRetryBackoff asks ConsumerConfig.RetryBackoff for no wait between
	// retries.
	NoRetryBackoff time.Duration = -1
	// NoDrainTimeout asks ConsumerConfig.DrainTimeout for none: a transaction
	// in flight when its partition is taken away is rolled back at once
	// (unless its COMMIT was already sent: that is waited for).
	NoDrainTimeout time.Duration = -1
)

// ConsumerConfig holds the settings both consumer adapters share; each
// adapter's Config (inboxsarama.Config, inboxfranz.Config) embeds it:
//
//	inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 100}, Client: client}
//
// The members of a group moving from one Kafka client to the other can be
// given the same value. The zero value is usable; the defaults and the NoXxx
// sentinels named below are this package's, for both adapters.
type ConsumerConfig struct {
	// BatchSize is the most messages of one partition processed in one
	// transaction. Above 1, messages go through ProcessBatch (one round trip
	// for all their keys when they are new; keys seen before cost more, see
	// ProcessBatch); a batch whose handler fails is retried message by
	// message, so one poison message cannot hold back the others. Defaults to
	// BatchSizeDefault (1: Process, one transaction per message).
	BatchSize int

	// BatchHandler, when set, does the business work of each batch at once:
	// the adapter calls it once per transaction with the batch's new
	// messages (Inbox.ProcessBatchAtOnce), instead of a per-message handler,
	// which must then be nil (NewHandler(pool, ib, nil, cfg),
	// NewConsumer(pool, ib, nil, cfg, …)). A batch is up to BatchSize
	// messages of one partition: set BatchSize too. When it returns a
	// *BatchError, the batch is cut at the first message it names: the
	// messages before it commit, that message is retried alone (its attempt
	// counted; dead-lettered after MaxAttempts, or at once for Permanent),
	// then the messages after it go on as a new batch, so a partition's
	// messages commit in offset order. Any other error fails the batch,
	// whose messages are then handled one by one (each as a batch of one).
	// Defaults to nil (the per-message handler).
	BatchHandler BatchHandlerFunc

	// BatchWait is how long a batch waits to fill up after its first message
	// arrived; messages already buffered never wait. NoBatchWait means no
	// wait. Defaults to BatchWaitDefault (10ms).
	BatchWait time.Duration

	// MaxAttempts is how many times the handler runs for one message before
	// the message is dead-lettered. Attempts are counted in PostgreSQL
	// (pgbox_consumer_attempts), so they survive restarts and rebalances,
	// and a member of the same group on the other adapter sees them too; a
	// run inside a batch counts like any other. 1 means no retries.
	// Database errors (retryable ones, and those that need an operator) are
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

	// DrainTimeout is how long a transaction already running when its
	// partition is taken away (a rebalance, or the consumer's ctx cancelled)
	// may run on to commit; past it, its context is cancelled and it rolls
	// back. No new transaction starts after that. NoDrainTimeout rolls it
	// back at once. A COMMIT already sent is waited for whatever this says
	// (up to 10s more), then its offset marked: cut off, the COMMIT could
	// still go through on the server, unmarked, and a graceful stop would
	// leave the group's offsets short of what committed. Defaults to DrainTimeoutDefault (5s); keep it well
	// below the group's rebalance timeout (sarama's
	// Consumer.Group.Rebalance.Timeout, franz-go's kgo.RebalanceTimeout).
	DrainTimeout time.Duration

	// Logger receives retries (warn), dead letters, database errors, errors
	// that need an operator and inboxfranz's offset commit failures (error).
	// Defaults to slog.Default() when nil.
	Logger *slog.Logger
}
