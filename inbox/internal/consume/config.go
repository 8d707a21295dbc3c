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

// Config is the loop's share of an adapter's Config, as the user set it
// (zero: the default; inbox.NoXxx: none).
type Config struct {
	// Name prefixes errors: the adapter's package name.
	Name string

	inbox.ConsumerConfig
}

// WithDefaults fills zero settings and maps the inbox.NoXxx sentinels to zero.
func (o Config) WithDefaults() Config {
	if o.BatchSize == 0 {
		o.BatchSize = inbox.BatchSizeDefault
	}
	o.BatchWait = durationOr(o.BatchWait, inbox.BatchWaitDefault)
	if o.MaxAttempts == 0 {
		o.MaxAttempts = inbox.MaxAttemptsDefault
	}
	o.RetryBackoff = durationOr(o.RetryBackoff, inbox.RetryBackoffDefault)
	if o.MaxRetryBackoff == 0 {
		o.MaxRetryBackoff = inbox.MaxRetryBackoffDefault
	}
	o.DrainTimeout = durationOr(o.DrainTimeout, inbox.DrainTimeoutDefault)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// durationOr maps 0 to def and the NoXxx sentinel (-1) to zero.
func durationOr(d, def time.Duration) time.Duration {
	switch d {
	case 0:
		return def
	case -1: // inbox.NoBatchWait, NoRetryBackoff, NoDrainTimeout
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
		return fmt.Errorf("%s: Config.BatchWait is negative (%v): use inbox.NoBatchWait for no wait, 0 for the default", o.Name, o.BatchWait)
	case o.MaxAttempts < 0:
		return fmt.Errorf("%s: Config.MaxAttempts is negative (%d): use 1 to dead-letter on the first failure (no retries), 0 for the default", o.Name, o.MaxAttempts)
	case o.RetryBackoff < -1:
		return fmt.Errorf("%s: Config.RetryBackoff is negative (%v): use inbox.NoRetryBackoff for no wait, 0 for the default", o.Name, o.RetryBackoff)
	case o.MaxRetryBackoff < 0:
		return fmt.Errorf("%s: Config.MaxRetryBackoff is negative (%v): use inbox.NoRetryBackoff for no wait at all, 0 for the default", o.Name, o.MaxRetryBackoff)
	case o.DrainTimeout < -1:
		return fmt.Errorf("%s: Config.DrainTimeout is negative (%v): use inbox.NoDrainTimeout to roll back at once, 0 for the default", o.Name, o.DrainTimeout)
	}
	if o.DeadLetterTopic != "" {
		if err := outbox.ValidateTopic(o.DeadLetterTopic); err != nil {
			return fmt.Errorf("%s: Config.DeadLetterTopic %q: %w", o.Name, o.DeadLetterTopic, err)
		}
	}
	return nil
}
