package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/promtest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

func init() {
	flagChecks["target-metrics"] = flagCheck{check: checkTargetMetrics, bad: "top:0"}
}

// targetSeriesIn returns the targets that have a series of their own in
// the exposition m.
func targetSeriesIn(m string) map[string]bool {
	out := map[string]bool{}
	for _, x := range regexp.MustCompile(`(?m)^pgbox_target_\w+\{target="([^"]+)"\}`).FindAllStringSubmatch(m, -1) {
		out[x[1]] = true
	}
	return out
}

// --target-metrics: all gives every target series of its own, none
// gives none; the fleet's totals are there either way; off reads no
// database for /metrics.
func checkTargetMetrics(t *testing.T, set setFn) {
	acme, globex := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(1, "t-acme"))
	file := writeFile(t, "targets.txt", fmt.Sprintf("acme %s\nglobex %s\n", acme.Schema, globex.Schema))
	for v, want := range map[string]int{"all": 2, "none": 0, "off": 0} {
		a, e := with(set, v, fleetEnv(t, c, "PGBOX_TARGETS="+file), "run")
		p := startRelay(t, e, a...)
		base := "http://" + p.HTTPAddr(t)
		var m string
		waitFor(t, "both targets running and read", 15*time.Second, func() bool {
			m = metricsOf(t, base)
			return strings.Contains(m, `pgbox_relay_targets{state="running"} 2`) &&
				(v == "off" || strings.Contains(m, `pgbox_fleet_targets_read{result="ok"} 2`))
		})
		require.Len(t, targetSeriesIn(m), want, "%s:\n%s", v, m)
		if v == "off" {
			time.Sleep(1500 * time.Millisecond) // a refresh: a reader would have read them
			m = metricsOf(t, base)
			require.NotContains(t, m, "pgbox_fleet_")
			require.NotContains(t, m, "pgbox_scrape_database_up")
		} else {
			require.Contains(t, m, "pgbox_fleet_outbox_parked_rows 0")
		}
		require.Contains(t, p.Output(), "target_metrics="+v)
		require.Equal(t, 0, p.stop(t), p.Output())
	}
}

// Bad values of --target-metrics name the setting and what it accepts.
func TestTargetMetricsValues(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]targetSeries{"none": {}, "all": {all: true}, "top:3": {top: 3}, " TOP:1000 ": {top: 1000}, "off": {off: true}} {
		got, ok := parseTargetSeries(v)
		require.True(t, ok, v)
		require.Equal(t, want, got, v)
	}
	for _, v := range []string{"", "top", "top:", "top:0", "top:-1", "top:1001", "top:x", "5", "some"} {
		_, ok := parseTargetSeries(v)
		require.False(t, ok, v)
	}
	file := writeFile(t, "targets.txt", "acme s_acme\n")
	r := runRelay(t, time.Minute, []string{"DATABASE_URL=" + defaultDB, "KAFKA_BROKERS=127.0.0.1:1", "PGBOX_TARGETS=" + file}, "run", "--target-metrics=top10")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, `invalid value "top10" for --target-metrics (env PGBOX_TARGET_METRICS)`)
	require.Contains(t, r.Stderr, `must be "none", "all", "top:N" with N from 1 to 1000, or "off"`)
}

// The cardinality bound: 5,000 targets, each read, with top:N give N
// targets series of their own (the N worst, as `relay status` orders
// them), and the fleet's totals count every target.
func TestTargetMetricsTopN(t *testing.T) {
	t.Parallel()
	const n = 5000
	f, err := relay.NewFleet(relay.FleetConfig{Relay: relay.Config{Brokers: []string{"127.0.0.1:1"}}})
	require.NoError(t, err)
	fr := &fleetRun{f: f, served: map[string]servedTarget{}, dbs: map[string]*fleetDB{"db": {url: "db"}}}
	r := &fleetReader{fr: fr, last: map[string]targetRead{}}
	age := func(s float64) *float64 { return &s }
	for i := range n {
		name := fmt.Sprintf("t%04d", i)
		fr.served[name] = servedTarget{spec: targetSpec{Name: name, Schema: "s_" + name, DatabaseURL: "db"}}
		snap := &inspect.Snapshot{Time: time.Now()}
		snap.Outbox.Unpublished = int64(i % 7)
		snap.Outbox.Parked = 1
		if i%1000 == 999 { // the five with the oldest rows: t0999 (oldest) … t4999
			snap.Outbox.OldestAge = age(float64(10_000 - i))
		}
		r.last[name] = targetRead{state: stateOK, snap: snap}
	}
	delete(r.last, "t0000") // not read yet: ranks after every target read
	r.last["t0001"] = targetRead{state: stateUnreachable, detail: "refused"}

	for _, c := range []struct {
		series targetSeries
		want   []string
	}{
		{targetSeries{top: 3}, []string{"t0001", "t0999", "t1999"}},
		{targetSeries{top: 10}, nil},
		{targetSeries{}, []string{}},
	} {
		r.series = c.series
		col, err := pgboxprom.New(pgboxprom.Config{Fleet: r})
		require.NoError(t, err)
		reg := prometheus.NewRegistry()
		require.NoError(t, reg.Register(col))
		mfs, err := reg.Gather()
		require.NoError(t, err)
		targets, series := map[string]bool{}, 0
		totals := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "target" {
						targets[l.GetValue()] = true
						series++
					}
				}
				if len(m.GetLabel()) == 0 && m.GetGauge() != nil {
					totals[mf.GetName()] = m.GetGauge().GetValue()
				}
			}
		}
		require.LessOrEqual(t, len(targets), c.series.top, "%s: at most N targets with series", c.series)
		for name := range targets {
			require.True(t, r.keepsDetail(name, n), "%s: %s's next read keeps its detail", c.series, name)
		}
		require.False(t, r.keepsDetail("t0007", n), "%s: not chosen, its reads stay small", c.series)
		// These snapshots carry no detail, relay or cleanup figures: a
		// dozen series per chosen target at most (17 with all of those,
		// plus the detail, TestFleetChosenTargetDetail).
		require.LessOrEqual(t, series, 12*c.series.top, "%s: a dozen series per chosen target at most here", c.series)
		if c.want != nil {
			require.Len(t, targets, len(c.want))
			for _, w := range c.want {
				require.True(t, targets[w], "%s: %s among the worst: %v", c.series, w, targets)
			}
		} else {
			require.Len(t, targets, c.series.top)
		}
		require.Equal(t, float64(n-2), totals["pgbox_fleet_outbox_parked_rows"], "every target read counts")
		require.Equal(t, float64(9001), totals["pgbox_outbox_oldest_unpublished_age_seconds"], "the worst")
		require.Equal(t, float64(0), totals["pgbox_scrape_database_up"], "a target's database unreachable")
	}
}

// The reader keeps the detail per topic and lane (which /metrics exports
// for the chosen targets only) of the targets the last scrape chose, of
// every target with all or with top:N over N targets or fewer, and of no
// other: thousands of reads stay small.
func TestReaderKeepsChosenDetail(t *testing.T) {
	t.Parallel()
	snap := &inspect.Snapshot{Topics: []inspect.TopicBacklog{{Topic: "t", Lane: 0, Unpublished: 1}}, LaneAges: []inspect.LaneAge{{Lane: 0}},
		ParkedTopics: []inspect.TopicCount{{Topic: "t", Count: 1}}, Parked: []inspect.ParkedRow{{ID: 1}}}
	kept := trimSnapshot(snap, true)
	require.Equal(t, snap.Topics, kept.Topics)
	require.Equal(t, snap.LaneAges, kept.LaneAges)
	require.Equal(t, snap.ParkedTopics, kept.ParkedTopics)
	require.Nil(t, kept.Parked, "the parked rows' list: relay status's, not the metrics'")
	trimmed := trimSnapshot(snap, false)
	require.Nil(t, trimmed.Topics)
	require.Nil(t, trimmed.LaneAges)
	require.Nil(t, trimmed.ParkedTopics)
	require.Len(t, snap.Parked, 1, "the read itself is not written")

	r := &fleetReader{series: targetSeries{top: 2}, chosen: map[string]bool{"acme": true}}
	require.True(t, r.keepsDetail("acme", 5), "chosen by the last scrape")
	require.False(t, r.keepsDetail("globex", 5))
	require.True(t, r.keepsDetail("globex", 2), "top:2 over two targets: every one is chosen")
	r.series = targetSeries{all: true}
	require.True(t, r.keepsDetail("globex", 5000))
	r.series = targetSeries{}
	require.False(t, r.keepsDetail("acme", 1), "none")
}

// The budget keeps room for one cleanup pass and lends more passes what
// is free, leaving room for a new database's smallest pool.
func TestConnBudgetCleanup(t *testing.T) {
	t.Parallel()
	o := &options{DBMaxConns: 10, CleanupInterval: time.Hour}
	o.Targets.ConnBudget = 20
	b := newConnBudget(o)
	share, err := b.split(1)
	require.NoError(t, err)
	require.Equal(t, 10, share)
	n, err := b.take(share)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	require.Equal(t, 15, b.planned(), "1 check + 3 cleanup + 10 + 1 LISTEN")
	require.Equal(t, 0, b.borrow(cleanupTargetConns, 3), "20 - 15 - 3 for a new database: room for no second pass")
	b.give(10)
	require.Equal(t, 3, b.borrow(cleanupTargetConns, 3))
	require.Equal(t, 13, b.planned())
	b.giveBack(9)
	require.Equal(t, 4, b.planned())
}

// `relay run` with a target list prunes every served target every
// --cleanup-interval under its own lease: a target whose pass fails is
// logged once per change and the others are pruned; it is pruned again
// once fixed; SIGTERM stops a pass that waits for a lock at once.
func TestRunTargetsCleanup(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	ordersLogStart(t, c)
	acme, globex := testdb.New(t), testdb.New(t)
	_, otherURL := testdb.CreateDatabase(t, "t_fleetops_")
	broken := headSchema(t, otherURL, "s_broken")
	for _, db := range []*testdb.DB{acme, globex, broken} {
		keysAt(t, db, 0, 1, 2)
	}
	opsExec(t, broken, `ALTER TABLE pgbox_consumer_attempts RENAME TO pgbox_consumer_attempts_away`)
	file := writeFile(t, "targets.txt", fmt.Sprintf("acme %s\nglobex %s\nbroken s_broken %s\n", acme.Schema, globex.Schema, otherURL))
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_CLEANUP_INTERVAL=1s", "PGBOX_CLEANUP_BUFFER=1h", "PGBOX_TARGETS_CONCURRENCY=2"), "run")
	base := "http://" + p.HTTPAddr(t)
	waitFor(t, "acme and globex pruned", time.Minute, func() bool { return inboxKeys(t, acme) == 1 && inboxKeys(t, globex) == 1 })
	roundRE := regexp.MustCompile(`msg="cleanup: round done" component=cleanup targets=3 failed=1 `)
	waitFor(t, "three rounds", time.Minute, func() bool { return len(roundRE.FindAllString(p.Output(), -1)) >= 3 })
	failedRE := regexp.MustCompile(`level=WARN msg="cleanup: target failed[^\n]*target=broken[^\n]*pgbox_consumer_attempts`)
	require.Len(t, failedRE.FindAllString(p.Output(), -1), 1, "logged once while it fails the same way:\n%s", p.Output())
	require.NotContains(t, p.Output(), "cleanup does not run")

	// New keys are pruned at the next rounds; the broken target is pruned
	// again once fixed, and says so once.
	keysAt(t, acme, 1)
	opsExec(t, broken, `ALTER TABLE pgbox_consumer_attempts_away RENAME TO pgbox_consumer_attempts`)
	waitFor(t, "acme pruned again", 30*time.Second, func() bool { return inboxKeys(t, acme) == 1 })
	waitFor(t, "broken pruned", 30*time.Second, func() bool { return inboxKeys(t, broken) == 1 })
	waitFor(t, "the recovery line", 10*time.Second, func() bool {
		return strings.Contains(p.Output(), `msg="cleanup: target pruned again" component=cleanup target=broken`)
	})

	// /metrics: the cleaner's counters over every target under the
	// single-database names, each target's own (top:10 by default: all
	// three), and the gauges of the inbox cutoff alert over every target.
	m := metricsOf(t, base)
	require.Regexp(t, `(?m)^pgbox_cleanup_passes_total [1-9]`, m)
	require.Regexp(t, `(?m)^pgbox_cleanup_pass_errors_total [1-9]`, m)
	require.Regexp(t, `(?m)^pgbox_cleanup_last_pass_timestamp_seconds \d`, m)
	require.Regexp(t, `(?m)^pgbox_target_cleanup_pass_errors_total\{target="broken"\} [1-9]`, m)
	require.Regexp(t, `(?m)^pgbox_target_cleanup_pass_errors_total\{target="acme"\} 0$`, m)
	require.Regexp(t, `(?m)^pgbox_target_cleanup_deleted_total\{target="globex"\} [1-9]`, m)
	require.Regexp(t, `(?m)^pgbox_inbox_oldest_key_age_seconds\{consumer="svc",topic="orders"\} \d`, m)
	require.Regexp(t, `(?m)^pgbox_inbox_cleanup_window_seconds\{consumer="svc",topic="orders"\} \d`, m)
	require.Regexp(t, `(?m)^pgbox_inbox_retention_margin_seconds\{topic="orders"\} \d`, m)

	// A pass waiting for its target's lease table stops at SIGTERM.
	ctx := context.Background()
	lock, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{acme.Schema, "pgbox_cleanup_lease"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	time.Sleep(2500 * time.Millisecond) // a round starts and waits
	stopAt := time.Now()
	require.Equal(t, 0, p.stop(t), p.Output())
	require.Less(t, time.Since(stopAt), 10*time.Second, "stopped promptly")
	require.NoError(t, tx.Rollback(ctx))
}

// With a target list /metrics has the fleet's totals of the database
// figures and, with top:1, the series of the worst target only.
func TestRunTargetsMetrics(t *testing.T) {
	t.Parallel()
	acme, globex, initech := testdb.New(t), testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(1, "t-acme", "t-globex", "t-initech"))
	park(t, globex, "t-globex", time.Hour, "too large")
	park(t, globex, "t-globex", time.Hour, "too large")
	dead(t, initech, "svc", "orders")
	dead(t, globex, "svc", "orders")
	for name, db := range map[string]*testdb.DB{"acme": acme, "globex": globex, "initech": initech} {
		writeRows(t, db, "t-"+name, 0, 5)
	}
	file := writeFile(t, "targets.txt", fmt.Sprintf("acme %s\nglobex %s\ninitech %s\n", acme.Schema, globex.Schema, initech.Schema))
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_TARGET_METRICS=top:1"), "run")
	base := "http://" + p.HTTPAddr(t)
	require.Len(t, eventIDs(t, c, "t-acme", 5), 5)
	var m string
	waitFor(t, "the figures read after the drain, the chosen target's detail from its read after the scrape that chose it", 30*time.Second, func() bool {
		m = metricsOf(t, base)
		return strings.Contains(m, `pgbox_fleet_targets_read{result="ok"} 3`) && strings.Contains(m, "pgbox_fleet_outbox_unpublished_rows 0") &&
			strings.Contains(m, `pgbox_target_relay_published_total{target="globex"} 5`) &&
			strings.Contains(m, `pgbox_target_outbox_topic_parked_rows{target="globex"`)
	})
	require.Contains(t, m, "pgbox_fleet_outbox_parked_rows 2")
	require.Contains(t, m, "pgbox_fleet_consumer_dead_letter_rows 2")
	require.Contains(t, m, "pgbox_outbox_oldest_unpublished_age_seconds 0")
	require.Contains(t, m, "pgbox_relay_lanes_unowned 0")
	require.Contains(t, m, "pgbox_scrape_database_up 1")
	require.Contains(t, m, "pgbox_scrape_database_snapshot_ok 1")
	require.Contains(t, m, `pgbox_target_outbox_parked_rows{target="globex"} 2`)
	require.Contains(t, m, `pgbox_target_database_up{target="globex"} 1`)
	require.Equal(t, map[string]bool{"globex": true}, targetSeriesIn(m), "top:1: the target with parked rows only")
	// The chosen target's detail per topic, lane and consumer; none of the others'.
	require.Contains(t, m, `pgbox_target_outbox_topic_parked_rows{target="globex",topic="t-globex"} 2`)
	require.Contains(t, m, `pgbox_target_outbox_unpublished_rows_estimated{target="globex"} 0`)
	require.Contains(t, m, `pgbox_target_outbox_lane_oldest_unpublished_age_seconds{lane="0",target="globex"} 0`)
	require.Contains(t, m, `pgbox_target_consumer_topic_dead_letter_rows{consumer="svc",target="globex",topic="orders"} 1`)
	require.NotContains(t, m, `target="acme"`)
	require.NotContains(t, m, `target="initech"`)
	require.Contains(t, m, "pgbox_relay_published_total 15", "the fleet's counters")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// One reader: the console's fleet overview and /metrics show the same
// read of a target (its figures, and when it was read); a listed target
// the relay does not serve (refused) is read for the console only, its
// state saying why. The cleaner counts each served target's passes and
// every pass (a target no longer served stays in the totals), gives each
// topic the margin of the worst served target, and its last passes give
// the targets' inbox windows: the inbox cutoff alert's gauges.
func TestFleetReaderOneRead(t *testing.T) {
	t.Parallel()
	f, err := relay.NewFleet(relay.FleetConfig{Relay: relay.Config{Brokers: []string{"127.0.0.1:1"}}})
	require.NoError(t, err)
	acme := targetSpec{Name: "acme", Schema: "s_acme", DatabaseURL: "db"}
	globex := targetSpec{Name: "globex", Schema: "s_globex", DatabaseURL: "db"}
	fr := &fleetRun{f: f, dbs: map[string]*fleetDB{"db": {url: "db"}}, list: []targetSpec{acme, globex},
		served: map[string]servedTarget{"acme": {spec: acme}, "globex": {spec: globex}}}
	cl := &fleetCleanup{targets: map[string]cleanup.Stats{}}
	r := &fleetReader{fr: fr, cleaner: cl, series: targetSeries{all: true}, last: map[string]targetRead{}}
	cf := &consoleFleet{fr: fr, reader: r}

	at := time.Now().Add(-time.Minute)
	snap := &inspect.Snapshot{Time: at}
	snap.Outbox.Parked = 3
	snap.Inbox = []inspect.InboxTopic{{Consumer: "svc", Topic: "orders", OldestAge: 9000}}
	r.last["acme"] = targetRead{state: stateOK, snap: snap, at: at}
	r.last["globex"] = targetRead{state: stateBehind, detail: "never migrated: run `relay migrate up`", at: at}

	// Two passes on each; then globex is no longer served.
	pass := func(margin time.Duration) cleanup.Report {
		return cleanup.Report{Start: at, Deleted: 2, Topics: []cleanup.TopicReport{
			{Topic: "orders", Timed: true, Window: time.Hour, Deleted: 2, Margin: margin}}}
	}
	both := []targetPool{{spec: acme}, {spec: globex}}
	cl.record(both, []cleanup.Report{pass(-2 * time.Hour), pass(10 * time.Minute)}, []error{nil, errors.New("pgbox_consumer_attempts missing")})
	cl.record(both, []cleanup.Report{{Locked: true}, pass(-3 * time.Hour)}, []error{nil, nil})
	fr.served = map[string]servedTarget{"acme": {spec: acme}}
	cl.record([]targetPool{{spec: acme}}, []cleanup.Report{{Locked: true}}, []error{nil})

	sums := cf.Summaries()
	require.Equal(t, console.SummaryOK, sums["acme"].State)
	require.EqualValues(t, 3, sums["acme"].Figures.Parked)
	require.Equal(t, at, sums["acme"].At)
	require.Equal(t, console.SummaryBehind, sums["globex"].State, "a refused target's figures say why")
	ft := r.FleetTargets()
	require.Len(t, ft, 1, "/metrics: the served targets only")
	require.Same(t, snap, ft[0].Snapshot, "the console's read")
	require.EqualValues(t, 1, ft[0].Cleanup.Passes)
	require.EqualValues(t, 2, ft[0].Cleanup.PassesLocked)

	col, err := pgboxprom.New(pgboxprom.Config{Fleet: r, FleetCleaner: cl})
	require.NoError(t, err)
	m := promtest.Samples(t, col)
	promtest.Require(t, m, map[string]float64{
		"pgbox_cleanup_passes_total":                                        3,
		"pgbox_cleanup_passes_locked_total":                                 2,
		"pgbox_cleanup_pass_errors_total":                                   1,
		"pgbox_cleanup_deleted_total":                                       6,
		`pgbox_cleanup_inbox_deleted_total{topic="orders"}`:                 6,
		`pgbox_inbox_retention_margin_seconds{topic="orders"}`:              -7200,
		`pgbox_inbox_oldest_key_age_seconds{consumer="svc",topic="orders"}`: 9000,
		`pgbox_inbox_cleanup_window_seconds{consumer="svc",topic="orders"}`: 3600,
		`pgbox_target_cleanup_passes_total{target="acme"}`:                  1,
		`pgbox_target_inbox_retention_margin_seconds{target="acme"}`:        -7200,
		`pgbox_target_outbox_parked_rows{target="acme"}`:                    3,
	})
}

// The reader and the console's pages share one targetDB per target, and
// so one set of connection slots per pool.
func TestTargetDBShared(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	acme := targetSpec{Name: "acme", Schema: db.Schema, DatabaseURL: "db"}
	fr := &fleetRun{dbs: map[string]*fleetDB{"db": {url: "db", pool: db.Pool}}, list: []targetSpec{acme}}
	r := &fleetReader{fr: fr, dbs: newTargetDBs(fr), last: map[string]targetRead{}}
	cf := &consoleFleet{fr: fr, reader: r}
	got, err := cf.DB("acme")
	require.NoError(t, err)
	rd := r.read(t.Context(), fr.listedPools()[0], inspect.Config{}, &horizons{by: map[*pgxpool.Pool]*horizonRead{}}, false)
	require.Equal(t, stateOK, rd.state, rd.detail)
	again, err := r.dbs.get(acme, db.Pool)
	require.NoError(t, err)
	require.Same(t, got, again)
	require.Equal(t, readerConns(db.Pool.Config().MaxConns), cap(again.slots))
	_, err = cf.DB("nobody")
	require.ErrorIs(t, err, console.ErrUnknownTarget)
}

// A round of the reader reads each database's xmin horizon once for all
// of its targets (horizonShare), and every target's snapshot shows it: the
// session holding the horizon is counted in each.
func TestFleetReaderSharesHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var specs []targetSpec
	var pool *pgxpool.Pool
	for i := range 3 {
		db := testdb.New(t)
		if pool == nil {
			pool = db.Pool
		}
		specs = append(specs, targetSpec{Name: "t" + strconv.Itoa(i), Schema: db.Schema, DatabaseURL: "db"})
	}
	holder, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	fr := &fleetRun{dbs: map[string]*fleetDB{"db": {url: "db", pool: pool}}, list: specs}
	r := &fleetReader{fr: fr, dbs: newTargetDBs(fr), last: map[string]targetRead{}}
	hz := &horizons{by: map[*pgxpool.Pool]*horizonRead{}}
	for _, tp := range fr.listedPools() {
		rd := r.read(ctx, tp, inspect.Config{HorizonList: 1000}, hz, false)
		require.Equal(t, stateOK, rd.state, rd.detail)
		held := false // (the reader keeps the sums per kind, not the list: trimSnapshot)
		for _, k := range rd.snap.Horizon.Kinds {
			held = held || (k.Kind == inspect.HolderSession && k.Holders >= 1)
		}
		require.True(t, held, "target %s: the session holding the horizon is not in it: %+v", tp.spec.Name, rd.snap.Horizon)
	}
	require.EqualValues(t, 1, hz.reads.Load(), "one read of the database's horizon for its three targets")
}

// stuckDB is an inspect.DB whose Begin waits for its context to end.
type stuckDB struct{ begins atomic.Int64 }

func (d *stuckDB) Begin(ctx context.Context) (pgx.Tx, error) {
	d.begins.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// A horizon read that hangs costs the database's other targets nothing
// beyond their own deadline, and is tried once (the review): a target
// waiting for another's shared read gives up at its own deadline, a read
// is bounded by horizonReadTimeout, and its failure is kept for
// horizonShare, so the targets after it read their own horizon at once
// (get returns nil) instead of each waiting for a read of its own.
func TestFleetReaderHorizonReadHangs(t *testing.T) {
	t.Parallel()
	hz := &horizons{by: map[*pgxpool.Pool]*horizonRead{}}
	pool := &pgxpool.Pool{} // a key only: stuckDB does the reads
	db := &stuckDB{}
	first := make(chan *inspect.Horizon, 1)
	began := time.Now()
	go func() { first <- hz.get(t.Context(), pool, db, inspect.Config{}) }()
	for db.begins.Load() == 0 {
		time.Sleep(time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.Nil(t, hz.get(ctx, pool, db, inspect.Config{}))
	require.Less(t, time.Since(start), 600*time.Millisecond, "a waiter gave up only after the hung read ended, not at its own deadline")

	require.Nil(t, <-first)
	took := time.Since(began)
	require.GreaterOrEqual(t, took, horizonReadTimeout)
	require.Less(t, took, horizonReadTimeout+time.Second, "the shared read is bounded by horizonReadTimeout")

	start = time.Now()
	require.Nil(t, hz.get(t.Context(), pool, db, inspect.Config{}), "the failure is kept")
	require.Less(t, time.Since(start), 100*time.Millisecond)
	require.EqualValues(t, 1, hz.reads.Load(), "one read tried in the round, not one per target")
	require.EqualValues(t, 1, db.begins.Load())
}

// A round reads again only the targets that may have changed: a clean
// target (nothing unpublished, parked or dead, no lane held) whose tables'
// statistics have not moved is carried over, its figures kept and its
// time moved on; a target with a backlog is read every round; a row
// written to a clean target is read once the statistics show it; and a
// target is read in full at least every carryMax rounds.
func TestFleetReaderCarriesOverUnchangedTargets(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var specs []targetSpec
	var dbs []*testdb.DB
	for i := range 3 {
		db := testdb.New(t)
		dbs = append(dbs, db)
		specs = append(specs, targetSpec{Name: "t" + strconv.Itoa(i), Schema: db.Schema, DatabaseURL: "db"})
	}
	pool := dbs[0].Pool
	write := func(db *testdb.DB) {
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return outbox.Write(ctx, tx, outbox.Message{Topic: "w", Value: []byte("x")})
		}))
		// The statistics of the write reach pg_stat_user_tables once its
		// backend sends them: wait for them, as the reader would.
		c, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		_, err = c.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var n int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'pgbox_outbox'`, db.Schema).Scan(&n))
			return n > 0
		}, 10*time.Second, 20*time.Millisecond, "the write's statistics")
	}
	write(dbs[2]) // t2 has a backlog from the start

	logs := &testutil.SyncBuffer{}
	fr := &fleetRun{dbs: map[string]*fleetDB{"db": {url: "db", pool: pool}}, list: specs}
	r := &fleetReader{fr: fr, dbs: newTargetDBs(fr), last: map[string]targetRead{}, every: time.Hour, limit: 2,
		log: newLogger(logs, "text", "debug")}
	round := func() (full, carried int64) {
		f0, c0 := r.fullReads.Load(), r.carried.Load()
		r.round(ctx)
		return r.fullReads.Load() - f0, r.carried.Load() - c0
	}
	unpublished := func(name string) int64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		rd := r.last[name]
		require.Equal(t, stateOK, rd.state, "%s: %s", name, rd.detail)
		require.NotNil(t, rd.snap, name)
		return rd.snap.Outbox.Unpublished
	}

	full, carried := round()
	require.Equal(t, [2]int64{3, 0}, [2]int64{full, carried}, "the first round reads every target")
	require.Equal(t, []int64{0, 0, 1}, []int64{unpublished("t0"), unpublished("t1"), unpublished("t2")})
	r.mu.Lock()
	before := r.last["t0"]
	r.mu.Unlock()
	require.NotEmpty(t, before.sig, "the statistics were read")

	full, carried = round()
	require.Equal(t, [2]int64{1, 2}, [2]int64{full, carried}, "the clean targets are carried over, the one with a backlog read")
	r.mu.Lock()
	after := r.last["t0"]
	r.mu.Unlock()
	require.True(t, after.at.After(before.at), "a carried-over read is stamped with the round's time")
	require.True(t, after.snap.Time.After(before.snap.Time), "and its snapshot's time moved on")
	require.Equal(t, before.full, after.full, "but it was last read in full at the first round")

	write(dbs[0])
	full, carried = round()
	require.Equal(t, [2]int64{2, 1}, [2]int64{full, carried}, "the target written to is read again")
	require.Equal(t, []int64{1, 0, 1}, []int64{unpublished("t0"), unpublished("t1"), unpublished("t2")})

	// carryMax rounds of the refresh after its last full read, a target
	// is read in full whatever its statistics say.
	r.every = time.Millisecond
	time.Sleep(carryMax * time.Millisecond)
	full, carried = round()
	require.Equal(t, [2]int64{3, 0}, [2]int64{full, carried}, "every target read in full after carryMax rounds")
	require.Contains(t, logs.String(), "figures' round")
}

// A carried-over read is the last one moved on: its inbox ages grow by the
// time since, and its horizon is the round's (a round that could not read
// it reads the target in full). A target whose detail /metrics exports,
// or whose statistics moved, is read.
func TestFleetReaderCarriedOverIsCurrent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	in := 100.0
	window, margin := 3600.0, 3500.0
	cut := time.Unix(1000, 0)
	s := &inspect.Snapshot{Time: time.Unix(5000, 0), Inbox: []inspect.InboxTopic{{Consumer: "c", Topic: "t", OldestAge: in, Window: &window, Cutoff: &cut, Margin: &margin}}}
	a := aged(s, 10*time.Second)
	require.Equal(t, time.Unix(5010, 0), a.Time)
	require.Equal(t, 110.0, a.Inbox[0].OldestAge)
	require.Equal(t, time.Unix(1010, 0), *a.Inbox[0].Cutoff)
	require.Equal(t, 3490.0, *a.Inbox[0].Margin)
	require.Equal(t, 100.0, s.Inbox[0].OldestAge, "the last read is not written")
	require.Equal(t, 3500.0, *s.Inbox[0].Margin, "the last read is not written")

	db, other := testdb.New(t), testdb.New(t)
	specs := []targetSpec{{Name: "idle", Schema: db.Schema, DatabaseURL: "db"}, {Name: "chosen", Schema: other.Schema, DatabaseURL: "db"}}
	fr := &fleetRun{dbs: map[string]*fleetDB{"db": {url: "db", pool: db.Pool}}, list: specs}
	r := &fleetReader{fr: fr, dbs: newTargetDBs(fr), last: map[string]targetRead{}, every: time.Hour, limit: 1,
		log: newLogger(&testutil.SyncBuffer{}, "text", "debug"), series: targetSeries{top: 1}, chosen: map[string]bool{"chosen": true}}
	r.round(ctx)
	require.EqualValues(t, 2, r.fullReads.Load())
	r.round(ctx)
	require.EqualValues(t, 3, r.fullReads.Load(), "the chosen target read again")
	require.EqualValues(t, 1, r.carried.Load(), "the idle one carried over")

	// The round's horizon, whatever the last full read saw.
	tp := fr.listedPools()[0]
	r.mu.Lock()
	sig := r.last["idle"].sig
	r.mu.Unlock()
	age := 42.0
	round := inspect.Horizon{Kinds: []inspect.HorizonKind{{Kind: inspect.HolderSession, Holders: 7, AgeSeconds: &age}}}
	hz := &horizons{by: map[*pgxpool.Pool]*horizonRead{db.Pool: {turn: make(chan struct{}, 1), h: &round, at: time.Now()}}}
	rd, ok := r.carryOver(ctx, tp, sig, inspect.Config{}, hz, false)
	require.True(t, ok, "carried over")
	require.Equal(t, round.Kinds, rd.snap.Horizon.Kinds, "the round's horizon")
	_, ok = r.carryOver(ctx, tp, sig+"x", inspect.Config{}, hz, false)
	require.False(t, ok, "statistics moved: read")
	_, ok = r.carryOver(ctx, tp, sig, inspect.Config{}, hz, true)
	require.False(t, ok, "detail exported: read")
	hz.by[db.Pool].h = nil // the round could not read the horizon
	_, ok = r.carryOver(ctx, tp, sig, inspect.Config{}, hz, false)
	require.False(t, ok, "no horizon this round: read in full")
}
