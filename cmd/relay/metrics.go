package main

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/relay"
)

// The libraries expose plain Stats() structs; this file turns them into
// Prometheus metrics. Counters are read at scrape time (const metrics from
// the libraries' cumulative counts); the outbox backlog and lane owners are
// read from the database at scrape time, bounded by scrapeDBTimeout.

const scrapeDBTimeout = 3 * time.Second

// latencyPoll is how often the batch-latency histogram is fed.
const latencyPoll = 250 * time.Millisecond

// statsSources is what the exporter reads; nil fields are skipped.
type statsSources struct {
	Relay    *relay.Relay
	Cleaner  *cleanup.Cleaner
	Inbox    *inbox.Inbox
	Consumer *inboxsarama.Handler
	Pool     *pgxpool.Pool
	Lanes    int
}

type exporter struct {
	src statsSources
	reg *prometheus.Registry

	latency prometheus.Histogram
	mu      sync.Mutex
	lastN   uint64
	lastSum time.Duration
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	dPublished   = desc("pgbox_relay_published_total", "Records Kafka acknowledged whose outbox rows were deleted.")
	dRetried     = desc("pgbox_relay_retried_total", "Row sends that failed and were left for a later pass.")
	dParked      = desc("pgbox_relay_parked_total", "Rows parked after the maximum number of permanent failures.")
	dBatches     = desc("pgbox_relay_batches_total", "Non-empty relay passes (claim, send, delete).")
	dLatMax      = desc("pgbox_relay_batch_latency_max_seconds", "Longest relay pass so far, claim to delete.")
	dRelayBack   = desc("pgbox_relay_backlog_rows", "Unpublished, unparked outbox rows at the relay's last heartbeat (counted up to 100,000).")
	dLanesHeld   = desc("pgbox_relay_lanes_held", "Lanes this instance held at its last heartbeat.")
	dInstances   = desc("pgbox_relay_instances", "Live relay instances seen at the last heartbeat.")
	dUnpublished = desc("pgbox_outbox_unpublished_rows", "Unpublished, unparked outbox rows, by topic and lane (read at scrape).", "topic", "lane")
	dParkedRows  = desc("pgbox_outbox_parked_rows", "Parked outbox rows, by topic (read at scrape).", "topic")
	dOldest      = desc("pgbox_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished, unparked outbox row (0 when none).")
	dLaneOwner   = desc("pgbox_relay_lane_owner", "1 for each lane and the instance holding its lease (read at scrape).", "lane", "owner")
	dDBUp        = desc("pgbox_scrape_database_up", "1 if the scrape's database queries succeeded.")

	dCleanDeleted = desc("pgbox_cleanup_deleted_total", "Rows deleted by cleanup, all tables.")
	dCleanTopic   = desc("pgbox_cleanup_inbox_deleted_total", "Inbox keys deleted by cleanup, by source topic.", "topic")
	dCleanPasses  = desc("pgbox_cleanup_passes_total", "Cleanup passes that ran.")
	dCleanLocked  = desc("pgbox_cleanup_passes_locked_total", "Cleanup passes skipped because another cleaner held the lock.")
	dCleanErrors  = desc("pgbox_cleanup_pass_errors_total", "Cleanup passes that ended with an error.")
	dCleanSkipped = desc("pgbox_cleanup_topics_skipped_total", "Topic-passes that pruned nothing (infinite retention, compacted, Kafka unreachable...).")
	dCleanLast    = desc("pgbox_cleanup_last_pass_timestamp_seconds", "Start of the last cleanup pass that ran (Unix time).")
	dCleanMargin  = desc("pgbox_inbox_retention_margin_seconds", "Window minus the oldest key's age after the last pass, by topic; negative means overdue keys.", "topic")

	dInboxProcessed = desc("pgbox_inbox_processed_total", "Messages whose handler ran (in-process inbox).")
	dInboxDup       = desc("pgbox_inbox_duplicates_total", "Dedup hits: messages skipped because their key was seen before (in-process inbox).")
	dConsDead       = desc("pgbox_consumer_dead_lettered_total", "Messages dead-lettered by the consumer adapter.")
	dConsRetries    = desc("pgbox_consumer_retries_total", "Handler attempts repeated after a failure.")
)

func newExporter(src statsSources) *exporter {
	e := &exporter{src: src, reg: prometheus.NewRegistry()}
	e.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "pgbox_relay_batch_latency_seconds",
		Help:    "Relay pass latency, claim to delete. Fed every 250ms from the relay's counters: passes within one poll are observed at their mean.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
	e.reg.MustRegister(e, e.latency, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return e
}

// pollLatency feeds the histogram until ctx ends.
func (e *exporter) pollLatency(ctx context.Context) {
	if e.src.Relay == nil {
		return
	}
	t := time.NewTicker(latencyPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			e.feedLatency()
			return
		case <-t.C:
			e.feedLatency()
		}
	}
}

func (e *exporter) feedLatency() {
	s := e.src.Relay.Stats()
	e.mu.Lock()
	defer e.mu.Unlock()
	n, sum := s.Batches-e.lastN, s.BatchLatencyTotal-e.lastSum
	e.lastN, e.lastSum = s.Batches, s.BatchLatencyTotal
	if n == 0 {
		return
	}
	mean := (sum / time.Duration(n)).Seconds()
	for range n {
		e.latency.Observe(mean)
	}
}

func (e *exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dPublished, dRetried, dParked, dBatches, dLatMax, dRelayBack, dLanesHeld, dInstances,
		dUnpublished, dParkedRows, dOldest, dLaneOwner, dDBUp, dCleanDeleted, dCleanTopic, dCleanPasses, dCleanLocked,
		dCleanErrors, dCleanSkipped, dCleanLast, dCleanMargin, dInboxProcessed, dInboxDup, dConsDead, dConsRetries} {
		ch <- d
	}
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (e *exporter) Collect(ch chan<- prometheus.Metric) {
	if r := e.src.Relay; r != nil {
		s := r.Stats()
		counter(ch, dPublished, float64(s.Published))
		counter(ch, dRetried, float64(s.Retried))
		counter(ch, dParked, float64(s.Parked))
		counter(ch, dBatches, float64(s.Batches))
		gauge(ch, dLatMax, s.BatchLatencyMax.Seconds())
		gauge(ch, dRelayBack, float64(s.Backlog))
		gauge(ch, dLanesHeld, float64(s.Lanes))
		gauge(ch, dInstances, float64(s.Instances))
	}
	if c := e.src.Cleaner; c != nil {
		s := c.Stats()
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
	if ib := e.src.Inbox; ib != nil {
		s := ib.Stats()
		counter(ch, dInboxProcessed, float64(s.Processed))
		counter(ch, dInboxDup, float64(s.Duplicates))
	}
	if h := e.src.Consumer; h != nil {
		s := h.Stats()
		counter(ch, dConsDead, float64(s.DeadLettered))
		counter(ch, dConsRetries, float64(s.Retries))
	}
	if e.src.Pool != nil {
		e.collectDB(ch)
	}
}

// collectDB reads the backlog and lane owners. A failed read reports
// pgbox_scrape_database_up 0 rather than failing the scrape.
func (e *exporter) collectDB(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeDBTimeout)
	defer cancel()
	rep, err := collectStatus(ctx, e.src.Pool, e.src.Lanes, false)
	if err != nil {
		gauge(ch, dDBUp, 0)
		return
	}
	gauge(ch, dDBUp, 1)
	parked := map[string]int64{}
	for _, b := range rep.Backlog {
		gauge(ch, dUnpublished, float64(b.Unpublished), b.Topic, itoa(b.Lane))
		parked[b.Topic] += b.Parked
	}
	for t, n := range parked {
		gauge(ch, dParkedRows, float64(n), t)
	}
	oldest := 0.0
	if rep.OldestAge != nil {
		oldest = *rep.OldestAge
	}
	gauge(ch, dOldest, oldest)
	for _, l := range rep.LaneRows {
		if l.Held {
			gauge(ch, dLaneOwner, 1, itoa(l.Lane), l.Owner)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
