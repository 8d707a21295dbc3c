package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/relay"
)

// A target is one (database, schema) holding pgbox's tables. Without
// --targets or --targets-query the binary has one, --database-url and
// --schema; with either, a list of them, each named.

// Option groups of the target list. groupTargetsWatch marks the commands
// that keep running and re-read the list, groupTargetsEach those that work
// on every target once (`status`, `cleanup`); their settings print under
// groupTargets.
const (
	groupTargets      = "Targets"
	groupTargetsWatch = "Targets (re-read)"
	groupTargetsEach  = "Targets (each)"
)

const (
	// targetsRefreshDefault is --targets-refresh.
	targetsRefreshDefault = 30 * time.Second
	// migrateConcurrencyDefault is --migrate-concurrency.
	migrateConcurrencyDefault = 4
	// targetsConcurrencyDefault is --targets-concurrency.
	targetsConcurrencyDefault = 4
	// targetsQueryTimeout bounds one run of --targets-query.
	targetsQueryTimeout = 15 * time.Second
)

// targetOptions are the settings of the target list.
type targetOptions struct {
	File        string
	Query       string
	ControlURL  string
	Refresh     time.Duration
	Concurrency int
	// EachConcurrency is --targets-concurrency: `status` and `cleanup`.
	EachConcurrency int
	ConnBudget      int
	// DormantAfter is --dormant-after (0: never; relay.FleetConfig's
	// negative).
	DormantAfter time.Duration
	// WatchRate is --watch-rate (relay.FleetConfig.WatchRate).
	WatchRate int

	// fromFile is the file as validate read it: the first load uses it.
	fromFile []targetSpec
}

func (t *targetOptions) bind(s *settings, has map[string]bool) {
	if !has[groupTargets] {
		return
	}
	g := groupTargets
	s.str(&t.File, g, "targets", "PGBOX_TARGETS", "",
		"file listing the targets, one per line: name schema [database-url] (without a database-url, --database-url's); blank lines and # comments are ignored (empty: one target, --database-url and --schema)")
	s.str(&t.Query, g, "targets-query", "PGBOX_TARGETS_QUERY", "",
		"read-only SQL run on --control-url that returns the targets: columns name, schema and optionally database_url (NULL: --database-url)")
	s.str(&t.ControlURL, g, "control-url", "PGBOX_CONTROL_URL", "",
		"PostgreSQL URL or key=value DSN of the database --targets-query runs on (empty: --database-url)").dsn = true
	if has[groupTargetsWatch] {
		s.duration(&t.Refresh, g, "targets-refresh", "PGBOX_TARGETS_REFRESH", targetsRefreshDefault, time.Second,
			"how often a running command re-reads --targets or --targets-query (SIGHUP re-reads at once); a failed read is logged and the previous list kept")
	}
	if has[groupRelay] {
		s.duration(&t.DormantAfter, g, "dormant-after", "PGBOX_DORMANT_AFTER", relay.DormantAfterDefault, 0,
			"with --targets or --targets-query, how long a target finds no rows before it goes dormant: it gives up its lanes and stops renewing leases until a notification or the idle poll finds rows (0: never)")
		s.integer(&t.WatchRate, g, "watch-rate", "PGBOX_WATCH_RATE", relay.WatchRateDefault, 1, 1_000_000,
			"with --targets or --targets-query, the most watch questions a second the busy targets are asked in all (a busy target is asked for new rows every 2 ms, or every busy targets / --watch-rate when that is longer): higher finds their rows sooner, for more work on the databases")
		s.integer(&t.ConnBudget, g, "db-conn-budget", "PGBOX_DB_CONN_BUDGET", dbConnBudgetDefault, 1, 100_000,
			"with --targets or --targets-query, the most database connections `relay run` opens in all: each database's pool (at most --db-max-conns, at least 2) and its LISTEN connection, one to check targets, one to --control-url, and 3 for a cleanup pass (with --cleanup-interval; more passes at once while the budget has room)")
	}
	if has[groupMigrate] {
		s.integer(&t.Concurrency, g, "migrate-concurrency", "PGBOX_MIGRATE_CONCURRENCY", migrateConcurrencyDefault, 1, 64,
			"most targets `migrate up` and `migrate status` work on at once (with --targets or --targets-query)")
	}
	if has[groupTargetsEach] {
		s.integer(&t.EachConcurrency, g, "targets-concurrency", "PGBOX_TARGETS_CONCURRENCY", targetsConcurrencyDefault, 1, 64,
			"most targets `status` and `cleanup` work on at once, and `run` reads for /metrics and prunes at once (with --targets or --targets-query)")
	}
}

// fleetDormantAfter is --dormant-after as relay.FleetConfig.DormantAfter.
func (t *targetOptions) fleetDormantAfter() time.Duration {
	if t.DormantAfter == 0 {
		return -1
	}
	return t.DormantAfter
}

// listed reports whether a target list replaces --database-url/--schema.
func (t *targetOptions) listed() bool { return t.File != "" || t.Query != "" }

// validate checks the target settings against each other and the database
// settings, and reads --targets once: a bad file is a usage error. It
// returns one message per problem.
func (t *targetOptions) validate(o *options) []string {
	var msgs []string
	bad := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	if t.File != "" && t.Query != "" {
		bad("PGBOX_TARGETS (--targets) and PGBOX_TARGETS_QUERY (--targets-query) cannot both be set: give the target list one way")
	}
	if t.listed() && o.Schema != "" {
		bad("PGBOX_SCHEMA (--schema) cannot be combined with %s: each target names its own schema", t.sourceSetting())
	}
	if t.ControlURL != "" {
		if _, err := dbconf.Config(t.ControlURL, "", 0, ""); err != nil {
			bad("invalid value %q for PGBOX_CONTROL_URL (--control-url): must be a PostgreSQL URL or key=value DSN (%v)", dbconf.RedactDSN(t.ControlURL), err)
		} else if t.Query == "" {
			bad("PGBOX_CONTROL_URL (--control-url) is set but PGBOX_TARGETS_QUERY (--targets-query) is not: the control database is only read for the query; set both or neither")
		}
	}
	if t.Query != "" && t.ControlURL == "" && o.DatabaseURL == "" {
		bad("missing control database for PGBOX_TARGETS_QUERY (--targets-query): set PGBOX_CONTROL_URL (--control-url) or DATABASE_URL (--database-url)")
	}
	if t.File != "" && len(msgs) == 0 {
		list, err := readTargetsFile(t.File, o.DatabaseURL)
		if err != nil {
			bad("%s", trimUsage(err))
		}
		t.fromFile = list
	}
	return msgs
}

// sourceSetting names the setting the target list comes from.
func (t *targetOptions) sourceSetting() string {
	if t.Query != "" {
		return "PGBOX_TARGETS_QUERY (--targets-query)"
	}
	return "PGBOX_TARGETS (--targets)"
}

// targetSpec is one target: a name (empty for the single target of
// --database-url and --schema), the schema holding its pgbox tables, and the
// database it is in.
type targetSpec struct {
	Name        string
	DatabaseURL string
	Schema      string
}

// display is the target's name as tables print it.
func (t targetSpec) display() string {
	if t.Name == "" {
		return "-"
	}
	return t.Name
}

var targetNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// maxIdentifierBytes is PostgreSQL's NAMEDATALEN - 1: a longer name is
// truncated, by search_path and CREATE SCHEMA alike.
const maxIdentifierBytes = 63

// complete fills a missing database URL with defaultURL and checks the
// target; its error names the field at fault, never a password.
func (t targetSpec) complete(defaultURL string) (targetSpec, error) {
	if t.Name == "" {
		return t, errors.New("empty name")
	}
	if !targetNameRE.MatchString(t.Name) {
		return t, fmt.Errorf("invalid name %q: must be letters, digits, \"_\", \"-\" or \".\"", t.Name)
	}
	if err := checkTargetSchema(t.Schema); err != nil {
		return t, err
	}
	if t.DatabaseURL == "" {
		if defaultURL == "" {
			return t, errors.New("no database URL: give one for this target or set DATABASE_URL (--database-url)")
		}
		t.DatabaseURL = defaultURL
	}
	if _, err := dbconf.Config(t.DatabaseURL, t.Schema, 0, ""); err != nil {
		return t, fmt.Errorf("invalid database URL %s: %v", dbconf.RedactDSN(t.DatabaseURL), err)
	}
	return t, nil
}

// checkTargetSchema accepts a schema name that search_path and CREATE
// SCHEMA read alike: one name, as --schema (no commas or quotes), and
// neither white space nor upper case (search_path folds an unquoted name to
// lower case) nor longer than PostgreSQL keeps.
func checkTargetSchema(s string) error {
	switch {
	case s == "":
		return errors.New("empty schema")
	case strings.ContainsAny(s, ",\"") || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || (r >= 'A' && r <= 'Z') }):
		return fmt.Errorf("invalid schema %q: must be one schema name in lower case, without commas, quotes or spaces", s)
	case len(s) > maxIdentifierBytes:
		return fmt.Errorf("invalid schema %q: must be at most %d bytes", s, maxIdentifierBytes)
	}
	return nil
}

// targetChecker checks a list's targets one by one for duplicates.
type targetChecker struct {
	names map[string]string // name → where
	dbs   map[[2]string]string
}

func newTargetChecker() *targetChecker {
	return &targetChecker{names: map[string]string{}, dbs: map[[2]string]string{}}
}

// add records t, found at where, and refuses a name or a (database, schema)
// seen before.
func (c *targetChecker) add(t targetSpec, where string) error {
	if prev, ok := c.names[t.Name]; ok {
		return fmt.Errorf("duplicate name %q (first on %s)", t.Name, prev)
	}
	key := [2]string{t.DatabaseURL, t.Schema}
	if prev, ok := c.dbs[key]; ok {
		return fmt.Errorf("schema %q of database %s is listed twice (first on %s)", t.Schema, dbconf.RedactDSN(t.DatabaseURL), prev)
	}
	c.names[t.Name] = where
	c.dbs[key] = where
	return nil
}

// readTargetsFile reads and checks a --targets file. Its error is a usage
// error naming the file and every bad line.
func readTargetsFile(path, defaultURL string) ([]targetSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usageError("PGBOX_TARGETS (--targets): cannot read the target list: %v", err)
	}
	return parseTargets(b, path, defaultURL)
}

// parseTargets parses a --targets file's text: one target a line, "name
// schema [database-url]", fields separated by white space; a field
// starting with "#" starts a comment.
func parseTargets(b []byte, path, defaultURL string) ([]targetSpec, error) {
	var list []targetSpec
	var msgs []string
	seen := newTargetChecker()
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if i := slices.IndexFunc(fields, func(f string) bool { return strings.HasPrefix(f, "#") }); i >= 0 {
			fields = fields[:i]
		}
		if len(fields) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", path, n)
		bad := func(err error) { msgs = append(msgs, fmt.Sprintf("PGBOX_TARGETS (--targets) %s: %v", where, err)) }
		if len(fields) < 2 || len(fields) > 3 {
			bad(fmt.Errorf("%d fields: a line must be name schema [database-url] (a database URL cannot contain spaces: percent-encode them)", len(fields)))
			continue
		}
		t := targetSpec{Name: fields[0], Schema: fields[1]}
		if len(fields) == 3 {
			t.DatabaseURL = fields[2]
		}
		t, err := t.complete(defaultURL)
		if err == nil {
			err = seen.add(t, fmt.Sprintf("line %d", n))
		}
		if err != nil {
			bad(fmt.Errorf("target %q: %w", fields[0], err))
			continue
		}
		list = append(list, t)
	}
	if err := sc.Err(); err != nil {
		msgs = append(msgs, fmt.Sprintf("PGBOX_TARGETS (--targets) %s: %v", path, err))
	}
	if len(msgs) > 0 {
		return nil, usageError("%s", strings.Join(msgs, "\n  "))
	}
	return list, nil
}

// targetColumns are the columns --targets-query returns.
var targetColumns = []string{"name", "schema", "database_url"}

// queryTargets runs --targets-query in a read-only transaction and checks
// its rows. Its errors name the row (by its name, or its number when the
// name is missing).
func queryTargets(ctx context.Context, pool *pgxpool.Pool, query, defaultURL string) ([]targetSpec, error) {
	ctx, cancel := context.WithTimeout(ctx, targetsQueryTimeout)
	defer cancel()
	var list []targetSpec
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, query)
		if err != nil {
			return err
		}
		defer rows.Close()
		fields := rows.FieldDescriptions()
		if len(fields) == 0 { // the statement failed before describing its rows
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		col := map[string]int{}
		for i, f := range fields {
			if !slices.Contains(targetColumns, f.Name) {
				return fmt.Errorf("unknown column %q: the query returns the columns name, schema and optionally database_url", f.Name)
			}
			col[f.Name] = i
		}
		for _, c := range targetColumns[:2] {
			if _, ok := col[c]; !ok {
				return fmt.Errorf("no column %q: the query returns the columns name, schema and optionally database_url", c)
			}
		}
		var msgs []string
		seen := newTargetChecker()
		for n := 1; rows.Next(); n++ {
			vals := make([]pgtype.Text, len(col))
			dest := make([]any, len(vals))
			for i := range vals {
				dest[i] = &vals[i]
			}
			where := fmt.Sprintf("row %d", n)
			if err := rows.Scan(dest...); err != nil {
				msgs = append(msgs, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			get := func(c string) pgtype.Text {
				if i, ok := col[c]; ok {
					return vals[i]
				}
				return pgtype.Text{}
			}
			name, schema := get("name"), get("schema")
			if name.Valid && name.String != "" {
				where = fmt.Sprintf("target %q", name.String)
			}
			if !name.Valid || !schema.Valid {
				msgs = append(msgs, where+": name and schema must not be NULL")
				continue
			}
			t, err := targetSpec{Name: name.String, Schema: schema.String, DatabaseURL: get("database_url").String}.complete(defaultURL)
			if err == nil {
				err = seen.add(t, fmt.Sprintf("row %d", n))
			}
			if err != nil {
				msgs = append(msgs, fmt.Sprintf("%s (row %d): %v", where, n, err))
				continue
			}
			list = append(list, t)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(msgs) > 0 {
			return errors.New(strings.Join(msgs, "; "))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("PGBOX_TARGETS_QUERY (--targets-query): %w", err)
	}
	return list, nil
}

// targetSource reads the target list; load may be called again to re-read
// it.
type targetSource struct {
	// what names the source in logs.
	what  string
	load  func(ctx context.Context) ([]targetSpec, error)
	close func()
}

// targetSource opens the target list of the settings: the --targets file,
// --targets-query on the control database, or the one target of
// --database-url and --schema.
func (a *app) targetSource(ctx context.Context) (*targetSource, error) {
	o := a.opts
	t := &o.Targets
	switch {
	case t.File != "":
		first := t.fromFile
		return &targetSource{
			what: "PGBOX_TARGETS (--targets) " + t.File,
			load: func(context.Context) ([]targetSpec, error) {
				if first != nil { // read by validate a moment ago
					list := first
					first = nil
					return list, nil
				}
				return readTargetsFile(t.File, o.DatabaseURL)
			},
			close: func() {},
		}, nil
	case t.Query != "":
		url := cmp.Or(t.ControlURL, o.DatabaseURL)
		cfg, err := poolConfig(url, "", 1) // one query at a time: `relay run` counts one connection in --db-conn-budget
		if err != nil {
			return nil, usageError("invalid value %q for PGBOX_CONTROL_URL (--control-url): %v", dbconf.RedactDSN(url), err)
		}
		pool, err := dbconf.Open(ctx, cfg, url)
		if err != nil {
			return nil, fmt.Errorf("PGBOX_TARGETS_QUERY (--targets-query): control %w", err)
		}
		return &targetSource{
			what: "PGBOX_TARGETS_QUERY (--targets-query) on " + dbconf.RedactDSN(url),
			load: func(ctx context.Context) ([]targetSpec, error) {
				return queryTargets(ctx, pool, t.Query, o.DatabaseURL)
			},
			close: pool.Close,
		}, nil
	}
	one := []targetSpec{{DatabaseURL: o.DatabaseURL, Schema: o.Schema}}
	return &targetSource{
		what:  "DATABASE_URL (--database-url)",
		load:  func(context.Context) ([]targetSpec, error) { return one, nil },
		close: func() {},
	}, nil
}

// loadTargets reads the target list once.
func loadTargets(ctx context.Context, a *app) ([]targetSpec, error) {
	src, err := a.targetSource(ctx)
	if err != nil {
		return nil, err
	}
	defer src.close()
	return src.load(ctx)
}

// hups receives the process's SIGHUPs (main): an operator (or a
// provisioning job) that just added a tenant need not wait for the next
// refresh. Buffered: one that comes before the watch starts re-reads the
// list once it does; a command without a list never reads it.
var hups = make(chan os.Signal, 1)

// watchTargets reads the target list once and returns it (or the error
// that read met); then, until ctx ends, it re-reads the list every
// --targets-refresh and on SIGHUP, and calls onChange with the new list whenever it
// differs from the last one (a target added, removed, or with another
// schema or database; not the order). A failed re-read keeps the previous
// list: it is logged at WARN when the reads start failing and at INFO when
// one succeeds again, not at every attempt. onChange is called from one
// goroutine, one call at a time. done is closed once that goroutine has
// stopped (after ctx ends) and released the control database's pool.
// Without a target list there is nothing to re-read: done is closed at once.
func watchTargets(ctx context.Context, a *app, onChange func([]targetSpec)) (list []targetSpec, done <-chan struct{}, err error) {
	src, err := a.targetSource(ctx)
	if err != nil {
		return nil, nil, err
	}
	list, err = src.load(ctx)
	if err != nil {
		src.close()
		return nil, nil, err
	}
	ch := make(chan struct{})
	if !a.opts.Targets.listed() {
		src.close()
		close(ch)
		return list, ch, nil
	}
	every := a.opts.Targets.Refresh
	if every <= 0 {
		every = targetsRefreshDefault
	}
	go func() {
		defer close(ch)
		defer src.close()
		w := targetWatch{src: src, log: a.log, last: list, onChange: onChange}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hups:
				w.log.Info("SIGHUP: re-reading the target list", "source", src.what)
				w.reread(ctx)
			case <-tick.C:
				w.reread(ctx)
			}
		}
	}()
	return list, ch, nil
}

// targetWatch is watchTargets' state between two reads.
type targetWatch struct {
	src      *targetSource
	log      *logger
	last     []targetSpec
	failing  bool
	onChange func([]targetSpec)
}

func (w *targetWatch) reread(ctx context.Context) {
	next, err := w.src.load(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if !w.failing {
			w.failing = true
			w.log.Warn("cannot re-read the target list: keeping the previous one until a read succeeds",
				"source", w.src.what, "targets", len(w.last), "err", err)
		}
		return
	}
	if w.failing {
		w.failing = false
		w.log.Info("target list read again", "source", w.src.what, "targets", len(next))
	}
	added, removed := diffTargets(w.last, next)
	if len(added) == 0 && len(removed) == 0 {
		return
	}
	w.log.Info("target list changed", "source", w.src.what, "added", targetNames(added), "removed", targetNames(removed), "targets", len(next))
	w.last = next
	w.onChange(next)
}

// diffTargets returns the targets of next not in prev, and those of prev
// not in next; a target whose schema or database changed is in both.
func diffTargets(prev, next []targetSpec) (added, removed []targetSpec) {
	in := func(list []targetSpec) map[targetSpec]bool {
		m := make(map[targetSpec]bool, len(list))
		for _, t := range list {
			m[t] = true
		}
		return m
	}
	inPrev, inNext := in(prev), in(next)
	for _, t := range next {
		if !inPrev[t] {
			added = append(added, t)
		}
	}
	for _, t := range prev {
		if !inNext[t] {
			removed = append(removed, t)
		}
	}
	return added, removed
}

func targetNames(list []targetSpec) []string {
	names := make([]string, 0, len(list))
	for _, t := range list {
		names = append(names, t.display())
	}
	return names
}
