package pgboxprom

import (
	"context"
	"errors"
	"slices"
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
	exportInbox(ch, dbDetail, snap)
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

// exportOutbox exports the database's outbox: its detail under the
// single-database names, its oldest row, lane owners and unowned lanes.
func exportOutbox(ch chan<- prometheus.Metric, snap *inspect.Snapshot) {
	exportOutboxDetail(ch, dbDetail, snap)
	oldest := 0.0
	if snap.Outbox.OldestAge != nil {
		oldest = *snap.Outbox.OldestAge
	}
	gauge(ch, dOldest, oldest)
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

// exportOutboxDetail exports a database's backlog per topic and lane
// (and whether it is an estimate), its parked rows per topic and each
// lane's oldest row, under ds's names, each series's label values
// following lead's.
func exportOutboxDetail(ch chan<- prometheus.Metric, ds *detailDescs, snap *inspect.Snapshot, lead ...string) {
	for _, b := range snap.Topics {
		lane := ""
		if b.Lane >= 0 {
			lane = itoa(b.Lane)
		}
		gauge(ch, ds.unpublished, float64(b.Unpublished), lv(lead, b.Topic, lane)...)
	}
	gauge(ch, ds.unpubEst, boolf(snap.Outbox.Estimated), lead...)
	for _, p := range snap.ParkedTopics {
		gauge(ch, ds.parked, float64(p.Count), lv(lead, p.Topic)...)
	}
	for _, l := range snap.LaneAges {
		age := 0.0
		if l.OldestAge != nil {
			age = *l.OldestAge
		}
		gauge(ch, ds.laneAge, age, lv(lead, itoa(l.Lane))...)
	}
}

// exportInbox exports a database's inbox keys, their oldest, the cleanup
// windows and cutoffs per consumer and topic, and its dead letters, under
// ds's names, each series's label values following lead's.
func exportInbox(ch chan<- prometheus.Metric, ds *detailDescs, snap *inspect.Snapshot, lead ...string) {
	for _, in := range snap.Inbox {
		pair := lv(lead, in.Consumer, in.Topic)
		gauge(ch, ds.inboxKeys, float64(in.Keys), pair...)
		gauge(ch, ds.inboxKeyEst, boolf(in.Estimated), pair...)
		gauge(ch, ds.inboxAge, in.OldestAge, pair...)
		if in.Window != nil {
			gauge(ch, ds.inboxWindow, *in.Window, pair...)
		}
		if in.Cutoff != nil {
			gauge(ch, ds.inboxCut, float64(in.Cutoff.UnixNano())/1e9, pair...)
		}
	}
	for _, d := range snap.Dead {
		gauge(ch, ds.dead, float64(d.Count), lv(lead, d.Consumer, d.Topic)...)
	}
}

// lv is the label values lead then vs, in a slice of their own.
func lv(lead []string, vs ...string) []string {
	return append(slices.Clip(lead), vs...)
}
