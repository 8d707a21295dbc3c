package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgbox/pgbox/integration_test/internal/harness"
	"github.com/pgbox/pgbox/migrations"
)

// Phases of the upgrade run: orders written in total by the end of each,
// and their pace (orders per second). The first phase's pace keeps orders
// flowing while every process is replaced.
const (
	upgradeEvents      = 3000
	upgradeRate        = 30
	rollbackEvents     = 4000
	rollbackRate       = 100
	upgradeProgressMax = 2 * time.Minute
)

// TestUpgrade upgrades the chain from the previous release to this tree
// under load, as docs/upgrading.md tells an operator to: the relay and the
// writer and consumer (chaosproc) built from the upgrade baseline
// CHANGELOG.md names run on the baseline's schema; today's binaries refuse
// that schema; today's `relay migrate up` runs while the old binaries work;
// then each relay, the writer and each consumer is killed (SIGKILL) and
// started again as today's build, one at a time, with progress after each.
// Then today's `relay migrate down` takes the schema back to the
// baseline's, and the baseline's binaries run on it again. Orders flow
// throughout, and the verifier finds no event lost, no duplicate effect,
// no per-key order inversion, no dead letter and no parked row.
//
// It runs in `make upgrade` (which .ci/run runs after `make test`), not in
// `make test`: it builds the baseline from the clone's history with git
// worktree, and fails when the clone lacks it (a shallow clone).
func TestUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("upgrade run skipped in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	logf := func(f string, a ...any) { fmt.Printf("upgrade: "+f+"\n", a...) }

	commit, err := harness.ChangelogBaseline()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	race := os.Getenv(envRace) == "1"
	logf("building the baseline %s (git worktree) and this tree", commit)
	old, err := harness.BuildBaseline(ctx, commit, filepath.Join(dir, "baseline"), race)
	if errors.Is(err, harness.ErrNoBaseline) {
		t.Fatalf("\n\n*** THE UPGRADE TEST CANNOT RUN: %v ***\n\n", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	now, err := harness.Build(ctx, filepath.Join(dir, "today"), race)
	if err != nil {
		t.Fatal(err)
	}
	newest, err := harness.NewestMigration(migrations.FS())
	if err != nil {
		t.Fatal(err)
	}
	logf("baseline schema %d, this tree's %d", old.Schema, newest)

	w, err := harness.NewWorld(ctx, harness.Options{Bin: old.Bin, Race: race, Logf: logf})
	if err != nil {
		t.Fatalf("start the chain on the baseline's binaries: %v", err)
	}
	u := &upgrade{t: t, ctx: ctx, w: w, old: old, now: now, newest: newest, logf: logf}
	defer func() { u.close() }()
	u.run()
}

type upgrade struct {
	t      *testing.T
	ctx    context.Context
	w      *harness.World
	old    *harness.Baseline
	now    harness.Binaries
	newest int64
	logf   func(string, ...any)
}

func (u *upgrade) close() {
	keep := u.t.Failed() || os.Getenv(envKeep) == "1"
	u.w.Close(keep)
	if keep {
		fmt.Printf("upgrade: logs and data kept in %s\n", u.w.Dir)
	}
}

func (u *upgrade) fatalf(format string, args ...any) {
	u.t.Helper()
	u.t.Fatalf(format+"\nlogs: %v", append(args, u.w.LogPaths())...)
}

func (u *upgrade) run() {
	u.t.Helper()
	w := u.w
	u.requireSchema(u.old.Schema)
	u.refuseOldSchema()

	// Yesterday's binaries on yesterday's schema, under load.
	if err := w.StartOrders(upgradeEvents, upgradeRate, 1); err != nil {
		u.fatalf("start orders: %v", err)
	}
	u.progress("the baseline's binaries on the baseline's schema")

	// Today's `relay migrate up` while they run; they keep working.
	for _, db := range []string{harness.OrdersDB, harness.PaymentsDB} {
		u.relay(u.now.Relay, "migrate", "up", "--database-url", w.PG.URL(db))
	}
	u.requireSchema(u.newest)
	u.progress("the baseline's binaries on this tree's schema")

	// Replace each process by today's build, one at a time, by killing it.
	w.Bin = u.now // StartOrders runs today's writer from here on
	u.replace(w.Orders, u.now.Proc)
	for _, p := range w.Relays {
		u.replace(p, u.now.Relay)
	}
	for _, p := range w.Consumers {
		u.replace(p, u.now.Proc)
	}
	u.drainAndVerify(upgradeEvents, "after the upgrade")

	// Back down to the baseline's schema, and the baseline's binaries again.
	u.stopServices()
	u.migrateDown()
	u.requireSchema(u.old.Schema)
	w.Bin = u.old.Bin
	u.startServices(u.old.Bin)
	if err := w.StartOrders(rollbackEvents, rollbackRate, 2); err != nil {
		u.fatalf("start orders: %v", err)
	}
	u.drainAndVerify(rollbackEvents, "after migrate down, on the baseline's binaries")
}

// refuseOldSchema: today's relay, writer and consumer started against the
// baseline's schema exit at once, saying to run `relay migrate up`.
func (u *upgrade) refuseOldSchema() {
	u.t.Helper()
	if u.old.Schema == u.newest {
		u.logf("no migration since the baseline: nothing for today's binaries to refuse (cmd/relay.TestRefuseOlderSchema checks the refusal)")
		return
	}
	w := u.w
	for _, c := range []struct {
		name string
		bin  string
		args []string
	}{
		{"relay run", u.now.Relay, []string{"run", "--database-url", w.PG.URL(harness.OrdersDB), "--kafka-brokers", w.Brokers[0], "--http-addr", ""}},
		{"orders (writer)", u.now.Proc, []string{"orders", "--db", w.PG.URL(harness.OrdersDB), "--events", "1"}},
		{"payments (consumer)", u.now.Proc, []string{"payments", "--db", w.PG.URL(harness.PaymentsDB), "--brokers", w.Brokers[0],
			"--group", "refused-" + harness.Group, "--member", "refused"}},
	} {
		ctx, cancel := context.WithTimeout(u.ctx, time.Minute)
		out, err := exec.CommandContext(ctx, c.bin, c.args...).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "run `relay migrate up`") {
			u.fatalf("today's %s on the baseline's schema %d: want a refusal saying \"run `relay migrate up`\", got %v:\n%s", c.name, u.old.Schema, err, out)
		}
		u.logf("today's %s refuses schema %d: %s", c.name, u.old.Schema, lastLine(string(out)))
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// replace kills p (SIGKILL) and starts it again from bin, then waits for
// the chain to make progress.
func (u *upgrade) replace(p *harness.Proc, bin string) {
	u.t.Helper()
	if !p.Running() {
		u.fatalf("%s exited by itself before its replacement (%v)", p.Name, p.ExitErr())
	}
	if err := p.Kill(); err != nil {
		u.fatalf("kill %s: %v", p.Name, err)
	}
	p.Path = bin
	if err := p.Start(); err != nil {
		u.fatalf("start today's %s: %v", p.Name, err)
	}
	u.progress("today's " + p.Name + " replaced the baseline's")
}

func (u *upgrade) progress(what string) {
	u.t.Helper()
	took, err := u.w.WaitProgress(u.ctx, upgradeProgressMax)
	if err != nil {
		u.fatalf("%s: %v", what, err)
	}
	for _, p := range append(append([]*harness.Proc{u.w.Broker}, u.w.Relays...), u.w.Consumers...) {
		if !p.Running() {
			u.fatalf("%s: %s exited by itself (%v)", what, p.Name, p.ExitErr())
		}
	}
	u.logf("%s: effects and downstream records advancing (after %v)", what, took.Round(time.Millisecond))
}

func (u *upgrade) drainAndVerify(events int64, when string) {
	u.t.Helper()
	exits, err := u.w.WaitDrained(u.ctx, events, 5*time.Minute)
	if err != nil {
		u.fatalf("%s: %v", when, err)
	}
	if len(exits) > 0 {
		u.fatalf("%s: processes exited by themselves: %v", when, exits)
	}
	v, err := u.w.Verify(u.ctx)
	if err != nil {
		u.fatalf("%s: verify: %v", when, err)
	}
	u.logf("%s: %d orders, %d effects, %d downstream records (%d duplicate records), lost %d, duplicate effects %d, inversions %d, dead letters %d, parked %d",
		when, v.Produced, v.Effects, v.DownstreamRecs, v.DuplicateRecords, v.Lost, v.DuplicateEffects, v.OrderInversions, v.DeadLetters, v.Parked)
	if !v.OK() || v.Produced != events {
		u.fatalf("%s: a guarantee broke (%d orders, want %d): %v", when, v.Produced, events, v.First)
	}
}

func (u *upgrade) stopServices() {
	u.t.Helper()
	for _, p := range append(append([]*harness.Proc{}, u.w.Relays...), u.w.Consumers...) {
		if err := p.Term(10 * time.Second); err != nil {
			u.fatalf("stop %s: %v", p.Name, err)
		}
	}
}

func (u *upgrade) startServices(bin harness.Binaries) {
	u.t.Helper()
	for _, p := range u.w.Relays {
		p.Path = bin.Relay
	}
	for _, p := range u.w.Consumers {
		p.Path = bin.Proc
	}
	for _, p := range append(append([]*harness.Proc{}, u.w.Relays...), u.w.Consumers...) {
		if err := p.Start(); err != nil {
			u.fatalf("start %s: %v", p.Name, err)
		}
	}
}

// migrateDown runs today's `relay migrate down` until each database is at
// the baseline's schema.
func (u *upgrade) migrateDown() {
	u.t.Helper()
	for _, db := range []string{harness.OrdersDB, harness.PaymentsDB} {
		for {
			v, err := u.w.SchemaVersion(u.ctx, db)
			if err != nil {
				u.fatalf("%v", err)
			}
			if v <= u.old.Schema {
				break
			}
			out := u.relay(u.now.Relay, "migrate", "down", "--yes", "--database-url", u.w.PG.URL(db))
			u.logf("migrate down on %s from %d: %s", db, v, lastLine(out))
		}
	}
}

// requireSchema checks both databases are at schema version v.
func (u *upgrade) requireSchema(v int64) {
	u.t.Helper()
	for _, db := range []string{harness.OrdersDB, harness.PaymentsDB} {
		got, err := u.w.SchemaVersion(u.ctx, db)
		if err != nil {
			u.fatalf("%v", err)
		}
		if got != v {
			u.fatalf("database %s is at schema %d, want %d", db, got, v)
		}
	}
	u.logf("both databases at schema %s", strconv.FormatInt(v, 10))
}

// relay runs a relay binary's one-shot command and returns its output.
func (u *upgrade) relay(bin string, args ...string) string {
	u.t.Helper()
	out, err := exec.CommandContext(u.ctx, bin, args...).CombinedOutput()
	if err != nil {
		u.fatalf("relay %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
