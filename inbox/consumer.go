package inbox

import "errors"

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

// ConsumerStats counts what a consumer adapter (inboxsarama.Handler,
// inboxfranz.Consumer) did since it was made. Processed and Duplicates count
// committed transactions only.
type ConsumerStats struct {
	Processed       uint64 // messages whose handler ran and whose transaction committed
	Duplicates      uint64 // messages skipped as already processed, committed
	Failures        uint64 // handler attempts that failed (each counts toward MaxAttempts)
	TransientErrors uint64 // attempts that failed on a retryable database error (not counted as attempts)
	OperatorErrors  uint64 // database errors that need an operator and ended a claim (not counted as attempts)
	Retries         uint64 // attempts repeated after a failure of either kind
	DeadLettered    uint64 // messages dead-lettered
	BatchFallbacks  uint64 // batches retried message by message after a failure
	Gaps            uint64 // watermark modes: committed messages that came after offsets never processed (logged)
}
