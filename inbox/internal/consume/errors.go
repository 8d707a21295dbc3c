package consume

import (
	"context"
	"errors"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/owntx"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// errKind is how the consumer adapter treats a failed attempt.
type errKind int

const (
	errHandler   errKind = iota // the handler failed: count, retry, then dead-letter
	errPermanent                // dead-letter now
	errRetry                    // the database: retry with backoff, uncounted
	errOperator                 // the database needs an operator: end the claim
	errUnknown                  // not the message's fault, not known to pass: retry, uncounted, log as error
)

// classify decides what a failed attempt means. herr is the handler's own
// error (nil when the handler did not fail). The handler's database errors go
// through the same classifier as the adapter's own: a missing table or a
// revoked grant is never the message's fault, so it never dead-letters it.
func classify(err, herr error) errKind {
	if herr != nil {
		switch {
		case errors.Is(herr, inbox.ErrPermanent):
			return errPermanent
		case pgerr.NeedsOperator(herr):
			return errOperator
		case errors.Is(herr, context.DeadlineExceeded), pgerr.Is(herr, pgerr.CodeQueryCanceled):
			// The handler's own time limit: a handler that always times
			// out must not retry forever uncounted.
			return errHandler
		case pgerr.IsRetryable(herr):
			return errRetry
		}
		return errHandler
	}
	switch {
	case errors.Is(err, inbox.ErrInvalidMessage), errors.Is(err, inbox.ErrFingerprintMismatch):
		return errPermanent
	case errors.Is(err, inbox.ErrInFlight), owntx.IsConflict(err):
		// A key in flight, or seen before on every try inTx allows (a
		// redelivery whose runs kept meeting keys committed meanwhile):
		// transient, never the message's fault.
		return errRetry
	}
	switch pgerr.Classify(err) {
	case pgerr.Operator:
		return errOperator
	case pgerr.Retryable:
		return errRetry
	}
	var ce *commitError
	if errors.As(err, &ce) {
		// COMMIT failed for a reason other than the connection: a deferred
		// constraint, or a handler that swallowed an error and left the
		// transaction aborted. The message's work is at fault.
		return errHandler
	}
	return errUnknown
}
