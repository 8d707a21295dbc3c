package console

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
)

// Defaults for Config fields left zero.
const (
	// MaxActionRowsDefault bounds how many rows one action may touch.
	MaxActionRowsDefault = 1000
	// QueryTimeoutDefault bounds each page's and each action's database work.
	QueryTimeoutDefault = 10 * time.Second
	// KafkaWaitDefault bounds how long a page waits for Kafka.
	KafkaWaitDefault = 3 * time.Second
)

// Page sizes: how many rows a list page and the audit page show.
const (
	listLimit = 100
	auditList = 100
)

// DB is what the console reads and acts on: a *pgxpool.Pool satisfies it.
type DB interface {
	inspect.DB
	inspect.Querier
}

// CleanerStats is what the cleanup page reads of a cleaner running in this
// process: a *cleanup.Cleaner satisfies it.
type CleanerStats interface {
	Stats() cleanup.Stats
}

// Config configures a console Handler. DB is required.
type Config struct {
	// DB is the database holding the pgbox tables (found through its
	// connections' search_path).
	DB DB

	// Auth says who may read and who may act. Defaults to no
	// authentication: every request is an anonymous viewer, who can read
	// every page and take no action. CheckListen refuses such a console on
	// an address other than loopback.
	Auth Auth

	// Inspect configures the snapshots the pages read (inspect.Read);
	// Inspect.Cutoffs, when set, gives the inbox windows and the cleanup
	// page's rules. Defaults to inspect's defaults.
	Inspect inspect.Config

	// Cleaner is the cleaner running in this process, if any: the cleanup
	// page shows its last pass and when the next one is due. Defaults to
	// nil: the page says cleanup does not run here.
	Cleaner CleanerStats

	// CleanupInterval is the time between the Cleaner's passes, to show
	// when the next one is due. Defaults to cleanup.IntervalDefault.
	CleanupInterval time.Duration

	// Published returns how many rows the relay of this process has
	// published so far; the overview shows the rate between two of its
	// readings. Defaults to nil: no rate shown.
	Published func() uint64

	// HidePayloads stops the console from showing message keys' and
	// values' bytes and header values (for PII), and what is derived from
	// them: keys quoted in error texts, a handler's own error text, keys
	// typed into filters as the audit trail records them. Ids, topics,
	// consumers, counts and pgbox's own error context stay visible.
	// Defaults to false: payloads are shown.
	HidePayloads bool

	// MaxActionRows bounds how many rows one action (retry, discard,
	// replay of every row matching a filter) may touch; an action matching
	// more is refused, asking for a narrower filter. Defaults to
	// MaxActionRowsDefault (1,000).
	MaxActionRows int

	// QueryTimeout bounds each page's and each action's database work.
	// Defaults to QueryTimeoutDefault (10s).
	QueryTimeout time.Duration

	// KafkaWait bounds how long the overview and the cleanup page wait for
	// Kafka (topic configs and log start offsets, through
	// Inspect.Cutoffs.Admin); past it the page shows its database sections
	// and says Kafka is not answering. Defaults to KafkaWaitDefault (3s).
	KafkaWait time.Duration

	// Prefix is the path the handler is mounted at (for example
	// "/console", with mux.Handle("/console/", h); not behind
	// http.StripPrefix: the handler strips it itself); requests outside it
	// get 404, and the console's links start with it. Defaults to "":
	// mounted at the root.
	Prefix string

	// CSRFKey signs the forms' CSRF tokens (at least 16 random bytes).
	// Defaults to nil: the key kept in the database (table
	// pgbox_console_secret, made by the first console that needs it), which
	// every console on the database shares, so a form served by one replica
	// is accepted by another, and by a restarted one.
	CSRFKey []byte

	// Logger receives one line per action (the audit trail's copy) and
	// errors. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.MaxActionRows == 0 {
		c.MaxActionRows = MaxActionRowsDefault
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = QueryTimeoutDefault
	}
	if c.KafkaWait == 0 {
		c.KafkaWait = KafkaWaitDefault
	}
	if c.CleanupInterval == 0 {
		c.CleanupInterval = cleanup.IntervalDefault
	}
	c.Prefix = strings.TrimSuffix(c.Prefix, "/")
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("console: missing DB (pass the service's *pgxpool.Pool)"))
	}
	if c.MaxActionRows < 0 {
		errs = append(errs, fmt.Errorf("console: MaxActionRows %d is negative (use a positive count, or 0 for %d)", c.MaxActionRows, MaxActionRowsDefault))
	}
	if c.QueryTimeout < 0 {
		errs = append(errs, fmt.Errorf("console: QueryTimeout %v is negative (use a positive duration, or 0 for %v)", c.QueryTimeout, QueryTimeoutDefault))
	}
	if c.KafkaWait < 0 {
		errs = append(errs, fmt.Errorf("console: KafkaWait %v is negative (use a positive duration, or 0 for %v)", c.KafkaWait, KafkaWaitDefault))
	}
	if c.CleanupInterval < 0 {
		errs = append(errs, fmt.Errorf("console: CleanupInterval %v is negative (use a positive duration, or 0 for %v)", c.CleanupInterval, cleanup.IntervalDefault))
	}
	if c.Prefix != "" && !strings.HasPrefix(c.Prefix, "/") {
		errs = append(errs, fmt.Errorf("console: Prefix %q must start with /", c.Prefix))
	}
	if c.CSRFKey != nil && len(c.CSRFKey) < 16 {
		errs = append(errs, fmt.Errorf("console: CSRFKey has %d bytes; use at least 16 random bytes", len(c.CSRFKey)))
	}
	errs = append(errs, c.Auth.validate())
	return errors.Join(errs...)
}

// ErrNeedsAuth is returned by CheckListen for an address other than
// loopback when the console has no authentication.
var ErrNeedsAuth = errors.New("the console has no authentication: it listens on loopback only (configure a basic-auth user, a bearer token or a trusted proxy header to listen elsewhere)")

// CheckListen refuses addr (host:port) unless it is a loopback address or
// auth authenticates someone: a console that can replay payments is never
// open to the network. An empty host (":8081") is every interface.
func CheckListen(addr string, auth Auth) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console: listen address %q: %w", addr, err)
	}
	if auth.enabled() {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("console: listen address %q: %w", addr, ErrNeedsAuth)
}
