// Package consume is the Kafka-client-neutral consumer loop that the inbox's
// consumer adapters (inbox/inboxsarama, inbox/inboxfranz) drive: per claimed
// partition, collect a batch, run it through the inbox in one transaction,
// fall back to one by one when a message fails, count attempts in
// PostgreSQL, retry with backoff, dead-letter through the outbox, classify
// every error with internal/pgerr, and hand the last record back to the
// adapter to mark only after the commit. It links no Kafka client: an
// adapter hands it a Claim over its client's records.
package consume

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// Defaults of the adapters' settings; each adapter re-exports them.
const (
	BatchSizeDefault        = 1
	BatchWaitDefault        = 10 * time.Millisecond
	MaxAttemptsDefault      = 25
	RetryBackoffDefault     = 100 * time.Millisecond
	MaxRetryBackoffDefault  = 10 * time.Second
	DeadLetterSuffixDefault = ".dlq"
	DrainTimeoutDefault     = 5 * time.Second
)

// No is the sentinel (-1) of the durations whose zero is meaningful.
const No time.Duration = -1

// Config is the loop's share of an adapter's Config, as the user set it
// (zero: the default; No: none).
type Config struct {
	// Name prefixes errors: the adapter's package name.
	Name string

	inbox.ConsumerConfig
}

// WithDefaults fills zero settings and maps the No sentinels to zero.
func (o Config) WithDefaults() Config {
	if o.BatchSize == 0 {
		o.BatchSize = BatchSizeDefault
	}
	o.BatchWait = durationOr(o.BatchWait, BatchWaitDefault)
	if o.MaxAttempts == 0 {
		o.MaxAttempts = MaxAttemptsDefault
	}
	o.RetryBackoff = durationOr(o.RetryBackoff, RetryBackoffDefault)
	if o.MaxRetryBackoff == 0 {
		o.MaxRetryBackoff = MaxRetryBackoffDefault
	}
	o.DrainTimeout = durationOr(o.DrainTimeout, DrainTimeoutDefault)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// durationOr maps 0 to def and the No sentinel (-1) to zero.
func durationOr(d, def time.Duration) time.Duration {
	switch d {
	case 0:
		return def
	case No:
		return 0
	}
	return d
}

// Validate refuses settings the loop cannot honour, naming the setting and
// how to write what the user meant.
func (o Config) Validate() error {
	switch {
	case o.BatchSize < 0:
		return fmt.Errorf("%s: Config.BatchSize is negative (%d): use 1 for a transaction per message, or more to batch", o.Name, o.BatchSize)
	case o.BatchWait < -1:
		return fmt.Errorf("%s: Config.BatchWait is negative (%v): use NoBatchWait for no wait, 0 for the default", o.Name, o.BatchWait)
	case o.MaxAttempts < 0:
		return fmt.Errorf("%s: Config.MaxAttempts is negative (%d): use 1 to dead-letter on the first failure (no retries), 0 for the default", o.Name, o.MaxAttempts)
	case o.RetryBackoff < -1:
		return fmt.Errorf("%s: Config.RetryBackoff is negative (%v): use NoRetryBackoff for no wait, 0 for the default", o.Name, o.RetryBackoff)
	case o.MaxRetryBackoff < 0:
		return fmt.Errorf("%s: Config.MaxRetryBackoff is negative (%v): use NoRetryBackoff for no wait at all, 0 for the default", o.Name, o.MaxRetryBackoff)
	case o.DrainTimeout < -1:
		return fmt.Errorf("%s: Config.DrainTimeout is negative (%v): use NoDrainTimeout to roll back at once, 0 for the default", o.Name, o.DrainTimeout)
	}
	if o.DeadLetterTopic != "" {
		if err := outbox.ValidateTopic(o.DeadLetterTopic); err != nil {
			return fmt.Errorf("%s: Config.DeadLetterTopic %q: %w", o.Name, o.DeadLetterTopic, err)
		}
	}
	return nil
}
