// Package pgerr is pgbox's one classifier of PostgreSQL and pgx errors. Every
// long-running component (the relay, cleanup, the consumer adapter) asks it
// the same question after a failed statement: will retrying get past this, or
// does a person have to act?
//
//   - Retryable: the connection was lost or refused, the server is shutting
//     down or failing over (57P01/57P02/57P03, 25006 read-only after a
//     failover), a deadlock or serialization failure (40P01, 40001), a lock
//     not available (55P03), too many connections or another resource
//     shortage (class 53), a statement or context deadline. Retry with
//     backoff.
//   - Operator: the schema or the role is wrong (42P01 undefined table, 42703
//     undefined column, 42883 undefined function, 3F000 invalid schema, 42501
//     insufficient privilege, 3D000 unknown database, 28000/28P01
//     authentication). Retrying cannot fix it: stop, and say what to do.
//   - Other: anything else, usually the statement's own fault (a constraint
//     violation, bad input). The caller decides.
//
// WithFix wraps an error of the second class with the exported sentinel
// (re-exported as inbox.ErrNeedsOperator, relay.ErrNeedsOperator and
// cleanup.ErrNeedsOperator, all the same value) and a sentence naming the
// fix, keeping the *pgconn.PgError reachable through errors.As.
package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNeedsOperator is what errors.Is finds in an error that retrying cannot
// fix: a missing table, column or function, a missing privilege, an unknown
// schema or database, failed authentication. Packages re-export it.
var ErrNeedsOperator = errors.New("needs an operator (retrying cannot fix this)")

// Class is what retrying can do about an error.
type Class int

const (
	// Other errors are neither: typically the statement's own fault.
	Other Class = iota
	// Retryable errors may go away by themselves: retry with backoff.
	Retryable
	// Operator errors need a person: stop and report the fix.
	Operator
)

func (c Class) String() string {
	switch c {
	case Retryable:
		return "retryable"
	case Operator:
		return "operator"
	}
	return "other"
}

// SQLSTATE codes pgbox branches on.
const (
	CodeUndefinedTable        = "42P01"
	CodeUndefinedColumn       = "42703"
	CodeUndefinedFunction     = "42883"
	CodeInvalidSchemaName     = "3F000"
	CodeInsufficientPrivilege = "42501"
	CodeInvalidCatalogName    = "3D000"
	CodeInvalidAuthSpec       = "28000"
	CodeInvalidPassword       = "28P01"
	CodeLockNotAvailable      = "55P03"
	CodeSerializationFailure  = "40001"
	CodeDeadlockDetected      = "40P01"
	CodeReadOnlyTransaction   = "25006"
	CodeQueryCanceled         = "57014"
	CodeUniqueViolation       = "23505"
	// A prepared statement gone (a pooler's DISCARD ALL), and a cached
	// plan whose result changed shape ("cached plan must not change result
	// type", 0A000 feature_not_supported).
	CodeInvalidSQLStatementName = "26000"
	CodeFeatureNotSupported     = "0A000"
)

// retryableCodes are the SQLSTATEs outside classes 08 and 53 that retrying
// can get past.
var retryableCodes = map[string]bool{
	CodeSerializationFailure: true,
	CodeDeadlockDetected:     true,
	"40003":                  true, // statement_completion_unknown
	CodeLockNotAvailable:     true,
	CodeQueryCanceled:        true, // statement_timeout, or a cancel request
	"57P01":                  true, // admin_shutdown (also pg_terminate_backend)
	"57P02":                  true, // crash_shutdown
	"57P03":                  true, // cannot_connect_now (starting up, failing over)
	"57P05":                  true, // idle_session_timeout
	"25P03":                  true, // idle_in_transaction_session_timeout
	CodeReadOnlyTransaction:  true, // a standby promoted elsewhere: reconnect
	"58000":                  true, // system_error
	"58030":                  true, // io_error
}

var operatorCodes = map[string]bool{
	CodeUndefinedTable:        true,
	CodeUndefinedColumn:       true,
	CodeUndefinedFunction:     true,
	CodeInvalidSchemaName:     true,
	CodeInsufficientPrivilege: true,
	CodeInvalidCatalogName:    true,
	CodeInvalidAuthSpec:       true,
	CodeInvalidPassword:       true,
}

// Code returns err's SQLSTATE, or "" when err carries no *pgconn.PgError.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Is reports whether err carries a *pgconn.PgError with SQLSTATE code.
func Is(err error, code string) bool { return err != nil && Code(err) == code }

// IsLockTimeout reports whether err is PostgreSQL's lock_not_available
// (55P03): lock_timeout expired, or NOWAIT found the row locked.
func IsLockTimeout(err error) bool { return Is(err, CodeLockNotAvailable) }

// IsUndefinedTable reports whether err is undefined_table (42P01).
func IsUndefinedTable(err error) bool { return Is(err, CodeUndefinedTable) }

// Classify says what retrying can do about err. nil, context.Canceled and
// errors already marked ErrNeedsOperator are handled too (Other, Other,
// Operator).
func Classify(err error) Class {
	if err == nil || errors.Is(err, context.Canceled) {
		return Other
	}
	if errors.Is(err, ErrNeedsOperator) {
		return Operator
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case operatorCodes[pgErr.Code]:
			return Operator
		case retryableCodes[pgErr.Code]:
			return Retryable
		case strings.HasPrefix(pgErr.Code, "08"), // connection_exception
			strings.HasPrefix(pgErr.Code, "53"): // insufficient_resources
			return Retryable
		}
		return Other
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return Retryable
	}
	if pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) {
		return Retryable
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return Retryable // refused, unreachable, TLS: a server on its way back
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) {
		return Retryable
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return Retryable
	}
	return Other
}

// IsRetryable reports whether Classify(err) is Retryable.
func IsRetryable(err error) bool { return Classify(err) == Retryable }

// NeedsOperator reports whether Classify(err) is Operator.
func NeedsOperator(err error) bool { return Classify(err) == Operator }

// WithFix returns err marked with ErrNeedsOperator and the sentence that
// names the fix, or err itself when it is not an operator error (or already
// marked). errors.As(*pgconn.PgError) still finds the server's error.
func WithFix(err error) error {
	if err == nil || errors.Is(err, ErrNeedsOperator) || Classify(err) != Operator {
		return err
	}
	return &operatorError{err: err, fix: Fix(err)}
}

type operatorError struct {
	err error
	fix string
}

func (e *operatorError) Error() string {
	return fmt.Sprintf("%v (%v: %s)", e.err, ErrNeedsOperator, e.fix)
}

func (e *operatorError) Unwrap() []error { return []error{e.err, ErrNeedsOperator} }

// Fix names what an operator does about err, or "" when err is not an
// operator error. It names objects from the server's message, never a
// password.
func Fix(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !operatorCodes[pgErr.Code] {
		return ""
	}
	pgbox := strings.Contains(pgErr.Message, "pgbox_") || strings.HasPrefix(pgErr.TableName, "pgbox_")
	switch pgErr.Code {
	case CodeUndefinedTable, CodeUndefinedColumn, CodeUndefinedFunction:
		if pgbox {
			return "pgbox's tables are missing or older than this code: run `relay migrate up` (or migrations.Up) " +
				"against this database, with the search_path the component uses"
		}
		return "a table, column or function the SQL uses does not exist: apply the service's migrations " +
			"(was a deploy's migration skipped?), and `relay migrate up` for pgbox's tables"
	case CodeInvalidSchemaName:
		return "the schema does not exist: create it, or fix search_path in the connection settings"
	case CodeInsufficientPrivilege:
		what := "the tables it uses"
		if pgErr.TableName != "" {
			what = pgErr.TableName
		} else if i := strings.LastIndex(pgErr.Message, " "); i >= 0 && strings.HasPrefix(pgErr.Message, "permission denied") {
			what = pgErr.Message[i+1:]
		}
		return fmt.Sprintf("grant the role this component connects as the privileges it needs on %s "+
			"(e.g. GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA <schema> TO <role>; "+
			"GRANT USAGE ON ALL SEQUENCES IN SCHEMA <schema> TO <role>)", what)
	case CodeInvalidCatalogName:
		return "the database does not exist: create it, or fix the database name in the connection URL"
	default: // 28000, 28P01
		return "authentication failed: fix the user or password in the connection settings, or pg_hba.conf"
	}
}
