package main

import (
	"flag"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/pgbox/pgbox/examples/demo/internal/harness"
	"github.com/pgbox/pgbox/internal/kafkaconf"
)

// options are every setting the demo reads.
type options struct {
	DatabaseURL string
	DBMaxConns  int
	Kafka       kafkaconf.Options
	Demo        harness.Config
	HTTPAddr    string
	LogFormat   string
	LogLevel    string
	logLevelSet bool
}

// envFlag is one setting: a flag with an environment variable behind it.
type envFlag struct {
	name, env string
}

// parseOptions reads flags, then fills each flag not given from its
// environment variable.
func parseOptions(args []string, stdout io.Writer, getenv func(string) string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stdout)
	var envs []envFlag
	str := func(p *string, name, env, def, usage string) {
		fs.StringVar(p, name, def, usage+" (env "+env+")")
		envs = append(envs, envFlag{name, env})
	}
	num := func(p *int, name, env string, def int, usage string) {
		fs.IntVar(p, name, def, usage+" (env "+env+")")
		envs = append(envs, envFlag{name, env})
	}
	boolean := func(p *bool, name, env string, def bool, usage string) {
		fs.BoolVar(p, name, def, usage+" (env "+env+")")
		envs = append(envs, envFlag{name, env})
	}
	dur := func(p *time.Duration, name, env string, def time.Duration, usage string) {
		fs.DurationVar(p, name, def, usage+" (env "+env+")")
		envs = append(envs, envFlag{name, env})
	}
	str(&o.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL URL or key=value DSN (required)")
	num(&o.DBMaxConns, "db-max-conns", "PGBOX_DB_MAX_CONNS", 10, "most database connections the demo opens (raised to what the consumers need)")
	bindKafka(&o.Kafka, str, dur, boolean)
	d := &o.Demo
	str(&d.Schema, "demo-schema", "PGBOX_DEMO_SCHEMA", "pgbox_demo", "schema the demo drops and recreates at start")
	num(&d.Orders, "orders", "PGBOX_DEMO_ORDERS", 2000, "unique orders the producer sends")
	num(&d.DupPercent, "duplicate-percent", "PGBOX_DEMO_DUPLICATE_PERCENT", 10, "percent of orders resent at once with the same order id")
	num(&d.Replay, "replay", "PGBOX_DEMO_REPLAY", 200, "records read back from an earlier offset of the orders topic and sent again")
	num(&d.Rate, "rate", "PGBOX_DEMO_RATE", 400, "orders per second the producer sends (0: as fast as it can)")
	num(&d.Partitions, "partitions", "PGBOX_DEMO_PARTITIONS", 4, "partitions of the demo's topics")
	num(&d.Consumers, "consumers", "PGBOX_DEMO_CONSUMERS", 2, "consumer-group members of the payment service")
	dur(&d.Duration, "duration", "PGBOX_DEMO_DURATION", 50*time.Second, "the demo fails if it has not finished within this time")
	str(&d.DedupKey, "dedup-key", "PGBOX_DEMO_DEDUP_KEY", "header", "inbox key: header (the order id: catches resends and replays) or offset (only redeliveries of one record: watch the check fail)")
	boolean(&d.KeepSchema, "keep-schema", "PGBOX_DEMO_KEEP_SCHEMA", true, "leave the demo schema in place at the end, to look at")
	d.OrderTopic, d.PaymentTopic = "demo.orders.v1", "demo.payments.v1"
	str(&o.HTTPAddr, "http-addr", "PGBOX_HTTP_ADDR", "", "listen address of /metrics and /healthz (empty: no HTTP server)")
	str(&o.LogFormat, "log-format", "PGBOX_LOG_FORMAT", "text", "log format: text or json")
	str(&o.LogLevel, "log-level", "PGBOX_LOG_LEVEL", "info", "least severe log level printed: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usageError("the demo takes no arguments (got %q)", fs.Args())
	}
	if err := applyEnv(fs, envs, getenv); err != nil {
		return nil, err
	}
	o.logLevelSet = isSet(fs, "log-level") || getenv("PGBOX_LOG_LEVEL") != ""
	return o, o.validate()
}

func bindKafka(k *kafkaconf.Options, str func(*string, string, string, string, string),
	dur func(*time.Duration, string, string, time.Duration, string), boolean func(*bool, string, string, bool, string)) {
	var brokers string
	str(&brokers, "kafka-brokers", "KAFKA_BROKERS", "", "comma-separated Kafka bootstrap brokers, host:port (empty: an embedded broker)")
	k.Brokers = nil
	brokersFlag = &brokers
	str(&k.Version, "kafka-version", "PGBOX_KAFKA_VERSION", "3.6.0", "Kafka protocol version the client speaks")
	str(&k.ClientID, "kafka-client-id", "PGBOX_KAFKA_CLIENT_ID", "pgbox-demo", "client.id sent to the brokers")
	dur(&k.Timeout, "kafka-timeout", "PGBOX_KAFKA_TIMEOUT", 10*time.Second, "dial, read and write timeout of Kafka requests")
	str(&k.SASLMechanism, "kafka-sasl-mechanism", "PGBOX_KAFKA_SASL_MECHANISM", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)")
	str(&k.SASLUser, "kafka-sasl-user", "PGBOX_KAFKA_SASL_USER", "", "SASL user name")
	str(&k.SASLPassword, "kafka-sasl-password", "PGBOX_KAFKA_SASL_PASSWORD", "", "SASL password (never printed; prefer the environment variable)")
	boolean(&k.TLS, "kafka-tls", "PGBOX_KAFKA_TLS", false, "connect with TLS (implied by the other TLS settings)")
	str(&k.TLSCA, "kafka-tls-ca", "PGBOX_KAFKA_TLS_CA", "", "PEM file of the CA certificates that sign the brokers' certificates")
	str(&k.TLSCert, "kafka-tls-cert", "PGBOX_KAFKA_TLS_CERT", "", "PEM file of the client certificate (with --kafka-tls-key)")
	str(&k.TLSKey, "kafka-tls-key", "PGBOX_KAFKA_TLS_KEY", "", "PEM file of the client certificate's private key")
	boolean(&k.TLSSkipVerify, "kafka-tls-skip-verify", "PGBOX_KAFKA_TLS_SKIP_VERIFY", false, "do not verify the brokers' certificates (testing only)")
}

// brokersFlag holds --kafka-brokers until validate splits it.
var brokersFlag *string

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func applyEnv(fs *flag.FlagSet, envs []envFlag, getenv func(string) string) error {
	for _, e := range envs {
		v := getenv(e.env)
		if v == "" || isSet(fs, e.name) {
			continue
		}
		if err := fs.Set(e.name, v); err != nil {
			shown := strconv.Quote(v)
			if strings.Contains(e.env, "PASSWORD") {
				shown = "(redacted)"
			}
			return usageError("invalid value %s for %s (--%s): %v", shown, e.env, e.name, err)
		}
	}
	return nil
}

func (o *options) validate() error {
	for b := range strings.SplitSeq(*brokersFlag, ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.Kafka.Brokers = append(o.Kafka.Brokers, b)
		}
	}
	d := o.Demo
	switch {
	case o.DatabaseURL == "":
		return usageError("DATABASE_URL (--database-url) is required")
	case d.Orders < 1:
		return usageError("--orders %d: must be at least 1", d.Orders)
	case d.DupPercent < 0 || d.DupPercent > 100:
		return usageError("--duplicate-percent %d: must be 0 to 100", d.DupPercent)
	case d.Replay < 0 || d.Rate < 0:
		return usageError("--replay and --rate must not be negative")
	case d.Replay > d.Orders:
		return usageError("invalid value %d for PGBOX_DEMO_REPLAY (--replay): must be at most --orders (%d)", d.Replay, d.Orders)
	case d.Partitions < 1 || d.Partitions > 256:
		return usageError("--partitions %d: must be 1 to 256", d.Partitions)
	case d.Consumers < 1 || d.Consumers > 64:
		return usageError("--consumers %d: must be 1 to 64", d.Consumers)
	case d.Duration < time.Second:
		return usageError("--duration %s: must be at least 1s", d.Duration)
	case d.DedupKey != "header" && d.DedupKey != "offset":
		return usageError("--dedup-key %q: must be header or offset", d.DedupKey)
	}
	if _, err := kafkaconf.ParseVersion(o.Kafka.Version); err != nil {
		return usageError("--kafka-version %q: %v", o.Kafka.Version, err)
	}
	return nil
}

// newLogger returns a text or JSON slog logger writing to w at level.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
