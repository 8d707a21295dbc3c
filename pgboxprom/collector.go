// Package pgboxprom exports pgbox's state as Prometheus metrics: a
// [prometheus.Collector] over the counters of the relay ([Relay]),
// [cleanup.Cleaner], [inbox.Inbox] and consumer adapter and, read at scrape
// time through [inspect.Read], the outbox backlog, lane owners, parked rows,
// each consumer's oldest inbox key per topic against its cleanup cutoff,
// dead letters, and the age of the xmin horizon per kind of holder. Over a
// fleet's targets ([Config.Fleet]) it exports their totals and maxima, and
// the figures and detail of a few chosen targets, labelled target.
//
// It registers nothing globally: a service builds a [Collector] with [New]
// and adds it to its own registry ([prometheus.NewRegistry], or the default
// one if it uses that); the package's Example shows it, run against a real
// database. [Collector.Run] is optional. The metrics and the alerts over
// them are listed in docs/operations.md and docs/alerts.yml.
// It is the only pgbox package that imports client_golang. It links no
// Kafka client: it reads the relay and the consumer adapter through small
// interfaces ([Relay], [Consumer]) over client-neutral types, so a service
// links only the client it chose, and the relay's only if it runs one.
package pgboxprom

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/outbox"
)

// Defaults for [Config] fields left zero.
const (
	// ScrapeTimeoutDefault bounds a scrape's database reads ([Config.ScrapeTimeout]).
	ScrapeTimeoutDefault = 2 * time.Second
	// LatencyPollDefault is how often [Collector.Run] feeds the batch-latency
	// histogram ([Config.LatencyPoll]).
	LatencyPollDefault = 250 * time.Millisecond
)

// Config says what a [Collector] reads; every source is optional and nil
// sources export nothing.
type Config struct {
	// Relay is a relay whose counters are exported (a *relay.Relay).
	// Defaults to nil: no relay metrics.
	Relay Relay
	// Targets reports a relay.Fleet's targets per state (a *relay.Fleet is
	// one), exported as pgbox_relay_targets{state}: one series per state,
	// none per target. Defaults to nil: not exported.
	Targets Targets
	// Fleet is a fleet's targets as last read: the fleet's totals of the
	// database figures, and the series of the targets it chooses, labelled
	// target, with their detail per topic, lane and consumer (see
	// [Fleet]). It replaces DB: set one or the other. Defaults to nil: not
	// exported.
	Fleet Fleet
	// Cleaner's counters and its last pass's windows, which also give the
	// inbox cutoff metrics. Defaults to nil.
	Cleaner *cleanup.Cleaner
	// FleetCleaner is a fleet's cleaner (`relay run` with a target list
	// prunes every target): its counters over every target it pruned,
	// exported under the Cleaner's names (pgbox_cleanup_passes_total…), so
	// the alerts over them cover every target. Its Topics' windows and
	// margins should be each topic's worst over the targets. Each target's
	// own counters and last pass come through [FleetTarget.Cleanup]. Set it
	// or Cleaner, not both. Defaults to nil.
	FleetCleaner CleanerStats
	// Inbox is an in-process inbox whose counters are exported. Defaults to nil.
	Inbox *inbox.Inbox
	// Consumer is a consumer adapter (an *inboxsarama.Handler or an
	// *inboxfranz.Consumer). Defaults to nil.
	Consumer Consumer

	// DB is read at every scrape through inspect.Read (a *pgxpool.Pool).
	// Defaults to nil: no database metrics.
	DB inspect.DB
	// Inspect configures those reads. Its StatementTimeout defaults to half
	// of ScrapeTimeout; its Cutoffs, when set, give the inbox cutoff metrics
	// when no Cleaner does (cleanup.Cutoffs, one Kafka request per scrape).
	// Defaults to inspect's defaults.
	Inspect inspect.Config
	// ScrapeTimeout bounds a scrape's database reads. Defaults to
	// [ScrapeTimeoutDefault] (2s).
	ScrapeTimeout time.Duration

	// LatencyPoll is how often [Collector.Run] feeds the batch-latency
	// histogram from the relay's counters. Defaults to [LatencyPollDefault]
	// (250ms).
	LatencyPoll time.Duration

	// Logger receives a line when a scrape's database read fails. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

// Relay is what the collector reads of a relay: *relay.Relay is one. An
// interface over client-neutral counters, so pgboxprom does not import the
// relay and links no Kafka client (the relay links sarama).
type Relay interface {
	Stats() outbox.RelayStats
}

// CleanerStats is what the collector reads of a fleet's cleaner: its
// counters, which never go down (a target no longer served keeps its
// passes in them).
type CleanerStats interface {
	Stats() cleanup.Stats
}

// Targets is what the collector reads of a fleet of relays: how many
// targets are in each state. *relay.Fleet is one.
type Targets interface {
	TargetCounts() map[string]int
}

// Collector is a [prometheus.Collector] over the sources of its [Config].
type Collector struct {
	cfg     Config
	latency prometheus.Histogram

	mu      sync.Mutex
	lastN   uint64
	lastSum time.Duration
}

// New validates cfg and returns a [Collector]; register it with
// registry.MustRegister(c). It starts nothing: call [Collector.Run] for a
// finer-grained latency histogram. Zero fields of cfg get their defaults
// ([ScrapeTimeoutDefault], [LatencyPollDefault]); negative durations are an
// error.
func New(cfg Config) (*Collector, error) {
	if cfg.ScrapeTimeout < 0 {
		return nil, fmt.Errorf("pgboxprom: ScrapeTimeout %v is negative (use a positive duration, or zero for %v)", cfg.ScrapeTimeout, ScrapeTimeoutDefault)
	}
	if cfg.LatencyPoll < 0 {
		return nil, fmt.Errorf("pgboxprom: LatencyPoll %v is negative (use a positive duration, or zero for %v)", cfg.LatencyPoll, LatencyPollDefault)
	}
	if cfg.Cleaner != nil && cfg.FleetCleaner != nil {
		return nil, fmt.Errorf("pgboxprom: Cleaner and FleetCleaner are both set: their counters share names (set Cleaner for one database, FleetCleaner for a fleet)")
	}
	if cfg.Fleet != nil && cfg.DB != nil {
		return nil, fmt.Errorf("pgboxprom: Fleet and DB are both set: a fleet's targets are read by the Fleet (set DB for one database, Fleet for a fleet)")
	}
	if cfg.ScrapeTimeout == 0 {
		cfg.ScrapeTimeout = ScrapeTimeoutDefault
	}
	if cfg.LatencyPoll == 0 {
		cfg.LatencyPoll = LatencyPollDefault
	}
	if cfg.Inspect.StatementTimeout == 0 {
		cfg.Inspect.StatementTimeout = cfg.ScrapeTimeout / 2
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Inspect.Logger == nil {
		cfg.Inspect.Logger = cfg.Logger
	}
	c := &Collector{cfg: cfg}
	c.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "pgbox_relay_batch_latency_seconds",
		Help:    "Relay pass latency, claim to delete. Fed from the relay's counters every LatencyPoll while Run runs, else at each scrape: passes within one feed are observed at their mean.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
	return c, nil
}

// Run feeds the batch-latency histogram every [Config.LatencyPoll] until ctx
// ends. Optional: without it, the histogram is fed at each scrape. It
// returns at once when [Config.Relay] is nil.
func (c *Collector) Run(ctx context.Context) {
	if c.cfg.Relay == nil {
		return
	}
	t := time.NewTicker(c.cfg.LatencyPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.feedLatency()
			return
		case <-t.C:
			c.feedLatency()
		}
	}
}

func (c *Collector) feedLatency() {
	s := c.cfg.Relay.Stats()
	c.mu.Lock()
	defer c.mu.Unlock()
	n, sum := s.Batches-c.lastN, s.BatchLatencyTotal-c.lastSum
	c.lastN, c.lastSum = s.Batches, s.BatchLatencyTotal
	if n == 0 {
		return
	}
	mean := (sum / time.Duration(n)).Seconds()
	for range n {
		c.latency.Observe(mean)
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
	for _, d := range fleetDescs {
		ch <- d
	}
	c.latency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.cfg.Relay != nil {
		c.feedLatency()
		c.collectRelay(ch)
	}
	c.latency.Collect(ch)
	if c.cfg.Targets != nil {
		for state, n := range c.cfg.Targets.TargetCounts() {
			gauge(ch, dTargets, float64(n), state)
		}
	}
	if c.cfg.Cleaner != nil {
		exportCleaner(ch, c.cfg.Cleaner.Stats())
	}
	if c.cfg.FleetCleaner != nil {
		exportCleaner(ch, c.cfg.FleetCleaner.Stats())
	}
	if ib := c.cfg.Inbox; ib != nil {
		s := ib.Stats()
		counter(ch, dInboxProcessed, float64(s.Processed))
		counter(ch, dInboxDup, float64(s.Duplicates))
	}
	if c.cfg.Consumer != nil {
		c.collectConsumer(ch)
	}
	if c.cfg.DB != nil {
		c.collectDB(ch)
	}
	if c.cfg.Fleet != nil {
		c.collectFleet(ch)
	}
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (c *Collector) collectRelay(ch chan<- prometheus.Metric) {
	s := c.cfg.Relay.Stats()
	counter(ch, dPublished, float64(s.Published))
	counter(ch, dRetried, float64(s.Retried))
	counter(ch, dParked, float64(s.Parked))
	counter(ch, dBatches, float64(s.Batches))
	gauge(ch, dLatMax, s.BatchLatencyMax.Seconds())
	gauge(ch, dRelayBack, float64(s.Backlog))
	gauge(ch, dLanesHeld, float64(s.Lanes))
	gauge(ch, dInstances, float64(s.Instances))
	counter(ch, dBelow, float64(s.RowsBelowFloor))
	if s.FloorOff != "" {
		gauge(ch, dFloorOff, 1, s.FloorOff)
	}
}

func exportCleaner(ch chan<- prometheus.Metric, s cleanup.Stats) {
	counter(ch, dCleanDeleted, float64(s.Deleted))
	counter(ch, dCleanPasses, float64(s.Passes))
	counter(ch, dCleanLocked, float64(s.PassesLocked))
	counter(ch, dCleanErrors, float64(s.PassErrors))
	counter(ch, dCleanSkipped, float64(s.TopicsSkipped))
	if !s.LastPass.IsZero() {
		gauge(ch, dCleanLast, float64(s.LastPass.UnixNano())/1e9)
	}
	for topic, ts := range s.Topics {
		counter(ch, dCleanTopic, float64(ts.Deleted), topic)
		if ts.Reason == "" && ts.Window > 0 {
			gauge(ch, dCleanMargin, ts.Margin.Seconds(), topic)
		}
	}
}
