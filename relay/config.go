package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
)

// Defaults of Config.
const (
	LanesDefault             = slot.LanesDefault
	BatchSizeDefault         = 2000
	PollIntervalDefault      = time.Second
	BusyPollIntervalDefault  = 2 * time.Millisecond
	HeartbeatIntervalDefault = 2 * time.Second
	LeaseTTLDefault          = 6 * time.Second
	MaxAttemptsDefault       = 5
	MaxBackoffDefault        = 10 * time.Second
	StopTimeoutDefault       = 5 * time.Second
	// MaxMessageBytesDefault is Config.MaxMessageBytes' default and
	// Producer.MaxMessageBytes in NewKafkaConfig: outbox.MaxBytesDefault,
	// Kafka's default broker message.max.bytes, so every message outbox.Write
	// accepts by default is published.
	MaxMessageBytesDefault = outbox.MaxBytesDefault
	// UnknownTopicWindowDefault is Config.UnknownTopicWindow's default: long
	// enough for a deploy that writes before its topic is created, short
	// enough that a misspelt topic is parked (and shown) within minutes.
	UnknownTopicWindowDefault = 5 * time.Minute
	// KafkaOutageAlertDefault is Config.KafkaOutageAlert's default.
	KafkaOutageAlertDefault = time.Minute
	// SweepIntervalDefault is Config.SweepInterval's default.
	SweepIntervalDefault = time.Minute
)

// NoUnknownTopicWindow, as Config.UnknownTopicWindow, treats a topic that does
// not exist like any other permanent failure: the row is parked after
// MaxAttempts failed passes, within seconds.
const NoUnknownTopicWindow = -1

// Header names the relay adds to every record. outbox.Write refuses a
// message with a header of these names (outbox.Reserved).
const (
	// EventIDHeader carries the row's event id (a UUIDv7 string). Consumers
	// dedupe on it: inbox.ByHeader(relay.EventIDHeader).
	EventIDHeader = outbox.EventIDHeader
	// CreatedAtHeader carries the row's creation time (database clock),
	// RFC 3339 with nanoseconds, UTC.
	CreatedAtHeader = outbox.CreatedAtHeader
)

// busyWindow is how long the relay keeps watching the table every
// BusyPollInterval after a pass that found rows, before it goes to sleep.
const busyWindow = 2 * time.Second

// backlogCap bounds the backlog count the heartbeat makes, so it stays cheap
// on a huge table.
const backlogCap = 100_000

// Config configures a Relay. Pool and Brokers are required.
//
// No count or duration here has a meaningful zero (zero lanes, rows, attempts
// or poll interval cannot run a relay): a zero field means its default, and a
// negative one is rejected by New with an error naming the field.
type Config struct {
	// Pool connects to the database holding pgbox_outbox. Unless Schema is
	// set, its search_path must resolve the pgbox tables. Required. Behind
	// pgbouncer in transaction mode, set NoListen (LISTEN needs a session) or
	// give the relay a direct pool.
	Pool *pgxpool.Pool
	// Schema is the schema holding this relay's pgbox tables, its name as
	// PostgreSQL stores it (case and all). When set, every statement the
	// relay sends carries its own search_path (set_config, local to the
	// statement's transaction, in the same round trip), so relays of many
	// schemas can share one Pool, and none can reach another's tables
	// whatever the pool's connections ran before. Empty: the pool's own
	// search_path, and a statement costs no extra. Defaults to "".
	Schema string
	// Brokers are the Kafka bootstrap addresses. Required.
	Brokers []string
	// Kafka is the sarama configuration the relay's client and producer read.
	// The relay does not use sarama's AsyncProducer: it writes record batches
	// itself, always as an idempotent producer (a producer id and sequence
	// numbers), whatever Producer.Idempotent says. It reads the client
	// settings (Version, Net, Metadata, ClientID) and, of Producer,
	// RequiredAcks, Timeout, Retry.Max, Retry.Backoff, Compression,
	// CompressionLevel and MaxMessageBytes; the AsyncProducer's own settings
	// (Idempotent, Return, Flush, ChannelBufferSize, Interceptors) do not
	// apply. New refuses RequiredAcks other than WaitForAll and a Version
	// before 0.11.0.0, and whatever sarama's own Validate refuses.
	// Producer.Partitioner is overwritten by Partitioner. Defaults to
	// [NewKafkaConfig]().
	Kafka *sarama.Config
	// Partitioner picks a record's partition from its key. It must send equal
	// keys to equal partitions. Defaults to [NewMurmur2Partitioner], the Java
	// client's default (so pgbox and Java producers agree on where a key
	// goes); sarama.NewHashPartitioner (FNV-1a) is the sarama-compatible choice.
	Partitioner sarama.PartitionerConstructor
	// Lanes is how many lanes the outbox's slots are grouped into (lane =
	// slot % Lanes). A lane is owned by one instance at a time, so Lanes bounds
	// how many instances share the work. Every instance must use the same
	// value: New refuses to start next to live instances using another.
	// At most 256, the outbox's slot count. Defaults to [LanesDefault] (16).
	Lanes int
	// Instance names this relay instance in logs and the lease tables, where
	// the relay appends "#" and a random suffix (see Relay.Instance), so
	// names need not be unique. Defaults to hostname-pid.
	Instance string
	// BatchSize is the most rows one pass claims and sends. Defaults to
	// [BatchSizeDefault] (2000).
	BatchSize int
	// PollInterval is how often an idle relay looks for rows when no
	// notification wakes it. Defaults to [PollIntervalDefault] (1s).
	PollInterval time.Duration
	// BusyPollInterval is how often the relay watches the table for new rows
	// for two seconds after a pass that found rows: one index range scan over
	// the newest ids, so steady traffic is published within milliseconds
	// without NOTIFY and writers pay nothing for the wake-up. Defaults to
	// [BusyPollIntervalDefault] (2ms).
	BusyPollInterval time.Duration
	// HeartbeatInterval is how often the instance renews its leases and
	// rebalances lanes (one statement). Defaults to [HeartbeatIntervalDefault] (2s).
	HeartbeatInterval time.Duration
	// LeaseTTL is how long a lease lasts without renewal. A dead instance's
	// lanes are taken over within LeaseTTL + HeartbeatInterval. At least twice
	// HeartbeatInterval. Defaults to [LeaseTTLDefault] (6s).
	LeaseTTL time.Duration
	// MaxAttempts is how many permanent publish failures (message too
	// large, invalid record, not authorized...) a row may have before it is
	// parked; an unknown topic is parked after UnknownTopicWindow instead.
	// Broker outages never count. Defaults to [MaxAttemptsDefault] (5).
	MaxAttempts int
	// UnknownTopicWindow is how long a row whose topic does not exist
	// (UNKNOWN_TOPIC_OR_PARTITION, auto-creation off) is retried, with
	// backoff, before it is parked, counted from its first such failure on
	// the database's clock: a deploy often writes before its topic is
	// created. A dead-letter topic is no different (dead letters are outbox
	// rows). While it waits, and once it is parked, the row holds its key:
	// later rows of its topic and key wait behind it. NoUnknownTopicWindow
	// parks it after MaxAttempts like other permanent failures ([NoUnknownTopicWindow]). Defaults to
	// [UnknownTopicWindowDefault] (5m).
	UnknownTopicWindow time.Duration
	// KafkaOutageAlert is how long Kafka may be unreachable before the relay
	// logs it at ERROR (once per outage; WARN lines come before). Kafka is
	// unreachable while the relay cannot connect at start-up, and while
	// every send of its passes fails for a reason retrying may fix (broker
	// down, leader missing, timeouts). pgbox_relay_instances.kafka_down_since
	// and `relay status` show it from the first failure. Defaults to
	// [KafkaOutageAlertDefault] (1m).
	KafkaOutageAlert time.Duration
	// SweepInterval is how often the relay looks below every owned slot's
	// floor, on a connection of its own (the floor's second line of
	// defence). When the look finds a committed row there, the next claim
	// reads every owned slot from its start: the row is published, in
	// order, counted (outbox.RelayStats.RowsBelowFloor,
	// pgbox_relay_rows_below_floor_total) and logged at ERROR, so a hole in
	// the floor's rule becomes a delay of at most SweepInterval and an
	// alarm, never a lost row. Each look walks the dead index entries a
	// held xmin horizon keeps (once per interval, never in a claim). There
	// is no way to turn it off. Defaults to [SweepIntervalDefault] (1m).
	SweepInterval time.Duration
	// MaxBackoff caps the exponential backoff after failed passes. Defaults to
	// [MaxBackoffDefault] (10s).
	MaxBackoff time.Duration
	// NoListen turns off LISTEN on Channel; the relay then only polls.
	// Defaults to false (listening).
	NoListen bool
	// Channel is the LISTEN channel; it must match outbox.Config.Channel.
	// Defaults to outbox.ChannelDefault.
	Channel string
	// StopTimeout bounds how long Run waits, once ctx is canceled, for an
	// in-flight send to finish (the batch is then released, not marked).
	// Defaults to [StopTimeoutDefault] (5s).
	StopTimeout time.Duration
	// MaxMessageBytes is the largest outbox.RecordSize the relay publishes:
	// set it to the writers' outbox.Config.MaxBytes, at most the
	// brokers' message.max.bytes. NewKafkaConfig's producer limit follows it;
	// New rejects a Kafka config whose Producer.MaxMessageBytes is too small
	// for it. Defaults to [MaxMessageBytesDefault] (outbox.MaxBytesDefault).
	MaxMessageBytes int
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// PublishHook, if set, is told about each batch the relay publishes (see
	// outbox.PublishHook; pgboxotel.Tracer implements it to trace the
	// publish). Defaults to nil: no hook.
	PublishHook outbox.PublishHook
}

// NewKafkaConfig returns the sarama config the relay uses when Config.Kafka is
// nil: sarama's defaults plus WaitForAll acks, one open request per broker
// connection, five retries of a failed batch within a pass and
// MaxMessageBytesDefault. Set Version, Net.SASL, Net.TLS etc. on it as your
// cluster needs.
func NewKafkaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "pgbox-relay"
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Retry.Max = 5
	c.Producer.MaxMessageBytes = MaxMessageBytesDefault
	return c
}

func (c Config) withDefaults() Config {
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, MaxMessageBytesDefault)
	if c.Kafka == nil {
		c.Kafka = NewKafkaConfig()
		c.Kafka.Producer.MaxMessageBytes = c.MaxMessageBytes
	}
	if c.Partitioner == nil {
		c.Partitioner = NewMurmur2Partitioner
	}
	c.Lanes = cmp.Or(c.Lanes, LanesDefault)
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s-%d", cmp.Or(host, "relay"), os.Getpid())
	}
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.BusyPollInterval = cmp.Or(c.BusyPollInterval, BusyPollIntervalDefault)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, HeartbeatIntervalDefault)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, LeaseTTLDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, MaxBackoffDefault)
	c.UnknownTopicWindow = cmp.Or(c.UnknownTopicWindow, UnknownTopicWindowDefault)
	c.KafkaOutageAlert = cmp.Or(c.KafkaOutageAlert, KafkaOutageAlertDefault)
	c.SweepInterval = cmp.Or(c.SweepInterval, SweepIntervalDefault)
	c.Channel = cmp.Or(c.Channel, outbox.ChannelDefault)
	c.StopTimeout = cmp.Or(c.StopTimeout, StopTimeoutDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if c.Pool == nil {
		return errors.New("relay: Config.Pool is nil (pass a *pgxpool.Pool whose search_path finds the pgbox tables)")
	}
	if err := validSchema(c.Schema); err != nil {
		return err
	}
	if len(c.Brokers) == 0 {
		return errors.New("relay: Config.Brokers is empty (pass the Kafka bootstrap addresses, e.g. []string{\"localhost:9092\"})")
	}
	for i, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return fmt.Errorf("relay: Config.Brokers[%d] is empty (an unset variable?): pass host:port addresses, e.g. []string{\"localhost:9092\"}", i)
		}
	}
	if strings.TrimSpace(c.Channel) == "" {
		return errors.New("relay: Config.Channel is blank: leave it empty for outbox.ChannelDefault, or name the writers' channel")
	}
	if c.Lanes < 1 || c.Lanes > slot.Count {
		return fmt.Errorf("relay: Config.Lanes is %d: use 1..%d (the outbox's slot count)", c.Lanes, slot.Count)
	}
	if c.BatchSize < 1 {
		return fmt.Errorf("relay: Config.BatchSize is %d: use a positive number of rows", c.BatchSize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PollInterval", c.PollInterval}, {"BusyPollInterval", c.BusyPollInterval}, {"HeartbeatInterval", c.HeartbeatInterval},
		{"LeaseTTL", c.LeaseTTL}, {"MaxBackoff", c.MaxBackoff}, {"StopTimeout", c.StopTimeout}, {"KafkaOutageAlert", c.KafkaOutageAlert},
		{"SweepInterval", c.SweepInterval}} {
		if d.v < 0 {
			return fmt.Errorf("relay: Config.%s is %s: use a positive duration, or 0 for the default", d.name, d.v)
		}
	}
	if c.UnknownTopicWindow < 0 && c.UnknownTopicWindow != NoUnknownTopicWindow {
		return fmt.Errorf("relay: Config.UnknownTopicWindow is %s: use a positive duration, 0 for the default (%s), or relay.NoUnknownTopicWindow to park at MaxAttempts",
			c.UnknownTopicWindow, UnknownTopicWindowDefault)
	}
	if c.LeaseTTL < 2*c.HeartbeatInterval {
		return fmt.Errorf("relay: Config.LeaseTTL (%s) is less than twice Config.HeartbeatInterval (%s): a lease must survive one missed heartbeat", c.LeaseTTL, c.HeartbeatInterval)
	}
	if c.MaxAttempts < 1 {
		return fmt.Errorf("relay: Config.MaxAttempts is %d: use at least 1", c.MaxAttempts)
	}
	if c.MaxMessageBytes < 0 {
		return fmt.Errorf("relay: Config.MaxMessageBytes is %d: use a positive size in bytes (the writers' outbox.Config.MaxBytes), or 0 for %d", c.MaxMessageBytes, MaxMessageBytesDefault)
	}
	// sarama checks a record without the batch header against
	// Producer.MaxMessageBytes (ProducerMessage.ByteSize).
	if need := c.MaxMessageBytes - outbox.RecordBatchOverhead; c.Kafka.Producer.MaxMessageBytes < need {
		return fmt.Errorf("relay: Config.Kafka.Producer.MaxMessageBytes is %d, too small for Config.MaxMessageBytes %d: set it to at least %d, or lower Config.MaxMessageBytes (and the writers' outbox.Config.MaxBytes)",
			c.Kafka.Producer.MaxMessageBytes, c.MaxMessageBytes, need)
	}
	if len(c.Channel) > 63 {
		return fmt.Errorf("relay: Config.Channel %q is longer than PostgreSQL's 63-byte identifier limit", c.Channel)
	}
	return validateKafka(c.Kafka)
}

// validateKafka checks the settings per-key order and no-loss depend on.
func validateKafka(k *sarama.Config) error {
	// Only what the relay's own producer reads is checked here (see
	// Config.Kafka); sarama's Validate, which sarama.NewClient applies
	// anyway, follows.
	switch {
	case k.Producer.RequiredAcks != sarama.WaitForAll:
		return fmt.Errorf("relay: Config.Kafka.Producer.RequiredAcks is %d: set it to sarama.WaitForAll "+
			"(the relay deletes a row as soon as Kafka acknowledges its record; only an acknowledgement from every in-sync replica survives the loss of the partition's leader)", k.Producer.RequiredAcks)
	case !k.Version.IsAtLeast(sarama.V0_11_0_0):
		return fmt.Errorf("relay: Config.Kafka.Version is %s: set it to at least 0.11.0.0 "+
			"(the relay writes record batches with a producer id and sequence numbers, which older brokers do not accept)", k.Version)
	}
	if err := k.Validate(); err != nil {
		return fmt.Errorf("relay: Config.Kafka (sarama's own check): %w", err)
	}
	return nil
}

// validSchema checks Config.Schema: empty, or a name PostgreSQL can store
// (at most 63 bytes, no NUL), without surrounding blanks (a copy-paste
// slip that would name another schema).
func validSchema(s string) error {
	switch {
	case s == "":
		return nil
	case strings.TrimSpace(s) != s:
		return fmt.Errorf("relay: Config.Schema %q has leading or trailing blanks", s)
	case len(s) > 63:
		return fmt.Errorf("relay: Config.Schema %q is longer than PostgreSQL's 63-byte identifier limit", s)
	case strings.ContainsRune(s, 0):
		return fmt.Errorf("relay: Config.Schema %q contains a NUL byte", s)
	case s == "$user" || strings.HasPrefix(strings.ToLower(s), "pg_"):
		// On a search_path, PostgreSQL reads these, quoted or not, as the
		// session's role name or its temporary or system schemas: never
		// the schema the setting names. CREATE SCHEMA refuses the pg_
		// prefix anyway.
		return fmt.Errorf("relay: Config.Schema %q names no schema of its own on a search_path ($user is the role's schema, pg_ the system's): name the schema holding the pgbox tables", s)
	}
	return nil
}
