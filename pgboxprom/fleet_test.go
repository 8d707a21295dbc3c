package pgboxprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/promtest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxprom"
)

type fleetOf []pgboxprom.FleetTarget

func (f fleetOf) FleetTargets() []pgboxprom.FleetTarget { return f }

// A Fleet's targets: totals and maxima over every target read, under the
// single-database names where a maximum or a sum means the same; series of
// their own only for the targets marked.
func TestFleetTotalsAndChosenSeries(t *testing.T) {
	t.Parallel()
	age := func(s float64) *float64 { return &s }
	snap := func(unpublished, parked int64, oldest *float64, dead int64, unowned int, inboxAge float64, horizon float64) *inspect.Snapshot {
		s := &inspect.Snapshot{Time: time.Now()}
		s.Outbox.Unpublished, s.Outbox.Parked, s.Outbox.OldestAge = unpublished, parked, oldest
		s.Dead = []inspect.DeadCount{{Consumer: "svc", Topic: "orders", Count: dead}}
		for i := range 4 {
			s.Lanes = append(s.Lanes, inspect.Lane{Lane: i, Held: i >= unowned})
		}
		s.Inbox = []inspect.InboxTopic{{Consumer: "svc", Topic: "orders", OldestAge: inboxAge}}
		s.Horizon.Kinds = []inspect.HorizonKind{{Kind: inspect.HolderSession, Holders: 1, AgeSeconds: age(horizon), AgeTransactions: int64(horizon)}}
		return s
	}
	f := fleetOf{
		{Name: "acme", Relay: &outbox.RelayStats{Published: 7, Lanes: 4}, Read: pgboxprom.ReadOK, Snapshot: snap(3, 2, age(40), 1, 0, 100, 5), Series: true},
		{Name: "globex", Relay: &outbox.RelayStats{Published: 9}, Read: pgboxprom.ReadOK, Snapshot: snap(5, 0, age(90), 2, 1, 300, 50)},
		{Name: "initech", Read: pgboxprom.ReadUnreachable, Series: true},
		{Name: "hooli", Read: pgboxprom.ReadPending},
	}
	m := gather(t, newCollector(t, pgboxprom.Config{Fleet: f}))
	promtest.Require(t, m, map[string]float64{
		"pgbox_fleet_outbox_unpublished_rows":                 8,
		"pgbox_fleet_outbox_parked_rows":                      2,
		"pgbox_fleet_consumer_dead_letter_rows":               3,
		"pgbox_fleet_inbox_oldest_key_age_seconds":            300,
		"pgbox_outbox_oldest_unpublished_age_seconds":         90,
		"pgbox_relay_lanes_unowned":                           1,
		`pgbox_xmin_horizon_age_seconds{kind="session"}`:      50,
		`pgbox_xmin_horizon_age_transactions{kind="session"}`: 50,
		`pgbox_fleet_targets_read{result="ok"}`:               2,
		`pgbox_fleet_targets_read{result="unreachable"}`:      1,
		`pgbox_fleet_targets_read{result="pending"}`:          1,
		`pgbox_fleet_targets_read{result="failed"}`:           0,
		"pgbox_scrape_database_up":                            0,
		"pgbox_scrape_database_snapshot_ok":                   0,

		`pgbox_target_relay_published_total{target="acme"}`:                 7,
		`pgbox_target_relay_lanes_held{target="acme"}`:                      4,
		`pgbox_target_database_up{target="acme"}`:                           1,
		`pgbox_target_outbox_unpublished_rows{target="acme"}`:               3,
		`pgbox_target_outbox_oldest_unpublished_age_seconds{target="acme"}`: 40,
		`pgbox_target_outbox_parked_rows{target="acme"}`:                    2,
		`pgbox_target_consumer_dead_letter_rows{target="acme"}`:             1,
		`pgbox_target_relay_lanes_unowned{target="acme"}`:                   0,
		`pgbox_target_inbox_oldest_key_age_seconds{target="acme"}`:          100,
		`pgbox_target_database_up{target="initech"}`:                        0,
	})
	require.Less(t, m["pgbox_fleet_read_age_seconds"], 60.0)
	for name := range m {
		require.NotContains(t, name, `target="globex"`, "globex is not chosen")
		require.NotContains(t, name, `target="hooli"`)
	}
	require.NotContains(t, m, `pgbox_target_outbox_parked_rows{target="initech"}`, "no read, no figures")
}

// Fleet and DB together are refused: the fleet's totals take the names
// of the database gauges.
func TestFleetAndDBRefused(t *testing.T) {
	t.Parallel()
	_, err := pgboxprom.New(pgboxprom.Config{Fleet: fleetOf{}, DB: testdb.New(t).Pool})
	require.ErrorContains(t, err, "Fleet and DB are both set")
}

// cleanerOf is a fleet cleaner's totals.
type cleanerOf cleanup.Stats

func (c cleanerOf) Stats() cleanup.Stats { return cleanup.Stats(c) }

// A fleet that prunes its targets: the inbox cutoff alert's two gauges
// exist per consumer and topic over every target (the oldest key of any
// target against the shortest window its cleaner's last pass gave), the
// cleaner's counters under the single-database names, and each chosen
// target's own cleanup series.
func TestFleetInboxCutoffsAndCleanup(t *testing.T) {
	t.Parallel()
	now := time.Now()
	snap := func(ages ...float64) *inspect.Snapshot {
		s := &inspect.Snapshot{Time: now}
		for i, a := range ages {
			s.Inbox = append(s.Inbox, inspect.InboxTopic{Consumer: "svc", Topic: []string{"orders", "invoices"}[i], OldestAge: a})
		}
		return s
	}
	pass := func(window, oldest time.Duration, passes, errs int64) *cleanup.Stats {
		return &cleanup.Stats{Passes: passes, PassErrors: errs, Deleted: 10 * passes, LastPass: now.Add(-time.Minute), Topics: map[string]cleanup.TopicStats{
			"orders": {Window: window, OldestAge: oldest, Margin: window - oldest, Last: cleanup.TopicReport{Topic: "orders", Timed: true, Window: window}},
		}}
	}
	f := fleetOf{
		{Name: "acme", Read: pgboxprom.ReadOK, Snapshot: snap(5000, 20), Cleanup: pass(time.Hour, 5000*time.Second, 3, 1), Series: true},
		{Name: "globex", Read: pgboxprom.ReadOK, Snapshot: snap(100), Cleanup: pass(2*time.Hour, 100*time.Second, 2, 0)},
		{Name: "initech", Read: pgboxprom.ReadOK, Snapshot: snap(7000)}, // not pruned here: no window
	}
	totals := cleanup.Stats{Passes: 9, PassesLocked: 2, PassErrors: 1, Deleted: 50, TopicsSkipped: 4, LastPass: now.Add(-time.Minute),
		Topics: map[string]cleanup.TopicStats{"orders": {Deleted: 40, Window: time.Hour, Margin: -1400 * time.Second}}}
	m := gather(t, newCollector(t, pgboxprom.Config{Fleet: f, FleetCleaner: cleanerOf(totals)}))
	promtest.Require(t, m, map[string]float64{
		`pgbox_inbox_oldest_key_age_seconds{consumer="svc",topic="orders"}`:   7000,
		`pgbox_inbox_oldest_key_age_seconds{consumer="svc",topic="invoices"}`: 20,
		`pgbox_inbox_cleanup_window_seconds{consumer="svc",topic="orders"}`:   3600,
		"pgbox_cleanup_passes_total":                                          9,
		"pgbox_cleanup_passes_locked_total":                                   2,
		"pgbox_cleanup_pass_errors_total":                                     1,
		"pgbox_cleanup_deleted_total":                                         50,
		"pgbox_cleanup_topics_skipped_total":                                  4,
		`pgbox_cleanup_inbox_deleted_total{topic="orders"}`:                   40,
		`pgbox_inbox_retention_margin_seconds{topic="orders"}`:                -1400,
		`pgbox_target_cleanup_passes_total{target="acme"}`:                    3,
		`pgbox_target_cleanup_pass_errors_total{target="acme"}`:               1,
		`pgbox_target_cleanup_deleted_total{target="acme"}`:                   30,
		`pgbox_target_inbox_retention_margin_seconds{target="acme"}`:          -1400,
	})
	require.InDelta(t, float64(now.Add(-time.Minute).Unix()), m[`pgbox_target_cleanup_last_pass_timestamp_seconds{target="acme"}`], 1)
	require.NotContains(t, m, `pgbox_inbox_cleanup_window_seconds{consumer="svc",topic="invoices"}`, "no pass knew its window")
	for name := range m {
		require.NotContains(t, name, `target="globex"`, "globex is not chosen")
	}
	require.Equal(t, 5000.0, f[0].Snapshot.Inbox[0].OldestAge)
	require.Nil(t, f[0].Snapshot.Inbox[0].Window, "the Fleet's snapshot is not written")

	_, err := pgboxprom.New(pgboxprom.Config{Fleet: f, FleetCleaner: cleanerOf(totals), Cleaner: &cleanup.Cleaner{}})
	require.ErrorContains(t, err, "Cleaner and FleetCleaner are both set")
}

// A chosen target's detail per topic, lane and consumer, under names of
// its own labelled target: its backlog per topic and lane, parked rows per
// topic, each lane's oldest row, inbox keys, oldest keys, windows and
// cutoffs (from its cleaner's last pass) per consumer and topic, dead
// letters per consumer and topic. A target not chosen has none of it; the
// Fleet's snapshots are not written, by scrapes running at once either.
func TestFleetChosenTargetDetail(t *testing.T) {
	t.Parallel()
	now := time.Now()
	age := func(s float64) *float64 { return &s }
	acmeSnap := func() *inspect.Snapshot {
		s := &inspect.Snapshot{Time: now, LaneCount: 2}
		s.Outbox = inspect.OutboxTotals{Unpublished: 9, Parked: 3, OldestAge: age(40)}
		s.Topics = []inspect.TopicBacklog{{Topic: "orders", Lane: 0, Unpublished: 4}, {Topic: "orders", Lane: 1, Unpublished: 2}, {Topic: "invoices", Lane: 1, Unpublished: 3}}
		s.LaneAges = []inspect.LaneAge{{Lane: 0, OldestAge: age(40)}, {Lane: 1, OldestAge: age(15)}}
		s.ParkedTopics = []inspect.TopicCount{{Topic: "orders", Count: 2}, {Topic: "invoices", Count: 1}}
		s.Inbox = []inspect.InboxTopic{
			{Consumer: "svc", Topic: "orders", Keys: 5, OldestAge: 5000},
			{Consumer: "svc", Topic: "invoices", Keys: 70_000, Estimated: true, OldestAge: 20},
		}
		s.Dead = []inspect.DeadCount{{Consumer: "svc", Topic: "orders", Count: 1}, {Consumer: "billing", Topic: "invoices", Count: 4}}
		return s
	}
	estimated := func() *inspect.Snapshot { // past ExactLimit: per topic, lane=""
		s := &inspect.Snapshot{Time: now, LaneCount: 1}
		s.Outbox = inspect.OutboxTotals{Unpublished: 300_000, Estimated: true}
		s.Topics = []inspect.TopicBacklog{{Topic: "invoices", Lane: -1, Unpublished: 300_000, Estimated: true}}
		s.LaneAges = []inspect.LaneAge{{Lane: 0}}
		return s
	}
	pass := &cleanup.Stats{Passes: 1, LastPass: now.Add(-time.Minute), Topics: map[string]cleanup.TopicStats{
		"orders": {Window: time.Hour, OldestAge: 5000 * time.Second, Margin: -1400 * time.Second, Last: cleanup.TopicReport{Topic: "orders", Timed: true, Window: time.Hour}},
	}}
	f := fleetOf{
		{Name: "acme", Read: pgboxprom.ReadOK, Snapshot: acmeSnap(), Cleanup: pass, Series: true},
		{Name: "globex", Read: pgboxprom.ReadOK, Snapshot: acmeSnap(), Cleanup: pass},
		{Name: "initech", Read: pgboxprom.ReadOK, Snapshot: estimated(), Series: true},
	}
	col := newCollector(t, pgboxprom.Config{Fleet: f})

	// Scrapes at once, as Prometheus and a second scraper may: the race
	// detector sees any write to the shared snapshots.
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(col))
	errs := make(chan error, 4)
	for range cap(errs) {
		go func() {
			_, err := reg.Gather()
			errs <- err
		}()
	}
	for range cap(errs) {
		require.NoError(t, <-errs)
	}
	m := gather(t, col)

	cutoff := now.Add(-time.Hour)
	detail := map[string]float64{
		`pgbox_target_outbox_topic_unpublished_rows{lane="0",target="acme",topic="orders"}`:     4,
		`pgbox_target_outbox_topic_unpublished_rows{lane="1",target="acme",topic="orders"}`:     2,
		`pgbox_target_outbox_topic_unpublished_rows{lane="1",target="acme",topic="invoices"}`:   3,
		`pgbox_target_outbox_topic_unpublished_rows{lane="",target="initech",topic="invoices"}`: 300_000,
		`pgbox_target_outbox_unpublished_rows_estimated{target="acme"}`:                         0,
		`pgbox_target_outbox_unpublished_rows_estimated{target="initech"}`:                      1,
		`pgbox_target_outbox_topic_parked_rows{target="acme",topic="orders"}`:                   2,
		`pgbox_target_outbox_topic_parked_rows{target="acme",topic="invoices"}`:                 1,
		`pgbox_target_outbox_lane_oldest_unpublished_age_seconds{lane="0",target="acme"}`:       40,
		`pgbox_target_outbox_lane_oldest_unpublished_age_seconds{lane="1",target="acme"}`:       15,
		`pgbox_target_outbox_lane_oldest_unpublished_age_seconds{lane="0",target="initech"}`:    0,

		`pgbox_target_inbox_keys{consumer="svc",target="acme",topic="orders"}`:                             5,
		`pgbox_target_inbox_keys{consumer="svc",target="acme",topic="invoices"}`:                           70_000,
		`pgbox_target_inbox_keys_estimated{consumer="svc",target="acme",topic="orders"}`:                   0,
		`pgbox_target_inbox_keys_estimated{consumer="svc",target="acme",topic="invoices"}`:                 1,
		`pgbox_target_inbox_topic_oldest_key_age_seconds{consumer="svc",target="acme",topic="orders"}`:     5000,
		`pgbox_target_inbox_topic_oldest_key_age_seconds{consumer="svc",target="acme",topic="invoices"}`:   20,
		`pgbox_target_inbox_cleanup_window_seconds{consumer="svc",target="acme",topic="orders"}`:           3600,
		`pgbox_target_inbox_cleanup_cutoff_timestamp_seconds{consumer="svc",target="acme",topic="orders"}`: float64(cutoff.UnixNano()) / 1e9,
		`pgbox_target_consumer_topic_dead_letter_rows{consumer="svc",target="acme",topic="orders"}`:        1,
		`pgbox_target_consumer_topic_dead_letter_rows{consumer="billing",target="acme",topic="invoices"}`:  4,
	}
	promtest.Require(t, m, detail)
	// Nothing more of the detail: no window nor cutoff the cleaner did not
	// give (invoices), none for globex (not chosen).
	families := []string{"pgbox_target_outbox_topic_unpublished_rows{", "pgbox_target_outbox_unpublished_rows_estimated{",
		"pgbox_target_outbox_topic_parked_rows{", "pgbox_target_outbox_lane_oldest_unpublished_age_seconds{",
		"pgbox_target_inbox_keys{", "pgbox_target_inbox_keys_estimated{", "pgbox_target_inbox_topic_oldest_key_age_seconds{",
		"pgbox_target_inbox_cleanup_window_seconds{", "pgbox_target_inbox_cleanup_cutoff_timestamp_seconds{",
		"pgbox_target_consumer_topic_dead_letter_rows{"}
	for name := range m {
		for _, fam := range families {
			if strings.HasPrefix(name, fam) {
				require.Contains(t, detail, name, "only the chosen targets' detail")
			}
		}
		require.NotContains(t, name, `target="globex"`, "globex is not chosen")
	}
	// The totals still count globex's detail, windows from its cleaner.
	promtest.Require(t, m, map[string]float64{
		`pgbox_inbox_cleanup_window_seconds{consumer="svc",topic="orders"}`: 3600,
		"pgbox_fleet_outbox_parked_rows":                                    6,
		"pgbox_fleet_consumer_dead_letter_rows":                             10,
	})
	require.Equal(t, acmeSnap(), f[0].Snapshot, "the Fleet's snapshot is not written")
	require.Equal(t, acmeSnap(), f[1].Snapshot)
	require.Equal(t, estimated(), f[2].Snapshot)
}
