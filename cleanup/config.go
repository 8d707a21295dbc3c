package cleanup

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults for Config fields left zero.
const (
	// BufferDefault is the safety margin added to every topic's Kafka window.
	BufferDefault = 24 * time.Hour
	// BatchSizeDefault is how many rows one delete transaction removes at
	// most. Small, so that each batch is short (a few ms) and writers
	// waiting behind its WAL and locks barely notice; see the package doc
	// for the trade-off.
	BatchSizeDefault = 1_000
	// PauseDefault is Config.Pause's default: with BatchSizeDefault it
	// gives the database back most of its time between batches (measured:
	// about 30k keys deleted per second beside busy writers, whose commit
	// rate keeps about 0.9x and p99 about 1x of what they get without
	// cleanup, where 10,000-row batches without pause halve their commit
	// rate).
	PauseDefault = 20 * time.Millisecond
	// BatchSizeMax bounds BatchSize so that no transaction holds row locks for long.
	BatchSizeMax = 100_000
	// IntervalDefault is how often Run runs a pass.
	IntervalDefault = time.Hour
	// KafkaTimeoutDefault bounds each Kafka read of one pass.
	KafkaTimeoutDefault = 30 * time.Second
)

// Sentinels for settings whose zero is meaningful but whose zero field means
// the default.
const (
	// NoBuffer, as Config.Buffer or Topic.Buffer, asks for a zero buffer:
	// keys are deleted as soon as Kafka's log start offset has passed their
	// last-seen copy (exact rule) or they are older than retention.ms +
	// segment.ms (time rule).
	NoBuffer time.Duration = -1
	// NoWindow, as Topic.Window, turns Config.Window off for one topic: it is
	// never pruned when Kafka gives no window.
	NoWindow time.Duration = -1
	// NoPause, as Config.Pause, asks for no pause between delete batches:
	// the fastest pass, at the writers' expense.
	NoPause time.Duration = -1
)

// Topic overrides the cleaner's settings for one source topic.
type Topic struct {
	// Buffer replaces Config.Buffer for this topic. Defaults to Config.Buffer.
	// Set NoBuffer for a zero buffer; other negative values are rejected.
	Buffer time.Duration

	// Window forces a fixed retention window for this topic's inbox keys, for
	// topics whose Kafka config gives no time window: retention.ms = -1, a
	// cleanup.policy without delete, with compact (compact,delete) or with a
	// token pgbox does not know, a topic Kafka does not know, or Kafka
	// unreachable or its config unreadable. All its keys, whatever their
	// position, are then deleted once older than Window (no buffer is added:
	// Window is the operator's whole promise), besides what the exact rule
	// deletes. When Kafka does give a time window (cleanup.policy delete), the
	// longer of the two is the time rule's window, so Window never shortens
	// what Kafka may redeliver. Defaults to Config.Window. Set NoWindow to
	// force no window for this topic; other negative values are rejected.
	Window time.Duration
}

// Config configures a Cleaner. Pool and Admin are required.
type Config struct {
	// Pool is the database holding the pgbox tables (found through the
	// connections' search_path). The cleaner holds one connection for the
	// length of a pass.
	Pool *pgxpool.Pool

	// Admin reads each inbox topic's retention.ms, segment.ms and
	// cleanup.policy, and its partitions' log start offsets: one
	// DescribeConfigs request, one Metadata request and one ListOffsets
	// request per partition leader, for all topics, per pass. Wrap the
	// Kafka client you have: cleanupsarama.New(admin) for sarama,
	// cleanupkgo.New(kadm.NewClient(cl)) for franz-go.
	Admin Admin

	// Buffer is how long a key is kept after its last-seen copy arrived,
	// whatever Kafka says: it covers copies still to come (a relay's resend
	// after its crash window, consumers that lag). The time rule adds it to
	// retention.ms + segment.ms, where it also covers the broker's retention
	// check interval and clock skew.
	// Defaults to BufferDefault (24h). Set NoBuffer for a zero buffer; other
	// negative values are rejected.
	Buffer time.Duration

	// Topics overrides settings per source topic. Defaults to none.
	Topics map[string]Topic

	// Window forces a fixed window for every topic whose Kafka config gives
	// none (see Topic.Window). Defaults to 0: such topics are never pruned.
	Window time.Duration

	// BatchSize is the most rows one delete transaction removes. At most
	// BatchSizeMax. Defaults to BatchSizeDefault (1,000).
	BatchSize int

	// Pause is slept between two delete batches, to leave the database
	// breathing room (concurrent writers, replication, vacuum). Set NoPause
	// for none; other negative values are rejected. Defaults to
	// PauseDefault (20ms).
	Pause time.Duration

	// Interval is the time between two passes of Run. Defaults to
	// IntervalDefault (1h).
	Interval time.Duration

	// KafkaTimeout bounds each Kafka read of one pass (configs, log start
	// offsets); when it runs out, nothing is deleted by the rule that needed
	// the answer, and the report says Kafka was unreachable. Defaults to
	// KafkaTimeoutDefault (30s).
	KafkaTimeout time.Duration

	// DryRun makes a pass count what it would delete and delete nothing.
	// Defaults to false.
	DryRun bool

	// Tables sets the retention of the rows the relay and the consumer adapter
	// leave behind. Defaults to TablesDefault's values for fields left zero.
	Tables Tables

	// Logger receives one line per pass and per skipped topic. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Now is the clock cutoffs are computed from. Defaults to the database's
	// clock (SELECT now()), the clock that stamps received_at.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	switch c.Buffer {
	case 0:
		c.Buffer = BufferDefault
	case NoBuffer:
		c.Buffer = 0
	}
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	switch c.Pause {
	case 0:
		c.Pause = PauseDefault
	case NoPause:
		c.Pause = 0
	}
	if c.Interval == 0 {
		c.Interval = IntervalDefault
	}
	if c.KafkaTimeout == 0 {
		c.KafkaTimeout = KafkaTimeoutDefault
	}
	c.Tables = c.Tables.withDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("missing Pool (pass the *pgxpool.Pool of the database holding the pgbox tables)"))
	}
	errs = append(errs, c.CutoffsConfig().problems()...)
	if c.BatchSize < 0 || c.BatchSize > BatchSizeMax {
		errs = append(errs, fmt.Errorf("Config.BatchSize %d is out of range (use 1..%d, or zero for %d)", c.BatchSize, BatchSizeMax, BatchSizeDefault))
	}
	if c.Pause < 0 && c.Pause != NoPause {
		errs = append(errs, fmt.Errorf("Config.Pause %v is negative (use a positive duration, cleanup.NoPause for no pause, or zero for the default %v)", c.Pause, PauseDefault))
	}
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("Config.Interval %v is negative (use a positive duration, or zero for %v)", c.Interval, IntervalDefault))
	}
	if err := c.Tables.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CutoffsConfig configures Cutoffs: the part of Config that decides a
// topic's rules. Each field is the Config field of the same name, with the
// same default.
type CutoffsConfig struct {
	// Admin reads Kafka (see Config.Admin). Required.
	Admin Admin
	// Buffer: see Config.Buffer. Defaults to BufferDefault (24h).
	Buffer time.Duration
	// Topics: see Config.Topics. Defaults to none.
	Topics map[string]Topic
	// Window: see Config.Window. Defaults to 0: no forced window.
	Window time.Duration
	// KafkaTimeout: see Config.KafkaTimeout. Defaults to
	// KafkaTimeoutDefault (30s).
	KafkaTimeout time.Duration
}

// CutoffsConfig returns the part of c that Cutoffs takes, so that status and
// metrics compute the rules a cleaner configured with c applies.
func (c Config) CutoffsConfig() CutoffsConfig {
	return CutoffsConfig{Admin: c.Admin, Buffer: c.Buffer, Topics: c.Topics, Window: c.Window, KafkaTimeout: c.KafkaTimeout}
}

// config is the Config a Cleaner computing only cutoffs runs with.
func (c CutoffsConfig) config() Config {
	return Config{Admin: c.Admin, Buffer: c.Buffer, Topics: c.Topics, Window: c.Window, KafkaTimeout: c.KafkaTimeout}
}

// problems lists what is wrong with c, each naming the field and the fix.
func (c CutoffsConfig) problems() []error {
	var errs []error
	if c.Admin == nil {
		errs = append(errs, errors.New("missing Admin (wrap your Kafka admin client: cleanupsarama.New(admin) with admin from sarama.NewClusterAdmin(brokers, cfg), or cleanupkgo.New(kadm.NewClient(cl)))"))
	}
	if c.Buffer < 0 && c.Buffer != NoBuffer {
		errs = append(errs, fmt.Errorf("Config.Buffer %v is negative (use a positive duration, cleanup.NoBuffer for a zero buffer, or zero for the default %v)", c.Buffer, BufferDefault))
	}
	if c.Window < 0 {
		errs = append(errs, fmt.Errorf("Config.Window %v is negative (use a positive duration, or zero to never prune topics without a Kafka window)", c.Window))
	}
	if c.KafkaTimeout < 0 {
		errs = append(errs, fmt.Errorf("Config.KafkaTimeout %v is negative (use a positive duration, or zero for %v)", c.KafkaTimeout, KafkaTimeoutDefault))
	}
	for name, t := range c.Topics {
		if name == "" {
			errs = append(errs, errors.New("Config.Topics has an empty topic name"))
		}
		if t.Buffer < 0 && t.Buffer != NoBuffer {
			errs = append(errs, fmt.Errorf("Config.Topics[%q].Buffer %v is negative (use a positive duration, cleanup.NoBuffer for a zero buffer, or zero for Config.Buffer)", name, t.Buffer))
		}
		if t.Window < 0 && t.Window != NoWindow {
			errs = append(errs, fmt.Errorf("Config.Topics[%q].Window %v is negative (use a positive duration, cleanup.NoWindow for no forced window, or zero for Config.Window)", name, t.Window))
		}
	}
	return errs
}

func (c Config) topic(name string) (buffer, window time.Duration) {
	buffer, window = c.Buffer, c.Window
	if t, ok := c.Topics[name]; ok {
		switch t.Buffer {
		case 0:
		case NoBuffer:
			buffer = 0
		default:
			buffer = t.Buffer
		}
		switch t.Window {
		case 0:
		case NoWindow:
			window = 0
		default:
			window = t.Window
		}
	}
	return buffer, window
}
