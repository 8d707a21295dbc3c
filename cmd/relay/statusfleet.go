package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/internal/durtext"
	"github.com/pgbox/pgbox/relay"
)

// `relay status` over a target list: one line per target with the figures
// that find the sick tenant, read through inspect.Read (the snapshot
// `relay status` prints for one database), --targets-concurrency targets at
// a time; or, with a target's name, that target's full status.

const statusDoc = `Print the outbox backlog per topic and lane, the oldest unpublished row, parked
rows, lane owners, and inbox keys per consumer and topic. With Kafka brokers
set, each topic's oldest key is compared with its cleanup cutoff.
With a target list (--targets or --targets-query), print one line per target
instead, --targets-concurrency at a time, the worst first: NAME, SCHEMA,
DATABASE, BACKLOG (unpublished rows), OLDEST (the oldest unpublished row's
age), PARKED, DEAD (dead letters), RELAYS (live relay instances), LANES (held
of the lane count), XMIN (how long the database's xmin horizon is held) and
STATE: ok, behind (migrations pending: run ` + "`relay migrate up`" + `), no schema,
unreachable or failed, with the error. It exits 1 when a target is not ok.
The lines read no Kafka. ` + "`relay status NAME`" + ` prints the full status of
the target of that name, as without a list. --json prints either as JSON.`

// Target states of `relay status`, in the order the table sorts them: the
// worst first.
const (
	stateUnreachable = "unreachable"
	stateFailed      = "failed"
	stateNoSchema    = "no_schema"
	stateBehind      = "behind"
	stateOK          = "ok"
)

var stateRank = map[string]int{stateUnreachable: 0, stateFailed: 1, stateNoSchema: 2, stateBehind: 3, stateOK: 4}

// targetLine is one target's line of `relay status` over a target list, and
// its object in the JSON.
type targetLine struct {
	Name     string `json:"name"`
	Schema   string `json:"schema"`
	Database string `json:"database"`
	// State is ok, behind, no_schema, unreachable or failed; Detail says
	// why (empty when ok).
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
	// The figures, when the snapshot could be read (a target behind may
	// still be).
	*TargetFigures
}

// TargetFigures are the snapshot's figures a line shows.
type TargetFigures struct {
	Unpublished          int64    `json:"unpublished"`
	UnpublishedEstimated bool     `json:"unpublished_estimated"`
	OldestAge            *float64 `json:"oldest_unpublished_age_seconds"`
	Parked               int64    `json:"parked"`
	ParkedCapped         bool     `json:"parked_capped,omitempty"`
	DeadLetters          int64    `json:"dead_letters"`
	DeadLettersCapped    bool     `json:"dead_letters_capped,omitempty"`
	RelaysLive           int      `json:"relay_instances_live"`
	// Lanes is the lane table's lane count (0: no relay ever ran), LanesHeld
	// how many of them a relay holds; Dormant that every live relay is
	// dormant (idle, lanes given up until rows come: relay.FleetConfig.DormantAfter).
	Lanes     int  `json:"lanes"`
	LanesHeld int  `json:"lanes_held"`
	Dormant   bool `json:"dormant,omitempty"`
	// The xmin horizon of the target's database (inspect.Horizon).
	HorizonAgeSeconds      *float64 `json:"xmin_horizon_age_seconds"`
	HorizonAgeTransactions int64    `json:"xmin_horizon_age_transactions"`
	HorizonPastBound       bool     `json:"xmin_horizon_past_bound"`
}

func figuresOf(s *inspect.Snapshot) *TargetFigures {
	f := &TargetFigures{
		Unpublished:            s.Outbox.Unpublished,
		UnpublishedEstimated:   s.Outbox.Estimated,
		OldestAge:              s.Outbox.OldestAge,
		Parked:                 s.Outbox.Parked,
		ParkedCapped:           s.Outbox.ParkedCapped,
		DeadLettersCapped:      s.DeadEstimated,
		Lanes:                  len(s.Lanes),
		HorizonAgeSeconds:      s.Horizon.AgeSeconds,
		HorizonAgeTransactions: s.Horizon.AgeTransactions,
		HorizonPastBound:       s.Horizon.Over(),
	}
	for _, d := range s.Dead {
		f.DeadLetters += d.Count
	}
	for _, i := range s.Instances {
		if i.Live {
			f.RelaysLive++
		}
	}
	for _, l := range s.Lanes {
		if l.Held {
			f.LanesHeld++
		}
	}
	f.Dormant = s.DormantOnly()
	return f
}

// statusTargets is `relay status [NAME]` with a target list.
func statusTargets(ctx context.Context, a *app, args []string) error {
	if len(args) > 1 {
		return usageError("status takes at most one argument, the name of a target (got %q)", args)
	}
	list, err := loadTargets(ctx, a)
	if err != nil {
		return err
	}
	if len(args) == 1 {
		i := slices.IndexFunc(list, func(t targetSpec) bool { return t.Name == args[0] })
		if i < 0 {
			return usageError("status: unknown target %q: %s lists %s", args[0], a.opts.Targets.sourceSetting(), knownNames(list))
		}
		return statusOfTarget(ctx, a, list[i])
	}
	if len(list) == 0 && !a.opts.JSON {
		fmt.Fprintf(a.stdout, "no targets: %s lists none\n", a.opts.Targets.sourceSetting())
		return nil
	}
	lines := make([]targetLine, len(list))
	for i, t := range list {
		lines[i] = targetLine{Name: t.display(), Schema: t.Schema, Database: dbconf.RedactDSN(t.DatabaseURL),
			State: stateFailed, Detail: "interrupted before it was read"}
	}
	log := a.log.With("component", "status")
	onTargets(ctx, len(list), a.opts.Targets.EachConcurrency, func(i int) {
		t := list[i]
		state, detail, fig := readTargetLine(ctx, t, log)
		lines[i].State, lines[i].Detail, lines[i].TargetFigures = state, detail, fig
		log.Debug("status: target read", "target", t.Name, "schema", t.Schema, "state", state, "detail", detail)
	})
	sortLines(lines)
	if a.opts.JSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Targets []targetLine `json:"targets"`
		}{lines}); err != nil {
			return err
		}
	} else if err := writeTargetLines(a, lines); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	bad := 0
	for _, l := range lines {
		if l.State != stateOK {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d targets are not ok (see the STATE column)", bad, len(list))
	}
	return nil
}

// knownNames names a list's targets for an error: all of them, or the
// first ten and how many more.
func knownNames(list []targetSpec) string {
	if len(list) == 0 {
		return "no target"
	}
	names := targetNames(list)
	slices.Sort(names)
	const most = 10
	if len(names) > most {
		return fmt.Sprintf("%d targets: %s, … (%d more; `relay targets list` prints them all)", len(names), strings.Join(names[:most], ", "), len(names)-most)
	}
	return fmt.Sprintf("%d: %s", len(names), strings.Join(names, ", "))
}

// statusOfTarget prints one target's full status, as `relay status` does
// for --database-url and --schema.
func statusOfTarget(ctx context.Context, a *app, t targetSpec) error {
	pool, err := openTarget(ctx, t, 2)
	if err != nil {
		return fmt.Errorf("target %q: %w", t.Name, err)
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool, t); err != nil {
		return fmt.Errorf("target %q: %w", t.Name, err)
	}
	if err := printStatus(ctx, a, pool); err != nil {
		return fmt.Errorf("target %q (schema %s): %s", t.Name, t.Schema, dbconf.RedactErr(err, t.DatabaseURL))
	}
	return nil
}

// requireSchema refuses a target whose schema does not exist (PostgreSQL
// would skip it on the search_path, and the error would say the tables are
// missing).
func requireSchema(ctx context.Context, pool *pgxpool.Pool, t targetSpec) error {
	var exists bool
	if err := pool.QueryRow(ctx, schemaExistsSQL, t.Schema).Scan(&exists); err != nil {
		return fmt.Errorf("look up schema %q: %s", t.Schema, dbconf.RedactErr(err, t.DatabaseURL))
	}
	if !exists {
		return fmt.Errorf("schema %q does not exist in database %s: run `relay migrate up` with the target list (it creates it), or correct the target",
			t.Schema, dbconf.RedactDSN(t.DatabaseURL))
	}
	return nil
}

// readTargetLine reads one target's state and figures on a pool of its
// own. It writes nothing and takes no lock.
func readTargetLine(ctx context.Context, t targetSpec, log *logger) (state, detail string, fig *TargetFigures) {
	pool, err := openTarget(ctx, t, 2)
	if err != nil {
		return stateUnreachable, unreachableText(err, t), nil
	}
	defer pool.Close()
	state, detail, snap := readTarget(ctx, pool, t, inspect.Config{Lanes: relay.LanesDefault, Logger: log})
	if snap != nil {
		fig = figuresOf(snap)
	}
	return state, detail, fig
}

// readTarget reads one target's state and snapshot through db: a pool with
// the target's schema as its search_path (`relay status`), or a database's
// shared pool that sets it per transaction (targetDB: `relay run`'s
// metrics and console). It writes nothing and takes no lock; snap is nil when the
// snapshot could not be read.
func readTarget(ctx context.Context, db inspect.DB, t targetSpec, cfg inspect.Config) (state, detail string, snap *inspect.Snapshot) {
	failed := func(err error) (string, string, *inspect.Snapshot) {
		return stateFailed, oneLine(dbconf.RedactErr(err, t.DatabaseURL)), nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return stateUnreachable, unreachableText(err, t), nil
	}
	var exists bool
	var applied []int64
	err = tx.QueryRow(ctx, schemaExistsSQL, t.Schema).Scan(&exists)
	if err != nil {
		err = fmt.Errorf("look up schema %q: %w", t.Schema, err)
	} else if exists {
		applied, err = appliedVersions(ctx, tx)
	}
	_ = tx.Rollback(context.WithoutCancel(ctx))
	switch {
	case err != nil:
		return failed(err)
	case !exists:
		return stateNoSchema, "`relay migrate up` with the target list creates it", nil
	}
	state = stateOK
	shipped := shippedVersions()
	if pending := len(slices.DeleteFunc(slices.Clone(shipped), func(v int64) bool { return slices.Contains(applied, v) })); pending > 0 {
		state, detail = stateBehind, fmt.Sprintf("%d of this relay's migrations pending: run `relay migrate up`", pending)
		if len(applied) == 0 {
			detail = "never migrated: run `relay migrate up`"
		}
	}
	snap, err = inspect.Read(ctx, db, cfg)
	switch {
	case err == nil:
		return state, detail, snap
	case errors.Is(err, inspect.ErrNoConnection):
		return stateUnreachable, unreachableText(err, t), nil
	case state == stateBehind: // an older schema inspect cannot read: behind says why
		return state, detail, nil
	case errors.Is(err, inspect.ErrSchemaMissing):
		return stateBehind, "pgbox tables missing: run `relay migrate up`", nil
	}
	return failed(err)
}

// unreachableText is a connection error without the "database … unreachable"
// its line already says.
func unreachableText(err error, t targetSpec) string {
	s := oneLine(dbconf.RedactErr(err, t.DatabaseURL))
	return strings.TrimPrefix(s, "database "+dbconf.RedactDSN(t.DatabaseURL)+" unreachable: ")
}

// sortLines puts the worst targets first: by state (unreachable, failed, no
// schema, behind, ok), then the oldest unpublished row (none last), the
// larger backlog, more parked rows, more dead letters, and the name.
func sortLines(lines []targetLine) {
	slices.SortStableFunc(lines, func(x, y targetLine) int {
		if c := cmp.Compare(stateRank[x.State], stateRank[y.State]); c != 0 {
			return c
		}
		if c := console.CompareFigures(x.TargetFigures.console(), y.TargetFigures.console()); c != 0 {
			return c
		}
		return cmp.Compare(x.Name, y.Name)
	})
}

// console is f as the console's figures (nil: nil).
func (f *TargetFigures) console() *console.FleetFigures {
	if f == nil {
		return nil
	}
	return &console.FleetFigures{
		Unpublished: f.Unpublished, UnpublishedEstimated: f.UnpublishedEstimated, OldestAge: f.OldestAge,
		Parked: f.Parked, ParkedCapped: f.ParkedCapped, DeadLetters: f.DeadLetters, DeadLettersCapped: f.DeadLettersCapped,
		HorizonAgeSeconds: f.HorizonAgeSeconds, HorizonAgeTransactions: f.HorizonAgeTransactions, HorizonPastBound: f.HorizonPastBound,
	}
}

func writeTargetLines(a *app, lines []targetLine) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSCHEMA\tDATABASE\tBACKLOG\tOLDEST\tPARKED\tDEAD\tRELAYS\tLANES\tXMIN\tSTATE")
	for _, l := range lines {
		cols := []string{"-", "-", "-", "-", "-", "-", "-"}
		if f := l.TargetFigures; f != nil {
			cols = []string{
				countOrEstimate(f.Unpublished, f.UnpublishedEstimated), secondsText(f.OldestAge),
				countOrCapped(f.Parked, f.ParkedCapped), countOrCapped(f.DeadLetters, f.DeadLettersCapped),
				fmt.Sprint(f.RelaysLive), lanesText(f), horizonText(f),
			}
		}
		state := strings.ReplaceAll(l.State, "_", " ")
		if l.Detail != "" {
			state += ": " + l.Detail
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.Name, l.Schema, l.Database, strings.Join(cols, "\t"), state)
	}
	return tw.Flush()
}

// The counts as `relay status` prints them: "~" an estimate, ">=" a count
// that stopped at its limit.
func countOrEstimate(n int64, estimated bool) string {
	if estimated {
		return fmt.Sprintf("~%d", n)
	}
	return fmt.Sprint(n)
}

func countOrCapped(n int64, capped bool) string {
	if capped {
		return fmt.Sprintf(">=%d", n)
	}
	return fmt.Sprint(n)
}

func secondsText(s *float64) string {
	if s == nil {
		return "-"
	}
	return durtext.Short(time.Duration(*s * float64(time.Second)))
}

func lanesText(f *TargetFigures) string {
	switch {
	case f.Lanes == 0:
		return "-"
	case f.Dormant:
		return "dormant"
	}
	return fmt.Sprintf("%d/%d", f.LanesHeld, f.Lanes)
}

// horizonText is how long the horizon has been held ("-": not held), in
// time when a holder has a start, else in transactions; "!" past
// inspect.HorizonWarnAge or inspect.HorizonWarnTransactions.
func horizonText(f *TargetFigures) string {
	var s string
	switch {
	case f.HorizonAgeSeconds != nil:
		s = secondsText(f.HorizonAgeSeconds)
	case f.HorizonAgeTransactions > 0:
		s = fmt.Sprintf("%d xacts", f.HorizonAgeTransactions)
	default:
		return "-"
	}
	if f.HorizonPastBound {
		s += "!"
	}
	return s
}

// onTargets calls work(i) for each of n targets, at most limit at a time
// (at least one), and returns when every call has; once ctx ends, the
// targets not started yet are not called.
func onTargets(ctx context.Context, n, limit int, work func(i int)) {
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			work(i)
		})
	}
	wg.Wait()
}
