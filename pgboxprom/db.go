package pgboxprom

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
)

// collectDB reads one inspection snapshot, bounded by ScrapeTimeout, and
// exports it. A slow or failing read shows in the duration and snapshot_ok
// gauges; only a database that cannot be reached reports up 0.
func (c *Collector) collectDB(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ScrapeTimeout)
	defer cancel()
	opts := c.cfg.Inspect
	if c.cfg.Cleaner != nil {
		opts.Cutoffs = nil // the cleaner's last pass gives the windows, without asking Kafka
	}
	start := time.Now()
	snap, err := inspect.Read(ctx, c.cfg.DB, opts)
	gauge(ch, dScrapeS, time.Since(start).Seconds())
	if err != nil {
		up := 1.0
		if errors.Is(err, inspect.ErrNoConnection) {
			up = 0
		}
		gauge(ch, dDBUp, up)
		gauge(ch, dScrapeOK, 0)
		c.cfg.Logger.WarnContext(ctx, "pgboxprom: scrape's database read failed", "err", err)
		return
	}
	gauge(ch, dDBUp, 1)
	gauge(ch, dScrapeOK, 1)
	if c.cfg.Cleaner != nil {
		snap.ApplyCutoffs(cleanerCutoffs(c.cfg.Cleaner.Stats()), "from the cleaner's last pass")
	}
	exportOutbox(ch, snap)
	exportInbox(ch, snap)
	exportHorizon(ch, snap)
}

// cleanerCutoffs turns a cleaner's last view of each topic into plans.
func cleanerCutoffs(s cleanup.Stats) []cleanup.TopicReport {
	out := make([]cleanup.TopicReport, 0, len(s.Topics))
	for _, ts := range s.Topics {
		out = append(out, ts.Last)
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func exportOutbox(ch chan<- prometheus.Metric, snap *inspect.Snapshot) {
	for _, b := range snap.Topics {
		lane := ""
		if b.Lane >= 0 {
			lane = itoa(b.Lane)
		}
		gauge(ch, dUnpublished, float64(b.Unpublished), b.Topic, lane)
	}
	gauge(ch, dUnpubEst, boolf(snap.Outbox.Estimated))
	for _, p := range snap.ParkedTopics {
		gauge(ch, dParkedRow, float64(p.Count), p.Topic)
	}
	oldest := 0.0
	if snap.Outbox.OldestAge != nil {
		oldest = *snap.Outbox.OldestAge
	}
	gauge(ch, dOldest, oldest)
	for _, l := range snap.LaneAges {
		age := 0.0
		if l.OldestAge != nil {
			age = *l.OldestAge
		}
		gauge(ch, dLaneAge, age, itoa(l.Lane))
	}
	unowned := 0
	dormant := snap.DormantOnly() // no lane is held, and nothing waits for one
	for _, l := range snap.Lanes {
		if l.Held {
			gauge(ch, dLaneOwner, 1, itoa(l.Lane), l.Owner)
		} else if !dormant {
			unowned++
		}
	}
	gauge(ch, dUnowned, float64(unowned))
}

func exportInbox(ch chan<- prometheus.Metric, snap *inspect.Snapshot) {
	for _, in := range snap.Inbox {
		gauge(ch, dInboxKeys, float64(in.Keys), in.Consumer, in.Topic)
		gauge(ch, dInboxKeyEst, boolf(in.Estimated), in.Consumer, in.Topic)
		gauge(ch, dInboxAge, in.OldestAge, in.Consumer, in.Topic)
		if in.Window != nil {
			gauge(ch, dInboxWindow, *in.Window, in.Consumer, in.Topic)
		}
		if in.Cutoff != nil {
			gauge(ch, dInboxCut, float64(in.Cutoff.UnixNano())/1e9, in.Consumer, in.Topic)
		}
	}
	for _, d := range snap.Dead {
		gauge(ch, dDeadRows, float64(d.Count), d.Consumer, d.Topic)
	}
}
