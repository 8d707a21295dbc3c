package pgboxprom

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/outbox"
)

// A fleet of relays (relay.Fleet, `relay run` with a target list) serves
// many targets, each a set of pgbox tables. Reading every target's
// database at each scrape would cost a scrape thousands of queries, and a
// series per target and metric would cost Prometheus thousands of series:
// so a [Fleet] hands the collector what it last read of each target (read
// on its own schedule, its own concurrency), and says which targets get
// series of their own. The collector exports the fleet's totals and
// maxima always, the chosen targets' series labelled target="NAME": their
// figures, and the detail of their database metrics per topic, lane and
// consumer (a target's backlog per topic and lane, its inbox keys per
// consumer and topic…) under pgbox_target_ names of their own.

// Fleet is what the collector reads of a fleet's targets beyond their
// counts per state ([Targets]): each target's relay counters and its last
// database read. The binary's reader (`relay run` with a target list) is
// one; a service running a relay.Fleet can write its own over
// inspect.Read.
type Fleet interface {
	FleetTargets() []FleetTarget
}

// Read results of a [FleetTarget].
const (
	// ReadOK: the last read took the whole snapshot.
	ReadOK = "ok"
	// ReadFailed: the database answered, a query failed or timed out.
	ReadFailed = "failed"
	// ReadUnreachable: the database could not be reached.
	ReadUnreachable = "unreachable"
	// ReadPending: not read yet.
	ReadPending = "pending"
)

// FleetTarget is one target of a [Fleet] as last read.
type FleetTarget struct {
	// Name is the target's name, the value of its series' target label.
	Name string
	// Relay is the target's relay counters (relay.TargetState.Stats); nil
	// when the fleet does not run it.
	Relay *outbox.RelayStats
	// Read is ReadOK, ReadFailed, ReadUnreachable or ReadPending (any
	// other value counts as pending).
	Read string
	// Snapshot is the last read that succeeded, nil when none did or the
	// last read failed.
	Snapshot *inspect.Snapshot
	// Cleanup is the target's cleaner counters and last pass (its passes in
	// this process); nil when the fleet does not prune it. Its last pass's
	// windows give the target's inbox cutoffs, as [Config.Cleaner]'s do.
	Cleanup *cleanup.Stats
	// Series: export the target's own series, its Snapshot's detail per
	// topic, lane and consumer among them (its Topics, LaneAges,
	// ParkedTopics, Inbox and Dead: a Fleet may keep those lists for these
	// targets only). The Fleet chooses which (a few of the worst, or all):
	// the totals count every target.
	Series bool
}

// Fleet totals, over every target of a [Fleet]. The unlabelled gauges that
// make sense as a fleet's maximum or sum keep their single-target names
// (pgbox_outbox_oldest_unpublished_age_seconds, pgbox_relay_lanes_unowned,
// pgbox_xmin_horizon_age_*, pgbox_scrape_database_*), so the alerts over
// them cover every target; so do the inbox's oldest key and cleanup window
// per consumer and topic (the oldest key of any target, the shortest
// window), and, from [Config.FleetCleaner], the cleaner's counters. The
// outbox's per-topic families would grow with the tenants' topics, so
// their totals have names of their own.
var (
	dFleetUnpublished = desc("pgbox_fleet_outbox_unpublished_rows", "Unpublished, unparked outbox rows summed over the fleet's targets, as last read (a target's count is exact up to inspect's ExactLimit, a planner estimate past it).")
	dFleetParked      = desc("pgbox_fleet_outbox_parked_rows", "Parked outbox rows summed over the fleet's targets, as last read.")
	dFleetDead        = desc("pgbox_fleet_consumer_dead_letter_rows", "Dead letters summed over the fleet's targets, as last read.")
	dFleetInboxAge    = desc("pgbox_fleet_inbox_oldest_key_age_seconds", "Age of the oldest inbox key of any consumer, topic and target of the fleet, as last read.")
	dFleetRead        = desc("pgbox_fleet_targets_read", "The fleet's targets by the result of their last database read: ok, failed, unreachable, pending (not read yet).", "result")
	dFleetReadAge     = desc("pgbox_fleet_read_age_seconds", "Age of the oldest database read the fleet's figures come from (0 when none was read).")

	dTargetPublished   = desc("pgbox_target_relay_published_total", "A target's records Kafka acknowledged (its relay's pgbox_relay_published_total); only for the targets chosen for series of their own.", "target")
	dTargetRetried     = desc("pgbox_target_relay_retried_total", "A target's row sends that failed and were left for a later pass; chosen targets only.", "target")
	dTargetParkedTotal = desc("pgbox_target_relay_parked_total", "A target's rows parked by the relay; chosen targets only.", "target")
	dTargetLanesHeld   = desc("pgbox_target_relay_lanes_held", "Lanes of a target this process held at its last heartbeat; chosen targets only.", "target")
	dTargetUp          = desc("pgbox_target_database_up", "1 if a target's database answered its last read, 0 if it could not be reached; chosen targets only.", "target")
	dTargetUnpublished = desc("pgbox_target_outbox_unpublished_rows", "A target's unpublished, unparked outbox rows, as last read; chosen targets only.", "target")
	dTargetOldest      = desc("pgbox_target_outbox_oldest_unpublished_age_seconds", "Age of a target's oldest unpublished, unparked outbox row (0 when none), as last read; chosen targets only.", "target")
	dTargetParked      = desc("pgbox_target_outbox_parked_rows", "A target's parked outbox rows, as last read; chosen targets only.", "target")
	dTargetDead        = desc("pgbox_target_consumer_dead_letter_rows", "A target's dead letters, as last read; chosen targets only.", "target")
	dTargetUnowned     = desc("pgbox_target_relay_lanes_unowned", "A target's lanes no live relay instance holds, as last read; chosen targets only.", "target")
	dTargetInboxAge    = desc("pgbox_target_inbox_oldest_key_age_seconds", "Age of a target's oldest inbox key of any consumer and topic, as last read; chosen targets only.", "target")

	dTargetCleanPasses  = desc("pgbox_target_cleanup_passes_total", "A target's cleanup passes that ran in this process (pgbox_cleanup_passes_total); chosen targets only.", "target")
	dTargetCleanErrors  = desc("pgbox_target_cleanup_pass_errors_total", "A target's cleanup passes that ended with an error; chosen targets only.", "target")
	dTargetCleanDeleted = desc("pgbox_target_cleanup_deleted_total", "Rows a target's cleanup passes deleted, all tables; chosen targets only.", "target")
	dTargetCleanLast    = desc("pgbox_target_cleanup_last_pass_timestamp_seconds", "Start of a target's last cleanup pass that ran (Unix time); chosen targets only.", "target")
	dTargetCleanMargin  = desc("pgbox_target_inbox_retention_margin_seconds", "A target's least inbox retention margin over its topics after its last pass (window minus the oldest key's age; negative: overdue keys); chosen targets only.", "target")
)

// A chosen target's detail per topic, lane and consumer: the families of
// the single database's detail (pgbox_outbox_unpublished_rows{topic,lane},
// pgbox_inbox_keys{consumer,topic}…), as last read, under names of their
// own with a target label first. The single-database names cannot take
// the label (some are the fleet's maxima); where a target's total already
// has the name, the detail's says what it is per (_topic_).
var targetDetail = &detailDescs{
	unpublished: desc("pgbox_target_outbox_topic_unpublished_rows", "A target's unpublished, unparked outbox rows by topic and lane, as last read (as pgbox_outbox_unpublished_rows: estimates are per topic, with lane=\"\"); chosen targets only.", "target", "topic", "lane"),
	unpubEst:    desc("pgbox_target_outbox_unpublished_rows_estimated", "1 when a target's outbox counts (pgbox_target_outbox_unpublished_rows, …_topic_unpublished_rows) are planner estimates, 0 when exact, as last read; chosen targets only.", "target"),
	parked:      desc("pgbox_target_outbox_topic_parked_rows", "A target's parked outbox rows by topic, as last read; chosen targets only.", "target", "topic"),
	laneAge:     desc("pgbox_target_outbox_lane_oldest_unpublished_age_seconds", "Age of a target's oldest unpublished, unparked outbox row in each lane (0 when none), as last read; chosen targets only.", "target", "lane"),
	inboxKeys:   desc("pgbox_target_inbox_keys", "A target's inbox keys by consumer and source topic, as last read (exact up to the read's ExactLimit, an estimate past it); chosen targets only.", "target", "consumer", "topic"),
	inboxKeyEst: desc("pgbox_target_inbox_keys_estimated", "1 when a target's pgbox_target_inbox_keys for this consumer and topic is a planner estimate, 0 when exact; chosen targets only.", "target", "consumer", "topic"),
	inboxAge:    desc("pgbox_target_inbox_topic_oldest_key_age_seconds", "Age of a target's oldest inbox key by consumer and source topic, as last read; chosen targets only.", "target", "consumer", "topic"),
	inboxWindow: desc("pgbox_target_inbox_cleanup_window_seconds", "How long cleanup keeps a target's keys of the topic: its cleaner's last pass's window when it has one, else the read's; absent when unknown; chosen targets only.", "target", "consumer", "topic"),
	inboxCut:    desc("pgbox_target_inbox_cleanup_cutoff_timestamp_seconds", "A target's cleanup cutoff (Unix time: its read's time minus the window): keys older are due for deletion; chosen targets only.", "target", "consumer", "topic"),
	dead:        desc("pgbox_target_consumer_topic_dead_letter_rows", "A target's dead letters by consumer and topic, as last read; chosen targets only.", "target", "consumer", "topic"),
}

var fleetDescs = []*prometheus.Desc{
	dFleetUnpublished, dFleetParked, dFleetDead, dFleetInboxAge, dFleetRead, dFleetReadAge,
	dTargetPublished, dTargetRetried, dTargetParkedTotal, dTargetLanesHeld, dTargetUp,
	dTargetUnpublished, dTargetOldest, dTargetParked, dTargetDead, dTargetUnowned, dTargetInboxAge,
	dTargetCleanPasses, dTargetCleanErrors, dTargetCleanDeleted, dTargetCleanLast, dTargetCleanMargin,
	targetDetail.unpublished, targetDetail.unpubEst, targetDetail.parked, targetDetail.laneAge,
	targetDetail.inboxKeys, targetDetail.inboxKeyEst, targetDetail.inboxAge, targetDetail.inboxWindow, targetDetail.inboxCut, targetDetail.dead,
}

// inboxPair is an inbox's consumer and source topic.
type inboxPair struct{ consumer, topic string }

// inboxTotal is a consumer and topic's figures over the fleet's targets.
type inboxTotal struct {
	age    float64
	window *float64 // the shortest known
}

// withCleanerCutoffs returns s with the inbox windows and cutoffs of a
// target's cleaner's last pass when it has one (cs not nil): a copy, its
// inbox entries cloned, for the Fleet hands every scrape the same
// snapshot, and scrapes may run at once.
func withCleanerCutoffs(s *inspect.Snapshot, cs *cleanup.Stats) *inspect.Snapshot {
	if cs == nil || len(s.Inbox) == 0 {
		return s
	}
	c := *s
	c.Inbox = slices.Clone(s.Inbox)
	c.ApplyCutoffs(cleanerCutoffs(*cs), "from the cleaner's last pass")
	return &c
}

// addInbox adds a target's inbox entries to totals.
func addInbox(totals map[inboxPair]inboxTotal, s *inspect.Snapshot) {
	for _, in := range s.Inbox {
		k := inboxPair{in.Consumer, in.Topic}
		t := totals[k]
		t.age = max(t.age, in.OldestAge)
		if in.Window != nil && (t.window == nil || *in.Window < *t.window) {
			t.window = in.Window
		}
		totals[k] = t
	}
}

// leastMargin is the least retention margin of a cleaner's last pass over
// the topics whose window it knew, in seconds (false: none).
func leastMargin(s *cleanup.Stats) (float64, bool) {
	m, ok := 0.0, false
	for _, ts := range s.Topics {
		if ts.Reason == "" && ts.Window > 0 && (!ok || ts.Margin.Seconds() < m) {
			m, ok = ts.Margin.Seconds(), true
		}
	}
	return m, ok
}

// targetFigures are the figures of one snapshot the fleet's series use.
type targetFigures struct {
	unpublished, parked, dead int64
	oldest, inboxAge          float64
	unowned                   int
}

func figures(s *inspect.Snapshot) targetFigures {
	f := targetFigures{unpublished: s.Outbox.Unpublished, parked: s.Outbox.Parked}
	if s.Outbox.OldestAge != nil {
		f.oldest = *s.Outbox.OldestAge
	}
	for _, d := range s.Dead {
		f.dead += d.Count
	}
	for _, in := range s.Inbox {
		f.inboxAge = max(f.inboxAge, in.OldestAge)
	}
	dormant := s.DormantOnly() // no lane is held, and nothing waits for one
	for _, l := range s.Lanes {
		if !l.Held && !dormant {
			f.unowned++
		}
	}
	return f
}

// collectFleet exports the fleet's totals, and the series of the targets
// chosen for their own.
func (c *Collector) collectFleet(ch chan<- prometheus.Metric) {
	targets := c.cfg.Fleet.FleetTargets()
	var total targetFigures
	reads := map[string]int{ReadOK: 0, ReadFailed: 0, ReadUnreachable: 0, ReadPending: 0}
	horizonAge := map[inspect.HolderKind]float64{}
	horizonXacts := map[inspect.HolderKind]int64{}
	var readSeconds, readAge float64
	var oldestRead time.Time
	inbox := map[inboxPair]inboxTotal{}
	for _, t := range targets {
		if _, ok := reads[t.Read]; !ok {
			t.Read = ReadPending // unset, or not one of the results
		}
		reads[t.Read]++
		if t.Snapshot != nil { // t is a copy: the Fleet's snapshot stays as read
			t.Snapshot = withCleanerCutoffs(t.Snapshot, t.Cleanup)
		}
		if t.Series {
			exportTarget(ch, t)
		}
		s := t.Snapshot
		if s == nil {
			continue
		}
		f := figures(s)
		addInbox(inbox, s)
		total.unpublished += f.unpublished
		total.parked += f.parked
		total.dead += f.dead
		total.unowned += f.unowned
		total.oldest = max(total.oldest, f.oldest)
		total.inboxAge = max(total.inboxAge, f.inboxAge)
		readSeconds = max(readSeconds, s.ReadSeconds)
		for _, k := range s.Horizon.Kinds {
			if k.AgeSeconds != nil {
				horizonAge[k.Kind] = max(horizonAge[k.Kind], *k.AgeSeconds)
			}
			horizonXacts[k.Kind] = max(horizonXacts[k.Kind], k.AgeTransactions)
		}
		if oldestRead.IsZero() || s.Time.Before(oldestRead) {
			oldestRead = s.Time
		}
	}
	if !oldestRead.IsZero() {
		readAge = time.Since(oldestRead).Seconds() // the database's clock against ours: a skew shows here
	}
	gauge(ch, dFleetUnpublished, float64(total.unpublished))
	gauge(ch, dFleetParked, float64(total.parked))
	gauge(ch, dFleetDead, float64(total.dead))
	gauge(ch, dFleetInboxAge, total.inboxAge)
	gauge(ch, dOldest, total.oldest)
	gauge(ch, dUnowned, float64(total.unowned))
	for r, n := range reads {
		gauge(ch, dFleetRead, float64(n), r)
	}
	gauge(ch, dFleetReadAge, max(readAge, 0))
	for k, t := range inbox {
		gauge(ch, dInboxAge, t.age, k.consumer, k.topic)
		if t.window != nil {
			gauge(ch, dInboxWindow, *t.window, k.consumer, k.topic)
		}
	}
	for k, v := range horizonAge {
		gauge(ch, dHorizonAge, v, string(k))
	}
	for k, v := range horizonXacts {
		gauge(ch, dHorizonXacts, float64(v), string(k))
	}
	// The scrape gauges over the targets' last reads: down when any
	// target's database could not be reached, incomplete when any read
	// failed, so the alerts over them cover every target.
	if len(targets) > 0 {
		gauge(ch, dDBUp, boolf(reads[ReadUnreachable] == 0))
		gauge(ch, dScrapeOK, boolf(reads[ReadUnreachable]+reads[ReadFailed] == 0))
		gauge(ch, dScrapeS, readSeconds)
	}
}

// exportTarget exports one target's own series: its relay and cleanup
// counters, its database's figures and their detail per topic, lane and
// consumer (its snapshot's inbox windows already from its cleaner's last
// pass).
func exportTarget(ch chan<- prometheus.Metric, t FleetTarget) {
	if r := t.Relay; r != nil {
		counter(ch, dTargetPublished, float64(r.Published), t.Name)
		counter(ch, dTargetRetried, float64(r.Retried), t.Name)
		counter(ch, dTargetParkedTotal, float64(r.Parked), t.Name)
		gauge(ch, dTargetLanesHeld, float64(r.Lanes), t.Name)
	}
	if cs := t.Cleanup; cs != nil {
		counter(ch, dTargetCleanPasses, float64(cs.Passes), t.Name)
		counter(ch, dTargetCleanErrors, float64(cs.PassErrors), t.Name)
		counter(ch, dTargetCleanDeleted, float64(cs.Deleted), t.Name)
		if !cs.LastPass.IsZero() {
			gauge(ch, dTargetCleanLast, float64(cs.LastPass.UnixNano())/1e9, t.Name)
		}
		if m, ok := leastMargin(cs); ok {
			gauge(ch, dTargetCleanMargin, m, t.Name)
		}
	}
	switch t.Read {
	case ReadUnreachable:
		gauge(ch, dTargetUp, 0, t.Name)
	case ReadOK, ReadFailed:
		gauge(ch, dTargetUp, 1, t.Name)
	}
	if t.Snapshot == nil {
		return
	}
	f := figures(t.Snapshot)
	gauge(ch, dTargetUnpublished, float64(f.unpublished), t.Name)
	gauge(ch, dTargetOldest, f.oldest, t.Name)
	gauge(ch, dTargetParked, float64(f.parked), t.Name)
	gauge(ch, dTargetDead, float64(f.dead), t.Name)
	gauge(ch, dTargetUnowned, float64(f.unowned), t.Name)
	gauge(ch, dTargetInboxAge, f.inboxAge, t.Name)
	exportOutboxDetail(ch, targetDetail, t.Snapshot, t.Name)
	exportInbox(ch, targetDetail, t.Snapshot, t.Name)
}
