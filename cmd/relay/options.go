package main

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/kafkaconf"
)

// Option groups: each subcommand reads some of them.
const (
	groupDB            = "Database"
	groupKafka         = "Kafka"
	groupKafkaOptional = "Kafka (optional)"
	groupRelay         = "Relay"
	groupCleanup       = "Cleanup"
	groupSchedule      = "Cleanup schedule"
	groupCleanupOnce   = "Cleanup pass"
	groupHTTP          = "HTTP"
	groupStatus        = "Status"
	groupLog           = "Process"
)

var allGroups = []string{groupDB, groupTargets, groupTargetsWatch, groupTargetsEach, groupKafka, groupRelay, groupSchedule, groupCleanup, groupCleanupOnce, groupHTTP, groupConsole, groupStatus, groupOps, groupOpsParked, groupOpsDead, groupMigrate, groupLog}

// Defaults of the binary's own settings (the libraries' defaults are reused
// where a setting passes straight through).
const (
	httpAddrDefault = ":8080"
	// httpConnsPerClientDefault is --http-conns-per-client: a browser opens
	// up to 6 connections, a proxy pools a few dozen.
	httpConnsPerClientDefault = 64
	shutdownTimeoutDefault    = 30 * time.Second
	kafkaVersionDefault       = "3.6.0"
	kafkaClientIDDefault      = "pgbox-relay"
	kafkaTimeoutDefault       = 10 * time.Second
	dbMaxConnsDefault         = 10
	cleanupIntervalDefault    = cleanup.IntervalDefault
	cleanupBufferDefault      = cleanup.BufferDefault
	cleanupBatchDefault       = cleanup.BatchSizeDefault
)

// options is every setting of the binary; a subcommand fills the groups it
// reads.
type options struct {
	DatabaseURL string
	Schema      string
	DBMaxConns  int

	Targets targetOptions
	// TargetMetrics is --target-metrics (`relay run` with a target list).
	TargetMetrics targetSeries

	Kafka         kafkaOptions
	kafkaRequired bool
	kafkaBound    bool

	Relay relayOptions

	Ops opsOptions

	CleanupInterval  time.Duration
	CleanupBuffer    time.Duration
	CleanupWindow    time.Duration
	CleanupBatchSize int
	CleanupPause     time.Duration
	KeepParked       time.Duration
	KeepDeadLetters  time.Duration
	KeepAttempts     time.Duration
	DryRun           bool

	HTTPAddr           string
	HTTPConnsPerClient int
	JSON               bool

	Console consoleOptions

	LogFormat       string
	LogLevel        string
	ShutdownTimeout time.Duration
}

// kafkaOptions are the Kafka client settings, shared with the examples.
type kafkaOptions = kafkaconf.Options

func (o *options) bind(s *settings, groups ...string) {
	has := map[string]bool{}
	for _, g := range groups {
		has[g] = true
	}
	if has[groupDB] {
		s.str(&o.DatabaseURL, groupDB, "database-url", "DATABASE_URL", "",
			"PostgreSQL URL or key=value DSN of the service's database (required)").dsn = true
		s.str(&o.Schema, groupDB, "schema", "PGBOX_SCHEMA", "",
			"schema holding the pgbox tables, set as search_path (empty: the connection's own search_path)")
		s.integer(&o.DBMaxConns, groupDB, "db-max-conns", "PGBOX_DB_MAX_CONNS", dbMaxConnsDefault, 2, 1000,
			"most pooled database connections (the relay's LISTEN holds one more, unless --no-listen); with a target list, per database, within --db-conn-budget")
	}
	o.Targets.bind(s, has)
	o.bindTargetMetrics(s, has)
	if has[groupKafka] || has[groupKafkaOptional] {
		g := groupKafka
		brokersDoc := "comma-separated Kafka bootstrap brokers, host:port (required)"
		if !has[groupKafka] {
			g = groupKafkaOptional
			brokersDoc = "comma-separated Kafka bootstrap brokers, host:port"
		}
		o.kafkaBound = true
		o.kafkaRequired = has[groupKafka]
		k := &o.Kafka
		s.csv(&k.Brokers, g, "kafka-brokers", "KAFKA_BROKERS", "", brokersDoc)
		s.str(&k.Version, g, "kafka-version", "PGBOX_KAFKA_VERSION", kafkaVersionDefault, "Kafka protocol version the client speaks (the oldest broker's version or lower)")
		s.str(&k.ClientID, g, "kafka-client-id", "PGBOX_KAFKA_CLIENT_ID", kafkaClientIDDefault, "client.id sent to the brokers")
		s.duration(&k.Timeout, g, "kafka-timeout", "PGBOX_KAFKA_TIMEOUT", kafkaTimeoutDefault, time.Millisecond, "Kafka dial timeout, and how long a cleanup pass waits for the topics' configs and log start offsets (reads and writes wait at least 10s)")
		s.enum(&k.SASLMechanism, g, "kafka-sasl-mechanism", "PGBOX_KAFKA_SASL_MECHANISM", "", "SASL mechanism (empty: no SASL)", "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
		s.str(&k.SASLUser, g, "kafka-sasl-user", "PGBOX_KAFKA_SASL_USER", "", "SASL user name")
		s.str(&k.SASLPassword, g, "kafka-sasl-password", "PGBOX_KAFKA_SASL_PASSWORD", "", "SASL password (never printed; prefer the environment variable)").secret = true
		s.boolean(&k.TLS, g, "kafka-tls", "PGBOX_KAFKA_TLS", false, "connect with TLS (implied by the other TLS settings)")
		s.str(&k.TLSCA, g, "kafka-tls-ca", "PGBOX_KAFKA_TLS_CA", "", "PEM file of the CA certificates that sign the brokers' certificates (empty: system roots)")
		s.str(&k.TLSCert, g, "kafka-tls-cert", "PGBOX_KAFKA_TLS_CERT", "", "PEM file of the client certificate (with --kafka-tls-key)")
		s.str(&k.TLSKey, g, "kafka-tls-key", "PGBOX_KAFKA_TLS_KEY", "", "PEM file of the client certificate's private key")
		s.boolean(&k.TLSSkipVerify, g, "kafka-tls-skip-verify", "PGBOX_KAFKA_TLS_SKIP_VERIFY", false, "do not verify the brokers' certificates (testing only)")
	}
	if has[groupRelay] {
		o.Relay.bind(s)
	}
	o.Ops.bind(s, has)
	if has[groupSchedule] || has[groupRelay] {
		s.duration(&o.CleanupInterval, groupSchedule, "cleanup-interval", "PGBOX_CLEANUP_INTERVAL", cleanupIntervalDefault, 0,
			"time between cleanup passes while running (0 disables cleanup in this process)")
	}
	if has[groupCleanup] || has[groupRelay] || has[groupCleanupOnce] {
		s.duration(&o.CleanupBuffer, groupCleanup, "cleanup-buffer", "PGBOX_CLEANUP_BUFFER", cleanupBufferDefault, 0,
			"how old an inbox key must be before it is deleted, even once Kafka's log start has passed it (the time rule adds it to retention.ms + segment.ms) (0s: no buffer)")
		s.duration(&o.CleanupWindow, groupCleanup, "cleanup-window", "PGBOX_CLEANUP_WINDOW", 0, 0,
			"forced window for topics whose Kafka config gives none (retention.ms=-1, compact, unreadable); 0 never prunes them")
		s.integer(&o.CleanupBatchSize, groupCleanup, "cleanup-batch-size", "PGBOX_CLEANUP_BATCH_SIZE", cleanupBatchDefault, 1, cleanup.BatchSizeMax,
			"most rows one delete transaction removes")
		s.duration(&o.CleanupPause, groupCleanup, "cleanup-pause", "PGBOX_CLEANUP_PAUSE", cleanup.PauseDefault, 0,
			"pause between two delete batches (0s: no pause)")
		s.retention(&o.KeepParked, groupCleanup, "keep-parked", "PGBOX_CLEANUP_KEEP_PARKED", cleanup.ParkedDefault,
			"how long parked outbox rows (never published) are kept, from parked_at")
		s.retention(&o.KeepDeadLetters, groupCleanup, "keep-dead-letters", "PGBOX_CLEANUP_KEEP_DEAD_LETTERS", cleanup.DeadLettersDefault,
			"how long pgbox_consumer_dead rows are kept (never before their topic's inbox keys)")
		s.retention(&o.KeepAttempts, groupCleanup, "keep-attempts", "PGBOX_CLEANUP_KEEP_ATTEMPTS", cleanup.AttemptsDefault,
			"how long a pgbox_consumer_attempts row nobody updates is kept")
	}
	if has[groupCleanupOnce] {
		s.boolean(&o.DryRun, groupCleanupOnce, "dry-run", "PGBOX_CLEANUP_DRY_RUN", false, "count what would be deleted; delete nothing")
	}
	if has[groupHTTP] {
		s.str(&o.HTTPAddr, groupHTTP, "http-addr", "PGBOX_HTTP_ADDR", httpAddrDefault, "listen address of /metrics, /healthz and /readyz (empty: no HTTP server)")
		s.integer(&o.HTTPConnsPerClient, groupHTTP, "http-conns-per-client", "PGBOX_HTTP_CONNS_PER_CLIENT", httpConnsPerClientDefault, 1, 100_000,
			"most open connections one client address may hold to the HTTP server, and as many to the console; more are answered 503 and closed (raise it if many operators share one proxy)")
	}
	o.Console.bind(s, has)
	if has[groupStatus] || has[groupOps] {
		// One --json for status and the operator commands (parked, dead).
		s.boolean(&o.JSON, groupStatus, "json", "PGBOX_STATUS_JSON", false, "print the status (or the parked/dead command's result) as JSON")
	}
	if len(groups) > 0 {
		s.enum(&o.LogFormat, groupLog, "log-format", "PGBOX_LOG_FORMAT", "text", "log format", "text", "json")
		s.enum(&o.LogLevel, groupLog, "log-level", "PGBOX_LOG_LEVEL", "info", "least severe log level printed", "debug", "info", "warn", "error")
		if has[groupRelay] {
			s.duration(&o.ShutdownTimeout, groupLog, "shutdown-timeout", "PGBOX_SHUTDOWN_TIMEOUT", shutdownTimeoutDefault, time.Millisecond,
				"after SIGINT/SIGTERM, how long in-flight work may take before the process exits anyway")
		}
	}
}

// validate checks what single settings cannot: required values and
// combinations. Errors name the setting and wrap errUsage.
func (o *options) validate(cmd string) error {
	var msgs []string
	bad := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	if cmd != "version" && o.DatabaseURL == "" && !o.Targets.listed() {
		bad("missing database: set DATABASE_URL or --database-url (a PostgreSQL URL like postgres://user:pass@host:5432/db)")
	}
	if o.Schema != "" && strings.ContainsAny(o.Schema, ",\"") {
		bad("invalid value %q for PGBOX_SCHEMA (--schema): must be one schema name, without commas or quotes", o.Schema)
	}
	msgs = append(msgs, o.Targets.validate(o)...)
	if o.kafkaBound {
		k := o.Kafka
		if o.kafkaRequired && len(k.Brokers) == 0 {
			bad("missing Kafka brokers: set KAFKA_BROKERS or --kafka-brokers (comma-separated host:port)")
		}
		for _, b := range k.Brokers {
			if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
				bad("invalid value %q in KAFKA_BROKERS (--kafka-brokers): each broker must be host:port", b)
			}
		}
		if _, err := kafkaconf.ParseVersion(k.Version); err != nil {
			bad("invalid value %q for PGBOX_KAFKA_VERSION (--kafka-version): %v", k.Version, err)
		}
		if k.SASLMechanism != "" && (k.SASLUser == "" || k.SASLPassword == "") {
			bad("--kafka-sasl-mechanism %s needs both PGBOX_KAFKA_SASL_USER (--kafka-sasl-user) and PGBOX_KAFKA_SASL_PASSWORD (--kafka-sasl-password)", k.SASLMechanism)
		}
		if k.SASLMechanism == "" && (k.SASLUser != "" || k.SASLPassword != "") {
			bad("a SASL user or password is set but PGBOX_KAFKA_SASL_MECHANISM (--kafka-sasl-mechanism) is empty: set it to PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
		}
		if (k.TLSCert == "") != (k.TLSKey == "") {
			bad("PGBOX_KAFKA_TLS_CERT (--kafka-tls-cert) and PGBOX_KAFKA_TLS_KEY (--kafka-tls-key) must be set together")
		}
	}
	if _, _, err := net.SplitHostPort(o.HTTPAddr); o.HTTPAddr != "" && err != nil {
		bad("invalid value %q for PGBOX_HTTP_ADDR (--http-addr): must be host:port, :port or empty (no HTTP server)", o.HTTPAddr)
	}
	if err := o.Console.validate(); err != nil {
		bad("%s", trimUsage(err))
	}
	if err := o.Relay.validate(); err != nil {
		bad("%s", trimUsage(err))
	}
	if len(msgs) > 0 {
		return usageError("%s", strings.Join(msgs, "\n  "))
	}
	return nil
}
