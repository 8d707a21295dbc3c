package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/internal/testdb"
)

// testFleet is a console.Fleet over a list of names: the targets in dbs
// are real schemas (their summary counts their parked rows), the others
// have no database; slow targets' summaries wait for their deadline.
type testFleet struct {
	names  []string
	dbs    map[string]*testdb.DB
	slow   map[string]bool
	states map[string]string

	calls   atomic.Int64
	mu      sync.Mutex
	running int
	most    int
}

func (f *testFleet) Targets() []console.FleetTarget {
	out := make([]console.FleetTarget, len(f.names))
	for i, n := range f.names {
		out[i] = console.FleetTarget{Name: n, Schema: "s_" + n, State: "running"}
		if s, ok := f.states[n]; ok {
			out[i].State, out[i].Err = s, "tables missing: run `relay migrate up`"
		}
	}
	return out
}

func (f *testFleet) DB(name string) (console.DB, error) {
	if db, ok := f.dbs[name]; ok {
		return db.Pool, nil
	}
	return nil, fmt.Errorf("target %q: %w", name, console.ErrUnknownTarget)
}

func (f *testFleet) Summarize(ctx context.Context, name string) console.FleetSummary {
	f.calls.Add(1)
	f.mu.Lock()
	f.running++
	f.most = max(f.most, f.running)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}()
	if f.slow[name] {
		<-ctx.Done()
		return console.FleetSummary{State: console.SummaryOK, Figures: &console.FleetFigures{}}
	}
	fig := &console.FleetFigures{}
	if db, ok := f.dbs[name]; ok {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`).Scan(&fig.Parked); err != nil {
			return console.FleetSummary{State: console.SummaryFailed, Detail: err.Error()}
		}
	}
	return console.FleetSummary{State: console.SummaryOK, Figures: fig}
}

func fleetServer(t *testing.T, f *testFleet, mod func(*console.FleetConfig)) *bundle {
	t.Helper()
	cfg := console.FleetConfig{Console: console.Config{Auth: testAuth(t)}}
	if f != nil {
		cfg.Fleet = f
	}
	if mod != nil {
		mod(&cfg)
	}
	h, err := console.NewFleet(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); h.Close() })
	return &bundle{srv: srv}
}

var fleetRowRe = regexp.MustCompile(`<tr[^>]*data-target="([^"]+)"`)

func fleetNames(page string) []string {
	var names []string
	for _, m := range fleetRowRe.FindAllStringSubmatch(page, -1) {
		names = append(names, m[1])
	}
	return names
}

// The fleet overview at 5,000 targets: a page load reads no database and
// shows 100 lines; the figures are read in the background at most
// SummaryConcurrency targets at a time, each within SummaryTimeout (a
// target past it is shown failed, first), once per SummaryMaxAge however
// many pages are loaded; filters and paging work on the whole list.
func TestFleetOverviewBounded(t *testing.T) {
	t.Parallel()
	a := testdb.New(t)
	parkRow(t, a, "orders", "k1", "v", "MESSAGE_TOO_LARGE")
	f := &testFleet{dbs: map[string]*testdb.DB{"t00042": a}, slow: map[string]bool{"t01000": true, "t02000": true},
		states: map[string]string{"t04999": "needs operator"}}
	for i := range 5000 {
		f.names = append(f.names, fmt.Sprintf("t%05d", i))
	}
	b := fleetServer(t, f, func(c *console.FleetConfig) {
		c.SummaryConcurrency = 3
		c.SummaryTimeout = 300 * time.Millisecond
	})
	vera := b.as("vera", viewerPass)

	start := time.Now()
	page := vera.get(t, "/")
	require.Less(t, time.Since(start), 2*time.Second, "a page load waits for no target")
	require.Len(t, fleetNames(page), 100)
	require.Contains(t, page, "5000 targets")
	require.Contains(t, page, "(page 1 of 50)")
	require.Contains(t, page, `href="/?page=2" id="fleet-next"`)

	waitFor(t, "every summary read", time.Minute, func() bool {
		return !strings.Contains(vera.get(t, "/"), "reading every target")
	})
	require.EqualValues(t, 5000, f.calls.Load(), "each target read once")
	require.LessOrEqual(t, f.most, 3, "at most SummaryConcurrency at once")
	page = vera.get(t, "/")
	require.Equal(t, []string{"t04999", "t01000", "t02000", "t00042", "t00000"}, fleetNames(page)[:5], "the worst first")
	require.Contains(t, page, "not read within 300ms")
	require.Contains(t, page, "Figures as of")
	vera.get(t, "/?refresh=1") // within summaryRefreshMin of the last reading: nothing read
	require.EqualValues(t, 5000, f.calls.Load(), "no reading while the figures are fresh")

	require.Equal(t, []string{"t04999", "t01000", "t02000"}, fleetNames(vera.get(t, "/?state=problems")))
	require.Equal(t, []string{"t04999"}, fleetNames(vera.get(t, "/?state=needs+operator")))
	last := vera.get(t, "/?page=50")
	require.Len(t, fleetNames(last), 100)
	require.Contains(t, last, `id="fleet-prev"`)
	require.NotContains(t, last, `id="fleet-next"`)
	named := fleetNames(vera.get(t, "/?q=420"))
	require.Len(t, named, 15, "t00420, t01420, t02420, t03420, t04200…t04209, t04420")
	require.Equal(t, "t00420", named[0])
}

// A target's pages under a prefix: links carry the prefix and the target,
// HidePayloads hides its keys, a viewer cannot act, a failed login naming
// the target is audited in its schema, and an unknown target is a 404
// naming it.
func TestFleetTargetPages(t *testing.T) {
	t.Parallel()
	a, b := testdb.New(t), testdb.New(t)
	parkRow(t, a, "orders", "secret-a", "v", "MESSAGE_TOO_LARGE")
	parkRow(t, b, "orders", "secret-b", "v", "MESSAGE_TOO_LARGE")
	f := &testFleet{names: []string{"a", "b"}, dbs: map[string]*testdb.DB{"a": a, "b": b}}
	srv := fleetServer(t, f, func(c *console.FleetConfig) {
		c.Console.Prefix = "/console"
		c.Console.HidePayloads = true
	})
	vera, otto := srv.as("vera", viewerPass), srv.as("otto", operatorPass)

	page := vera.get(t, "/console/t/a/parked")
	require.Contains(t, page, `href="/console/t/a/parked/row?id=1"`)
	require.Contains(t, page, `href="/console/" id="fleet-link"`)
	require.NotContains(t, page, "secret-a")
	require.Contains(t, page, "(hidden)")

	form := formOf(t, otto.get(t, "/console/t/a/parked/confirm?action=discard&ids=1"))
	code, _, _ := vera.do(t, "POST", "/console/t/a/parked/discard", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, 1, scalar[int](t, a, `SELECT count(*) FROM pgbox_outbox`))
	code, _, _ = otto.do(t, "POST", "/console/t/a/parked/discard", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 0, scalar[int](t, a, `SELECT count(*) FROM pgbox_outbox`))
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM pgbox_outbox`), "b's row 1 untouched")

	code, _, _ = srv.as("otto", "wrong").do(t, "GET", "/console/t/b/", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM pgbox_console_audit WHERE action = 'login' AND target LIKE 'fleet_target="b" %'`))

	code, body, _ := vera.do(t, "GET", "/console/t/zed/parked", nil)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, `no target named &#34;zed&#34; in the target list`)
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NewFleet refuses a config it cannot serve, saying how to fix it.
func TestNewFleetValidates(t *testing.T) {
	t.Parallel()
	_, err := console.NewFleet(console.FleetConfig{})
	require.ErrorContains(t, err, "console: missing Fleet")
	_, err = console.NewFleet(console.FleetConfig{Fleet: &testFleet{}, SummaryConcurrency: -1, SummaryTimeout: -time.Second})
	require.ErrorContains(t, err, "SummaryConcurrency -1 is negative (use a positive count, or 0 for 4)")
	require.ErrorContains(t, err, "SummaryTimeout -1s is negative")
	_, err = console.NewFleet(console.FleetConfig{Fleet: &testFleet{}, Console: console.Config{Prefix: "console"}})
	require.ErrorContains(t, err, `Prefix "console" must start with /`)
}

// readerFleet is a console.FleetReader: it reads its targets' figures
// itself; it has no databases.
type readerFleet struct {
	names []string
	sums  map[string]console.FleetSummary
	calls atomic.Int64
}

func (f *readerFleet) Targets() []console.FleetTarget {
	out := make([]console.FleetTarget, len(f.names))
	for i, n := range f.names {
		out[i] = console.FleetTarget{Name: n, Schema: "s_" + n, State: "running"}
	}
	return out
}

func (f *readerFleet) DB(name string) (console.DB, error) {
	return nil, fmt.Errorf("target %q: %w", name, console.ErrUnknownTarget)
}

func (f *readerFleet) Summaries() map[string]console.FleetSummary {
	f.calls.Add(1)
	return f.sums
}

// A FleetReader's figures are the fleet overview's, as it read them and
// when: the console reads nothing of its own and offers no "read again"
// (a Fleet with neither Summarize nor Summaries is refused).
func TestFleetReaderSummaries(t *testing.T) {
	t.Parallel()
	read := time.Now().Add(-90 * time.Second)
	f := &readerFleet{names: []string{"acme", "down", "fresh"}, sums: map[string]console.FleetSummary{
		"acme": {State: console.SummaryOK, Figures: &console.FleetFigures{Parked: 7}, At: read},
		"down": {State: console.SummaryUnreachable, Detail: "connection refused", At: time.Now()},
	}}
	b := fleetServer(t, nil, func(c *console.FleetConfig) { c.Fleet = f })
	vera := b.as("vera", viewerPass)
	page := vera.get(t, "/?refresh=1")
	require.Equal(t, []string{"down", "fresh", "acme"}, fleetNames(page), "unreadable, not read yet, ok")
	require.Regexp(t, `Figures as of 1m3\ds ago`, page, "the oldest shown: acme's, read when the Fleet read it")
	require.Contains(t, page, "the relay reads every target's again in the background")
	require.NotContains(t, page, `id="fleet-refresh"`)
	require.Contains(t, page, "connection refused")
	require.Regexp(t, `(?s)data-target="acme".*<td class="n">7</td>`, page)
	require.Regexp(t, `(?s)data-target="fresh".*not read yet`, page)
	require.EqualValues(t, 1, f.calls.Load(), "one call per page")

	_, err := console.NewFleet(console.FleetConfig{Fleet: struct{ console.Fleet }{f}})
	require.ErrorContains(t, err, "gives no figures (implement FleetSummarizer's Summarize, or FleetReader's Summaries)")
}
