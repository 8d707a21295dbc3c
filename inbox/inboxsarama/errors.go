package inboxsarama

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbox/pgbox/inbox"
)

// ErrPermanent is what errors.Is finds in an error made with Permanent.
var ErrPermanent = errors.New("permanent error")

// Permanent marks a handler error as one that retrying cannot fix (a
// malformed payload, a rule violation): the consumer adapter dead-letters the
// message at once instead of retrying it up to Options.MaxAttempts.
// Permanent(nil) is nil.
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

// errKind is how the consumer adapter treats a failed attempt.
type errKind int

const (
	errHandler   errKind = iota // the handler failed: count, retry, then dead-letter
	errPermanent                // dead-letter now
	errTransient                // retry, uncounted
	errInfra                    // not the message's fault: retry, uncounted, log as error
)

// classify decides what a failed attempt means. herr is the handler's own
// error (nil when the handler did not fail).
func classify(err, herr error) errKind {
	if herr != nil {
		switch {
		case errors.Is(herr, ErrPermanent):
			return errPermanent
		case isTransient(herr):
			return errTransient
		}
		return errHandler
	}
	switch {
	case errors.Is(err, inbox.ErrInvalidMessage), errors.Is(err, inbox.ErrFingerprintMismatch):
		return errPermanent
	case errors.Is(err, inbox.ErrInFlight), isTransient(err):
		return errTransient
	}
	var ce *commitError
	if errors.As(err, &ce) {
		// COMMIT failed for a reason other than the connection: a deferred
		// constraint, or a handler that swallowed an error and left the
		// transaction aborted. The message's work is at fault.
		return errHandler
	}
	return errInfra
}

// isTransient reports whether err is a database failure that retrying the
// same work can get past: a lost or refused connection, a server shutting
// down, a deadlock or serialization failure, a lock or resource shortage.
// A context deadline is not (a handler that always times out must not retry
// forever).
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"40003", // statement_completion_unknown
			"55P03", // lock_not_available
			"57P01", // admin_shutdown (pg_terminate_backend)
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now
			"57P05", // idle_session_timeout
			"25P03", // idle_in_transaction_session_timeout
			"58000", // system_error
			"58030": // io_error
			return true
		}
		switch pgErr.Code[:2] {
		case "08", // connection_exception
			"53": // insufficient_resources (too many connections, out of memory, disk full)
			return true
		}
		return false
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}
