package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A fleet console serves the console of every target of a list (a
// relay.Fleet's schemas): a fleet overview, one line per target, the worst
// first, and each target's console pages under /t/{name}/, reading and
// acting on that target's tables only.

// Defaults for FleetConfig fields left zero.
const (
	// SummaryConcurrencyDefault is how many targets' summaries are read at once.
	SummaryConcurrencyDefault = 4
	// SummaryTimeoutDefault bounds the reading of one target's summary.
	SummaryTimeoutDefault = 10 * time.Second
	// SummaryMaxAgeDefault is how old the summaries may be before the
	// fleet overview reads them again.
	SummaryMaxAgeDefault = time.Minute
)

// fleetPageSize is how many targets the fleet overview shows per page.
const fleetPageSize = 100

// fleetHandlersMax bounds the target handlers a fleet console keeps (each
// holds its target's CSRF key and rate sample); past it one is dropped and
// made again when its target is next asked for.
const fleetHandlersMax = 256

// summaryRefreshMin is how often an operator's "read again" may start a
// new reading of every summary.
const summaryRefreshMin = 5 * time.Second

// ErrUnknownTarget is returned by a Fleet's DB for a name its list does
// not hold: the console answers 404 naming it.
var ErrUnknownTarget = errors.New("no such target")

// FleetTarget is one target of a Fleet as the fleet overview lists it:
// what the process serving it knows, read from memory.
type FleetTarget struct {
	Name   string
	Schema string
	// Database names the target's database, without a password.
	Database string
	// State is the relay's state of the target: "starting", "running",
	// "needs operator", "stopped", or one the Fleet defines (the binary's
	// "refused": not served). Err says why it does not run, or the last
	// failure of a running one ("" when all is well).
	State string
	Err   string
	// Dormant is set while the running relay, idle a while, has given
	// up its lanes until rows come (relay.TargetState.Dormant): no lanes
	// held is then expected.
	Dormant bool
	// Lanes is how many lanes this process's relay holds for the target.
	Lanes int
	// Published counts the rows this process's relay published for it
	// (the target's overview shows the rate).
	Published uint64
}

// Summary states: the figures' state of a target, as `relay status` over
// a target list reports it, the worst first.
const (
	SummaryUnreachable = "unreachable"
	SummaryFailed      = "failed"
	SummaryNoSchema    = "no_schema"
	SummaryBehind      = "behind"
	SummaryOK          = "ok"
)

// FleetSummary is one target's figures, read from its database.
type FleetSummary struct {
	// State is one of the Summary states; Detail says why when not ok.
	State  string
	Detail string
	// Figures, when they could be read (nil otherwise).
	Figures *FleetFigures
	// At is when they were read: a FleetReader's Summaries set it; what
	// Summarize returns is stamped when it returns.
	At time.Time
}

// FleetFigures are the figures of a target the fleet overview shows.
type FleetFigures struct {
	Unpublished          int64
	UnpublishedEstimated bool
	// OldestAge is the oldest unpublished row's age in seconds (nil: none).
	OldestAge         *float64
	Parked            int64
	ParkedCapped      bool
	DeadLetters       int64
	DeadLettersCapped bool
	// HorizonAgeSeconds is how long the database's xmin horizon has been
	// held (nil: unknown or not held); HorizonAgeTransactions in
	// transactions; HorizonPastBound past inspect's warning bounds.
	HorizonAgeSeconds      *float64
	HorizonAgeTransactions int64
	HorizonPastBound       bool
}

// Fleet is what a fleet console reads of the targets: the binary's `relay
// run` with a target list implements it over its relay.Fleet. The fleet
// overview's figures come from a Fleet that is also a [FleetSummarizer]
// (the console reads them, on its own schedule) or a [FleetReader] (the
// Fleet reads them, on its own).
type Fleet interface {
	// Targets lists the targets; it must be cheap (read from memory):
	// every fleet overview calls it.
	Targets() []FleetTarget
	// DB returns the database of the target name, its tables found
	// through the search_path (its schema), or an error wrapping
	// ErrUnknownTarget. It should return the same value for a target while
	// its database and schema are unchanged: the console keeps the
	// target's handler (its CSRF key) while it does.
	DB(name string) (DB, error)
}

// FleetSummarizer is a Fleet whose targets' figures the console reads:
// SummaryConcurrency at a time, each within SummaryTimeout, when the
// fleet overview's are older than SummaryMaxAge.
type FleetSummarizer interface {
	Fleet
	// Summarize reads the target's figures; ctx bounds it
	// (FleetConfig.SummaryTimeout).
	Summarize(ctx context.Context, name string) FleetSummary
}

// FleetReader is a Fleet that reads its targets' figures itself, on a
// schedule of its own (the binary's reader, whose reads /metrics exports
// too): the fleet overview shows what it last read and the console reads
// no database for it; the Summary fields of FleetConfig are not used.
type FleetReader interface {
	Fleet
	// Summaries returns every target's last figures by name, each with
	// its At, from memory: every fleet overview calls it. A target it
	// lacks is shown as not read yet.
	Summaries() map[string]FleetSummary
}

// FleetConfig configures a FleetHandler.
type FleetConfig struct {
	// Console is every target page's configuration: Auth, HidePayloads,
	// Inspect, MaxActionRows, QueryTimeout, KafkaWait, Prefix (the fleet
	// console's), CSRFKey, Logger as for one console. Its DB, Cleaner and
	// Published are not used: each target's DB comes from Fleet, its
	// published count from Fleet.Targets. With CSRFKey nil each target's
	// forms are signed with the key kept in its own schema.
	Console Config

	// Fleet lists the targets and gives their databases and figures (a
	// FleetSummarizer or a FleetReader). Required.
	Fleet Fleet

	// SummaryConcurrency is how many targets' summaries are read at once
	// (a FleetSummarizer's; the Summary fields do not apply to a
	// FleetReader). Defaults to SummaryConcurrencyDefault (4).
	SummaryConcurrency int

	// SummaryTimeout bounds the reading of one target's summary; a target
	// that takes longer is shown as failed. Defaults to
	// SummaryTimeoutDefault (10s).
	SummaryTimeout time.Duration

	// SummaryMaxAge is how old the summaries may grow: a fleet overview
	// shown later starts reading every target's again, in the background
	// (the page shows the figures it has, and when each was read). Nothing
	// is read while nobody looks. Defaults to SummaryMaxAgeDefault (1m).
	SummaryMaxAge time.Duration
}

// FleetHandler is a fleet console: an http.Handler serving the fleet
// overview at its prefix and each target's console under /t/{name}/.
type FleetHandler struct {
	cfg  FleetConfig
	base *Handler // the fleet's own pages; its auth and throttle are every target's

	mu       sync.Mutex
	handlers map[string]*Handler

	sums summaries
}

// NewFleet validates cfg and returns the fleet console's handler. Close
// it to stop a reading of the summaries under way.
func NewFleet(cfg FleetConfig) (*FleetHandler, error) {
	if cfg.Fleet == nil {
		return nil, errors.New("console: missing Fleet (the targets the fleet console serves)")
	}
	_, summarizes := cfg.Fleet.(FleetSummarizer)
	_, reads := cfg.Fleet.(FleetReader)
	if !summarizes && !reads {
		return nil, fmt.Errorf("console: Fleet %T gives no figures (implement FleetSummarizer's Summarize, or FleetReader's Summaries)", cfg.Fleet)
	}
	var errs []error
	if cfg.SummaryConcurrency < 0 {
		errs = append(errs, fmt.Errorf("console: SummaryConcurrency %d is negative (use a positive count, or 0 for %d)", cfg.SummaryConcurrency, SummaryConcurrencyDefault))
	}
	if cfg.SummaryTimeout < 0 {
		errs = append(errs, fmt.Errorf("console: SummaryTimeout %v is negative (use a positive duration, or 0 for %v)", cfg.SummaryTimeout, SummaryTimeoutDefault))
	}
	if cfg.SummaryMaxAge < 0 {
		errs = append(errs, fmt.Errorf("console: SummaryMaxAge %v is negative (use a positive duration, or 0 for %v)", cfg.SummaryMaxAge, SummaryMaxAgeDefault))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cfg.SummaryConcurrency = cmp.Or(cfg.SummaryConcurrency, SummaryConcurrencyDefault)
	cfg.SummaryTimeout = cmp.Or(cfg.SummaryTimeout, SummaryTimeoutDefault)
	cfg.SummaryMaxAge = cmp.Or(cfg.SummaryMaxAge, SummaryMaxAgeDefault)

	bc := cfg.Console
	bc.DB, bc.Cleaner, bc.Published = noFleetDB{}, nil, nil
	if bc.CSRFKey == nil {
		// The fleet's own pages hold no form and take no POST: a random
		// key of their own spares them a database.
		bc.CSRFKey = make([]byte, 32)
		_, _ = rand.Read(bc.CSRFKey)
	}
	base, err := New(bc)
	if err != nil {
		return nil, err
	}
	base.cfg.DB, base.csrf.db = nil, nil
	base.home = base.cfg.Prefix
	f := &FleetHandler{cfg: cfg, base: base, handlers: map[string]*Handler{}}
	f.sums.init()
	base.mux = http.NewServeMux()
	base.mux.HandleFunc("GET /{$}", f.overview)
	base.mux.HandleFunc("GET /t", f.pick)
	base.mux.HandleFunc("GET /t/{$}", f.pick)
	base.mux.Handle("GET /static/", staticFiles())
	return f, nil
}

// noFleetDB stands in for Config.DB while the fleet's own pages are
// built; they never query it.
type noFleetDB struct{ DB }

// Close stops the reading of the summaries under way, if any, and waits
// for it.
func (f *FleetHandler) Close() { f.sums.close() }

// ServeHTTP serves the fleet console. Every request is authenticated
// first, with one login throttle for the fleet's pages and every target's.
func (f *FleetHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	path, ok := stripPrefix(w, r, f.base.cfg.Prefix)
	if !ok {
		return
	}
	name, rest, isTarget := targetPath(path)
	if !isTarget {
		id, ok := f.base.login(w, r)
		if ok {
			f.base.serveAs(w, r, id, path)
		}
		return
	}
	h, err := f.handler(name)
	if err != nil {
		// Authenticated first: the 404 names the target, and an anonymous
		// request must not learn which names exist.
		id, ok := f.base.login(w, r)
		if !ok {
			return
		}
		r = r.Clone(context.WithValue(r.Context(), identityKey{}, id))
		if errors.Is(err, ErrUnknownTarget) {
			f.base.fail(w, r, http.StatusNotFound, fmt.Sprintf("no target named %q in the target list", name))
			return
		}
		f.base.failErr(w, r, fmt.Errorf("target %q: %w", name, err))
		return
	}
	id, ok := h.login(w, r) // a failed login is audited in the target's schema
	if !ok {
		return
	}
	if rest == "" { // after the login: a stranger learns no names
		http.Redirect(w, r, h.cfg.Prefix+"/", http.StatusSeeOther)
		return
	}
	h.serveAs(w, r, id, rest)
}

// targetPath splits a path /t/{name}/rest into name and /rest.
func targetPath(path string) (name, rest string, ok bool) {
	after, ok := strings.CutPrefix(path, "/t/")
	if !ok || after == "" {
		return "", "", false
	}
	name, rest, slash := strings.Cut(after, "/")
	if slash {
		rest = "/" + rest
	}
	return name, rest, true
}

// handler returns the console handler of the target name, made on first
// use and again when the Fleet gives the target another database.
func (f *FleetHandler) handler(name string) (*Handler, error) {
	db, err := f.cfg.Fleet.DB(name)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h, ok := f.handlers[name]; ok && sameDB(h.cfg.DB, db) {
		return h, nil
	}
	if len(f.handlers) >= fleetHandlersMax {
		for k := range f.handlers { // any one: made again when asked for
			delete(f.handlers, k)
			break
		}
	}
	cfg := f.base.cfg
	cfg.DB = db
	cfg.CSRFKey = f.cfg.Console.CSRFKey
	cfg.Prefix = f.base.cfg.Prefix + "/t/" + url.PathEscape(name)
	cfg.Logger = f.base.cfg.Logger.With("fleet_target", name)
	cfg.Published = func() uint64 { t, _ := f.target(name); return t.Published }
	h := newHandler(cfg, f.base.auth, f.base.logins)
	h.pages = f.base.pages
	h.fleetName, h.home = name, f.base.cfg.Prefix
	h.fleetTarget = func() (FleetTarget, bool) { return f.target(name) }
	h.routes()
	f.handlers[name] = h
	return h, nil
}

// sameDB reports whether a and b are the same database value (false when
// they cannot be compared: the handler is made again).
func sameDB(a, b DB) bool {
	if a == nil || b == nil || reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}

// target is what Fleet.Targets says of name: its pages' banner and its
// overview's publish rate.
func (f *FleetHandler) target(name string) (FleetTarget, bool) {
	for _, t := range f.cfg.Fleet.Targets() {
		if t.Name == name {
			return t, true
		}
	}
	return FleetTarget{}, false
}

// pick is the target picker's form: it goes to the target named.
func (f *FleetHandler) pick(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimSpace(r.URL.Query().Get("name"))
	if name == "" {
		http.Redirect(w, r, f.base.cfg.Prefix+"/", http.StatusSeeOther)
		return
	}
	if _, err := f.cfg.Fleet.DB(name); errors.Is(err, ErrUnknownTarget) {
		f.base.fail(w, r, http.StatusNotFound, fmt.Sprintf("no target named %q in the target list", name))
		return
	}
	http.Redirect(w, r, f.base.cfg.Prefix+"/t/"+url.PathEscape(name)+"/", http.StatusSeeOther)
}

// fleetRow is one target's line of the fleet overview.
type fleetRow struct {
	FleetTarget
	Link string
	// Sum is the target's last summary (nil: not read yet), read at At;
	// SumState its state as shown ("no schema").
	Sum      *FleetSummary
	SumState string
	At       time.Time
	// Problem is set when the line is shown as needing attention.
	Problem bool
	rank    int
}

// fleetData is the fleet overview's content.
type fleetData struct {
	Rows    []fleetRow
	Total   int
	Matched int
	// Problems counts the targets needing attention, of all the list.
	Problems int
	Page     int
	Pages    int
	Q        string
	State    string
	States   []string
	PrevURL  string
	NextURL  string
	// The summaries: Oldest is when the oldest shown was read (zero: none
	// read), Reading says a reading is under way (Done of Of targets);
	// ReadByFleet that the Fleet reads them (a FleetReader).
	Oldest      time.Time
	ReadByFleet bool
	Reading     bool
	Done        int
	Of          int
	Now         time.Time
	MaxAge      time.Duration
}

// Fleet overview ranks, the worst first.
const (
	rankNotServed  = iota // the relay does not serve it (refused, needs operator)
	rankUnreadable        // its figures could not be read (unreachable, failed)
	rankSchema            // its schema is missing or behind
	rankRelayErr          // served, with a failure it has not recovered from
	rankUnread            // not read yet
	rankOK
)

func rankOf(t FleetTarget, s *FleetSummary) int {
	switch {
	case t.State != "running" && t.State != "starting":
		return rankNotServed
	case s != nil && (s.State == SummaryUnreachable || s.State == SummaryFailed):
		return rankUnreadable
	case s != nil && (s.State == SummaryNoSchema || s.State == SummaryBehind):
		return rankSchema
	case t.Err != "":
		return rankRelayErr
	case s == nil:
		return rankUnread
	}
	return rankOK
}

// overview is the fleet overview: every target's relay state and its last
// summary, the worst first, filtered and paged. It reads no database: a
// reading of the summaries starts in the background when they are older
// than SummaryMaxAge (or on "read again"), SummaryConcurrency targets at a
// time.
func (f *FleetHandler) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	q := r.URL.Query()
	targets := f.cfg.Fleet.Targets()
	d := fleetData{Total: len(targets), Q: strings.TrimSpace(q.Get("q")), State: q.Get("state"), Now: start, MaxAge: f.cfg.SummaryMaxAge}
	summary := f.sums.get
	if fr, ok := f.cfg.Fleet.(FleetReader); ok {
		sums := fr.Summaries()
		summary = func(name string) (FleetSummary, time.Time, bool) {
			s, ok := sums[name]
			return s, s.At, ok
		}
		d.ReadByFleet = true
	} else {
		f.sums.maybeRead(f, targets, q.Get("refresh") != "")
		d.Reading, d.Done, d.Of = f.sums.progress()
	}
	states := map[string]bool{}
	var rows []fleetRow
	for _, t := range targets {
		row := fleetRow{FleetTarget: t, Link: f.base.cfg.Prefix + "/t/" + url.PathEscape(t.Name) + "/"}
		if s, at, ok := summary(t.Name); ok {
			row.Sum, row.At, row.SumState = &s, at, strings.ReplaceAll(s.State, "_", " ")
			states[row.SumState] = true
		}
		row.rank = rankOf(t, row.Sum)
		row.Problem = row.rank < rankUnread
		if row.Problem {
			d.Problems++
		}
		states[t.State] = true
		if d.Q != "" && !strings.Contains(strings.ToLower(t.Name), strings.ToLower(d.Q)) {
			continue
		}
		if !matchState(row, d.State) {
			continue
		}
		rows = append(rows, row)
	}
	d.States = slices.Sorted(func(yield func(string) bool) {
		for s := range states {
			if !yield(s) {
				return
			}
		}
	})
	slices.SortStableFunc(rows, compareRows)
	d.Matched = len(rows)
	d.Pages = max(1, (len(rows)+fleetPageSize-1)/fleetPageSize)
	d.Page = 1
	if n, err := strconv.Atoi(q.Get("page")); err == nil {
		d.Page = min(max(n, 1), d.Pages)
	}
	lo := (d.Page - 1) * fleetPageSize
	d.Rows = rows[lo:min(lo+fleetPageSize, len(rows))]
	for _, row := range d.Rows {
		if !row.At.IsZero() && (d.Oldest.IsZero() || row.At.Before(d.Oldest)) {
			d.Oldest = row.At
		}
	}
	pageURL := func(n int) string {
		v := url.Values{}
		if d.Q != "" {
			v.Set("q", d.Q)
		}
		if d.State != "" {
			v.Set("state", d.State)
		}
		v.Set("page", strconv.Itoa(n))
		return f.base.cfg.Prefix + "/?" + v.Encode()
	}
	if d.Page > 1 {
		d.PrevURL = pageURL(d.Page - 1)
	}
	if d.Page < d.Pages {
		d.NextURL = pageURL(d.Page + 1)
	}
	f.base.render(w, r, "fleet", "Targets", d, start)
}

// matchState keeps a row for the state filter: "" every row, "problems"
// those needing attention, else the relay's state or the summary's.
func matchState(row fleetRow, state string) bool {
	switch state {
	case "":
		return true
	case "problems":
		return row.Problem
	}
	return row.State == state || (row.Sum != nil && row.SumState == state)
}

// compareRows orders the worst first: by rank, then the oldest unpublished
// row, the larger backlog, more parked rows, more dead letters (as `relay
// status` does), then the name.
func compareRows(x, y fleetRow) int {
	if c := cmp.Compare(x.rank, y.rank); c != 0 {
		return c
	}
	var fx, fy *FleetFigures
	if x.Sum != nil {
		fx = x.Sum.Figures
	}
	if y.Sum != nil {
		fy = y.Sum.Figures
	}
	if c := CompareFigures(fx, fy); c != 0 {
		return c
	}
	return cmp.Compare(x.Name, y.Name)
}

// CompareFigures orders the worse of two targets' figures first, as
// `relay status` over a list and the fleet overview do: the older oldest
// unpublished row (none last), the larger backlog, more parked rows, more
// dead letters; no figures at all (a state read without them) first.
func CompareFigures(x, y *FleetFigures) int {
	switch {
	case x == nil && y == nil:
		return 0
	case x == nil:
		return -1
	case y == nil:
		return 1
	}
	if c := cmp.Compare(ageOrNone(y.OldestAge), ageOrNone(x.OldestAge)); c != 0 {
		return c
	}
	if c := cmp.Compare(y.Unpublished, x.Unpublished); c != 0 {
		return c
	}
	if c := cmp.Compare(y.Parked, x.Parked); c != 0 {
		return c
	}
	return cmp.Compare(y.DeadLetters, x.DeadLetters)
}

func ageOrNone(s *float64) float64 {
	if s == nil {
		return -1
	}
	return *s
}

// summaries keeps the targets' last summaries and reads them again, one
// reading at a time.
type summaries struct {
	mu      sync.Mutex
	got     map[string]stamped
	reading bool
	started time.Time
	read    time.Time // when the last reading ended
	done    int
	of      int
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

type stamped struct {
	sum FleetSummary
	at  time.Time
}

func (s *summaries) init() {
	s.got = map[string]stamped{}
	s.ctx, s.cancel = context.WithCancel(context.Background())
}

func (s *summaries) close() {
	s.cancel()
	s.wg.Wait()
}

func (s *summaries) get(name string) (FleetSummary, time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.got[name]
	return st.sum, st.at, ok
}

func (s *summaries) progress() (bool, int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reading, s.done, s.of
}

// maybeRead starts a reading of every target's summary unless one is
// under way: when the last ended more than SummaryMaxAge ago (or none
// did), or, asked for, summaryRefreshMin ago.
func (s *summaries) maybeRead(f *FleetHandler, targets []FleetTarget, asked bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reading || s.ctx.Err() != nil {
		return
	}
	since := time.Since(s.read)
	if !s.read.IsZero() && since < f.cfg.SummaryMaxAge && (!asked || since < summaryRefreshMin) {
		return
	}
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name
	}
	// The targets never read first, then the longest unread.
	slices.SortStableFunc(names, func(a, b string) int {
		return s.got[a].at.Compare(s.got[b].at)
	})
	s.reading, s.started, s.done, s.of = true, time.Now(), 0, len(names)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.readAll(f, names)
	}()
}

// readAll reads names' summaries, SummaryConcurrency at a time, each
// within SummaryTimeout; the summaries of targets no longer listed are
// dropped.
func (s *summaries) readAll(f *FleetHandler, names []string) {
	sem := make(chan struct{}, f.cfg.SummaryConcurrency)
	var wg sync.WaitGroup
	for _, name := range names {
		select {
		case sem <- struct{}{}:
		case <-s.ctx.Done():
		}
		if s.ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(s.ctx, f.cfg.SummaryTimeout)
			sum := f.cfg.Fleet.(FleetSummarizer).Summarize(ctx, name)
			if ctx.Err() == context.DeadlineExceeded { // whatever it says, it is cut short
				sum = FleetSummary{State: SummaryFailed, Detail: fmt.Sprintf("not read within %v", f.cfg.SummaryTimeout)}
			}
			cancel()
			if s.ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			s.got[name] = stamped{sum: sum, at: time.Now()}
			s.done++
			s.mu.Unlock()
		})
	}
	wg.Wait()
	keep := map[string]bool{}
	for _, n := range names {
		keep[n] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range s.got {
		if !keep[n] {
			delete(s.got, n)
		}
	}
	s.reading, s.read = false, time.Now()
	f.base.cfg.Logger.Debug("console: target summaries read", "targets", len(names), "took", time.Since(s.started).Round(time.Millisecond))
}
