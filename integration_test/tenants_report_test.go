package integration_test

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// tenantsReport is TestTenants's result.
type tenantsReport struct {
	Scale      tenantsScale
	Started    time.Time
	Commit     string
	Postgres   string
	Statements bool // pg_stat_statements is there
	Migrate    time.Duration
	One        procSample // the binary serving a one-line list, idle
	Idle       idleResult
	Base       tenantsSide // plain single-target relay
	Fleet      tenantsSide // the fleet relay over every target
	// Added is the drain of a target added to the running fleet (the list
	// re-read on SIGHUP) while every other target idles.
	Added      drainResult
	Written    int64
	Published  int64
	Duplicates int64
	Checked    int64 // records whose topic was checked against their tenant
	Lost       string
	// Unpublished rows were still in the outboxes when the run ended
	// (committed, not on Kafka: waiting, not lost).
	Unpublished int64
	Misrouted   []string
	LoadStart   string
	LoadEnd     string
	// Settings are the PGBOX_* variables of the environment, which the
	// relay processes read (a flag the scenario passes beats them).
	Settings []string

	httpAddr string // the running relay's /metrics
}

// tenantsSide is one relay's drain and active phase.
type tenantsSide struct {
	Drain  drainResult
	Active activeResult
}

func (r *tenantsReport) print(w io.Writer) { fmt.Fprint(w, r.markdown()) }

func mib(b int64) string {
	if b < 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

func ratio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func drainRate(d drainResult) float64 {
	if d.Took <= 0 {
		return 0
	}
	return float64(d.Rows) / d.Took.Seconds()
}

func (r *tenantsReport) markdown() string {
	sc, id := r.Scale, r.Idle
	var b strings.Builder
	n := sc.targets()
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Many tenants, one relay: the scale table\n\n")
	p("`make tenants` (integration_test.TestTenants, issue 35) wrote this file. ")
	p("Measured %s on `%s`, PostgreSQL %s, %d CPUs shared with other work (load average 1/5/15 min: %s at the start, %s at the end).\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Commit, r.Postgres, runtime.NumCPU(), r.LoadStart, r.LoadEnd)
	p("**The fleet**: one `relay run --targets FILE --db-conn-budget %d` process serving %d targets: %d schemas in one database plus %d databases × %d schemas ",
		sc.Budget, n, sc.Schemas, sc.DBs, sc.DBSchemas)
	p("(%d targets migrated with `relay migrate up --targets` in %v). ", n+1, r.Migrate.Round(time.Second))
	p("**The baseline**: a plain `relay run --database-url … --schema solo` on one schema of the large database. ")
	settings := "default settings otherwise"
	if len(r.Settings) > 0 {
		settings = "default settings otherwise, but for these from the environment: `" + strings.Join(r.Settings, "`, `") + "`"
	}
	p("Both run with %s, on a private PostgreSQL cluster and a kfake broker process; one ran at a time.\n\n", settings)

	p("| phase | figure | fleet | baseline | fleet / baseline | load average |\n|---|---|---|---|---|---|\n")
	idleS := id.For.Seconds()
	perTarget := func(x int64) string {
		if x < 0 || idleS == 0 {
			return "—"
		}
		return fmt.Sprintf("%.3f", float64(x)/idleS/float64(id.Targets))
	}
	idlePhase := fmt.Sprintf("idle: %d targets, %v", id.Targets, id.For.Round(time.Second))
	p("| %s | transactions/s per idle target (pg_stat_database) | %s (%.1f/s in all) | | | %s |\n", idlePhase, perTarget(id.Xacts), float64(id.Xacts)/max(idleS, 1e-9), id.Load)
	if r.Statements {
		p("| | statements/s per idle target (pg_stat_statements) | %s (%.1f/s in all) | | | |\n", perTarget(id.Calls), float64(id.Calls)/max(idleS, 1e-9))
	}
	p("| | connections the relay holds (pg_stat_activity, pgbox-relay) | %d (%d databases; at most %d in one) | | | |\n", id.Conns, sc.DBs+1, id.ConnsByDB)
	p("| | relay CPU | %.1f%% of a core | | | |\n", float64(id.CPUTicks)/clockTicks/max(idleS, 1e-9)*100)
	p("| | relay RSS | %s | %s (one target) | | |\n", mib(id.Proc.RSS), mib(r.One.RSS))
	p("| | relay Go heap in use (go_memstats_heap_alloc_bytes) | %s | %s (one target) | | |\n", mib(id.Proc.Heap), mib(r.One.Heap))
	p("| | goroutines | %d | %d (one target) | | |\n", id.Proc.Goroutines, r.One.Goroutines)
	p("| | targets running (pgbox_relay_targets) | %d of %d | | | |\n", id.Running, id.Targets)
	p("| | targets dormant at the end (lanes given up; `--dormant-after %v`) | %d of %d | | | |\n", sc.Dormant, id.Dormant, id.Targets)
	if n > 1 {
		p("| memory per target | RSS (fleet − one target) / %d | %s | | | |\n", n-1, kib(float64(id.Proc.RSS-r.One.RSS)/float64(n-1)))
		if id.Proc.Heap >= 0 && r.One.Heap >= 0 {
			p("| | Go heap (fleet − one target) / %d | %s | | | |\n", n-1, kib(float64(id.Proc.Heap-r.One.Heap)/float64(n-1)))
		}
	}
	fa, ba := r.Fleet.Active, r.Base.Active
	act := fmt.Sprintf("active: %d tx/s, %v, Notify", sc.Rate, sc.ActiveFor)
	p("| %s | targets written to | %d (the other %d idle) | 1 | | %s / %s |\n", act, fa.Targets, n-fa.Targets, fa.Load, ba.Load)
	p("| | writer transactions/s (measured window) | %.0f | %.0f | | |\n", fa.Rate, ba.Rate)
	if fa.Late > 0 || ba.Late > 0 {
		p("| | events not on Kafka %v after the writers stopped (left out of the latencies) | %d | %d | | |\n", sc.Drain, fa.Late, ba.Late)
	}
	p("| | commit→Kafka p50 | %s | %s | %s | |\n", ms(fa.P50), ms(ba.P50), ratio(float64(fa.P50), float64(ba.P50)))
	p("| | commit→Kafka p99 (goal: fleet ≤ 2× baseline) | %s | %s | %s | |\n", ms(fa.P99), ms(ba.P99), ratio(float64(fa.P99), float64(ba.P99)))
	p("| | commit→record batch built (the record's timestamp) p50 / p99 | %s / %s | %s / %s | | |\n", ms(fa.SentP50), ms(fa.SentP99), ms(ba.SentP50), ms(ba.SentP99))
	p("| | commit→Kafka max | %s | %s | %s | |\n", ms(fa.Max), ms(ba.Max), ratio(float64(fa.Max), float64(ba.Max)))
	p("| | relay CPU | %.0f%% of a core | %.0f%% of a core | %s | |\n", fa.CPU*100, ba.CPU*100, ratio(fa.CPU, ba.CPU))
	p("| | the machine's CPUs busy (every process: PostgreSQL, the writers, the broker, the relay) | %.0f%% of %d | %.0f%% of %d | | |\n", fa.Busy*100, runtime.NumCPU(), ba.Busy*100, runtime.NumCPU())
	p("| | relay RSS | %s | %s | | |\n", mib(fa.Proc.RSS), mib(ba.Proc.RSS))
	fd, bd := r.Fleet.Drain, r.Base.Drain
	drainPhase := fmt.Sprintf("drain: %d rows in one target", fd.Rows)
	took := func(d drainResult) string {
		if d.Took <= 0 {
			return fmt.Sprintf("not drained in %v (%d of %d arrived)", sc.Drain, d.Arrived, d.Rows)
		}
		return fmt.Sprintf("%.2f s", d.Took.Seconds())
	}
	p("| %s | process start → last record on Kafka | %s (beside %d idle targets) | %s | %s | %s / %s |\n", drainPhase, took(fd), n-1, took(bd),
		ratio(fd.Took.Seconds(), bd.Took.Seconds()), fd.Load, bd.Load)
	p("| | rows/s (goal: fleet ≥ 0.9× baseline) | %.0f | %.0f | %s | |\n", drainRate(fd), drainRate(bd), ratio(drainRate(fd), drainRate(bd)))
	allUp := "not seen while draining"
	if fd.AllUp > 0 {
		allUp = fmt.Sprintf("%.2f s", fd.AllUp.Seconds())
	}
	p("| | process start → all %d targets running (/metrics) | %s | | | |\n", n, allUp)
	ad := r.Added
	p("| drain: %d rows in a target added to the running fleet | list re-read (SIGHUP) → last record on Kafka | %s (the %d others idle) | %s (process start) | %s | %s / %s |\n",
		ad.Rows, took(ad), n, took(bd), ratio(ad.Took.Seconds(), bd.Took.Seconds()), ad.Load, bd.Load)
	p("| | rows/s (goal: fleet ≥ 0.9× baseline) | %.0f | %.0f | %s | |\n", drainRate(ad), drainRate(bd), ratio(drainRate(ad), drainRate(bd)))

	p("\nCorrectness (the only pass/fail): %d events committed, %d distinct arrived, %d duplicate records (at least once allows them), %d records checked: topic = the tenant the value names",
		r.Written, r.Published, r.Duplicates, r.Checked)
	if len(r.Misrouted) == 0 {
		p(", none misrouted")
	} else {
		p(".\n\n**MISROUTED:** %s", strings.Join(r.Misrouted, "; "))
	}
	if r.Unpublished > 0 {
		p("; %d rows were still unpublished in their outboxes when the run ended (waiting, not lost)", r.Unpublished)
	}
	if r.Lost == "" {
		p("; none lost.\n")
	} else {
		p(".\n\n**LOST:** %s\n", r.Lost)
	}

	if len(id.Top) > 0 {
		p("\nThe statements the idle fleet ran most (pg_stat_statements, calls in the %v window, summed over the targets", id.For.Round(time.Second))
		if id.Evicted > 0 {
			p("; %d entries were evicted meanwhile, so these are lower bounds", id.Evicted)
		}
		p("):\n\n| calls/s | per target per s | statement |\n|---|---|---|\n")
		for _, st := range id.Top {
			p("| %.1f | %.3f | `%s` |\n", float64(st.Calls)/max(idleS, 1e-9), float64(st.Calls)/max(idleS, 1e-9)/float64(id.Targets), stmtText(st.Query))
		}
	}
	for _, ph := range []struct {
		name string
		a    activeResult
	}{{"fleet", r.Fleet.Active}, {"baseline", r.Base.Active}} {
		if len(ph.a.Top) == 0 {
			continue
		}
		p("\nThe statements that took the server most time in the active phase, %s (pg_stat_statements, the writers' included):\n\n| calls/s | server ms/s | µs a call | planning µs a call | statement |\n|---|---|---|---|---|\n", ph.name)
		for _, st := range ph.a.Top {
			s := max(ph.a.For.Seconds(), 1e-9)
			p("| %.1f | %.1f | %.1f | %.1f | `%s` |\n", float64(st.Calls)/s, float64(st.Exec.Microseconds())/1000/s,
				float64(st.Exec.Microseconds())/float64(max(st.Calls, 1)), float64(st.Plan.Microseconds())/float64(max(st.Calls, 1)), stmtText(st.Query))
		}
	}
	p(`
How each figure is taken:

- **Idle**: after the fleet drained its backlog, a %v warm-up and the fleet's --dormant-after plus 10 s (the steady state of idle targets: dormant), nothing is written for %v. Transactions are pg_stat_database's xact_commit + xact_rollback over the scenario's databases only (the sampler connects to another); statements are pg_stat_statements calls there. Both divided by the seconds and the targets. Connections are the pgbox-relay sessions in pg_stat_activity at the end; CPU is /proc/<pid>/stat utime + stime over the window; RSS is VmRSS; the heap and goroutines come from the relay's /metrics.
- **Memory per target**: the fleet's idle RSS (and heap) minus the same binary's with a one-line target list after the same warm-up, over the other targets. RSS includes what the Go runtime has not returned to the OS, so it moves by a few MiB between runs.
- **Active**: writers commit %d transactions/s, each one outbox row through outbox.Writer with Config.Notify, their search_path set to the target's schema (set_config(..., true)); the target is picked at random among the active ones. The commit time is taken when COMMIT returns, the arrival when a separate consumer (its own Kafka client) receives the record; the value carries the event's sequence number and tenant. The record's timestamp is the time the relay built its record batch (millisecond precision), so commit→record batch built is the relay's share of the latency and the rest is the broker's and the consumer's. The figures cover the events committed in the %v window after a %v warm-up, every one of which arrived. The machine's CPUs busy is /proc/stat over the same window (all but idle and iowait): on a machine near 100%% every process waits for a CPU, and the latencies measure that wait as much as the relay.
- **Drain**: the backlog is written in one INSERT while no relay runs (the fleet's target and the baseline's schema each have theirs). The clock starts just before the relay process starts and stops when the consumer has seen the last of its records: it covers the process's start, the check of every target and, for the fleet, the other targets starting beside it. **Added**: a third backlog, written with the other two, belongs to a target in no list; after the idle phase its line is added to the running fleet's list (the file replaced) and the fleet sent SIGHUP (re-read the list now). The clock starts just before the file is replaced and stops when the consumer has seen the last record: it covers the re-read, the target's check and start beside the idle others (dormant), and the drain. The baseline's figure is its process start, as above.
`, sc.Warmup, sc.Idle, sc.Rate, sc.ActiveFor, sc.Warmup)
	return b.String()
}

// stmtText is a statement's text for a markdown table cell.
func stmtText(q string) string {
	q = strings.ReplaceAll(q, "|", "\\|")
	if len(q) > 120 {
		// Cut between words: half a table name is not a name (the docs'
		// names are checked against the migrations).
		q = q[:strings.LastIndexAny(q[:120], " (,")+1] + "…"
	}
	return q
}

// relaySettings are the PGBOX_* variables of env, sorted, the values of
// those that may hold a secret left out.
func relaySettings(env []string) []string {
	var out []string
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "PGBOX_") {
			continue
		}
		for _, secret := range []string{"URL", "PASSWORD", "SECRET", "SASL", "TOKEN", "KEY"} {
			if strings.Contains(name, secret) {
				value = "…"
			}
		}
		out = append(out, name+"="+value)
	}
	slices.Sort(out)
	return out
}

func TestRelaySettings(t *testing.T) {
	got := relaySettings([]string{"PATH=/bin", "PGBOX_WATCH_RATE=50000", "PGBOX_DATABASE_URL=postgres://u:pw@h/db", "PGBOX_KAFKA_SASL_PASSWORD=pw", "DATABASE_URL=x"})
	want := []string{"PGBOX_DATABASE_URL=…", "PGBOX_KAFKA_SASL_PASSWORD=…", "PGBOX_WATCH_RATE=50000"}
	if !slices.Equal(got, want) {
		t.Fatalf("relaySettings = %q, want %q", got, want)
	}
	if got := relaySettings([]string{"PATH=/bin"}); got != nil {
		t.Fatalf("relaySettings without PGBOX_ = %q, want none", got)
	}
}
