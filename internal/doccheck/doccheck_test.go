package doccheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// root is the module's root directory.
var root = filepath.Join("..", "..")

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	require.NoError(t, err)
	return string(b)
}

// markdown returns README.md, CONTRIBUTING.md and docs/**/*.md by path.
func markdown(t *testing.T) map[string]string {
	t.Helper()
	docs := map[string]string{"README.md": read(t, "README.md"), "CONTRIBUTING.md": read(t, "CONTRIBUTING.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		docs[filepath.ToSlash(rel)] = read(t, rel)
		return nil
	})
	require.NoError(t, err)
	return docs
}

var testFuncRe = regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(`)

// testsByDir maps each directory of the module (slash-separated, relative to
// the root) to the Test functions its _test.go files declare.
func testsByDir(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		dir := filepath.ToSlash(rel)
		if out[dir] == nil {
			out[dir] = map[string]bool{}
		}
		for _, m := range testFuncRe.FindAllStringSubmatch(string(b), -1) {
			out[dir][m[1]] = true
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// TestCitedTestsExist: every test the docs cite as `package.TestName` is a
// Test function of that package, and every bare `TestName` exists somewhere.
func TestCitedTestsExist(t *testing.T) {
	t.Parallel()
	tests := testsByDir(t)
	cited := regexp.MustCompile("`([a-z][a-z0-9_/-]*)\\.(Test[A-Za-z0-9_]*)`")
	bare := regexp.MustCompile("`(Test[A-Za-z0-9_]*)`")
	n := 0
	for path, doc := range markdown(t) {
		for _, m := range cited.FindAllStringSubmatch(doc, -1) {
			_, ok := tests[m[1]]
			require.True(t, ok, "%s cites %s.%s: no package %s with tests", path, m[1], m[2], m[1])
			require.True(t, tests[m[1]][m[2]], "%s cites %s.%s: no func %s in %s/*_test.go", path, m[1], m[2], m[2], m[1])
			n++
		}
		for _, m := range bare.FindAllStringSubmatch(doc, -1) {
			found := false
			for _, fns := range tests {
				found = found || fns[m[1]]
			}
			require.True(t, found, "%s names %s: no such test in the tree", path, m[1])
		}
	}
	require.Greater(t, n, 60, "docs/guarantees.md should cite the tests of every guarantee")
}

// metricNames returns every metric name pgboxprom's collector describes.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	c, err := pgboxprom.New(pgboxprom.Config{})
	require.NoError(t, err)
	ch := make(chan *prometheus.Desc, 200)
	c.Describe(ch)
	close(ch)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		require.NotNil(t, m, "unexpected Desc format: %s", d)
		names[m[1]] = true
	}
	require.Contains(t, names, "pgbox_outbox_oldest_unpublished_age_seconds", "Describe output looks wrong")
	require.Greater(t, len(names), 30)
	return names
}

var pgboxIdentRe = regexp.MustCompile(`pgbox_[a-z0-9_]*[a-z0-9]`)

// isMetric reports whether name is a described metric or one of a
// histogram's series.
func isMetric(names map[string]bool, name string) bool {
	if names[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && names[base] && strings.HasSuffix(base, "_seconds") {
			return true
		}
	}
	return false
}

// promDuration is Prometheus's duration syntax (1d, 1h30m, 500ms).
var promDuration = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)

// alertRules is the shape of a Prometheus rule file; unknown fields fail.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertsAndDashboardUseRealMetrics: docs/alerts.yml is a well-formed rule
// file and docs/dashboard.json a dashboard, and every pgbox_ metric either
// names is one pgboxprom exports.
func TestAlertsAndDashboardUseRealMetrics(t *testing.T) {
	t.Parallel()
	names := metricNames(t)

	raw := read(t, "docs/alerts.yml")
	var rules alertRules
	dec := yaml.NewDecoder(strings.NewReader(raw))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&rules), "docs/alerts.yml")
	alerts := map[string]bool{}
	var exprs string
	for _, g := range rules.Groups {
		require.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: a rule without a name", g.Name)
			require.False(t, alerts[r.Alert], "alert %s twice", r.Alert)
			alerts[r.Alert] = true
			exprs += r.Expr + "\n"
			require.Regexp(t, pgboxIdentRe, r.Expr, "alert %s watches no pgbox metric", r.Alert)
			require.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"], "alert %s: severity", r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], "alert %s: summary", r.Alert)
			if r.For != "" {
				require.Regexp(t, promDuration, r.For, "alert %s: for", r.Alert)
			}
		}
	}
	// The alerts issues 13 and 26 ask for, by what they watch.
	for _, m := range []string{"pgbox_outbox_oldest_unpublished_age_seconds", "pgbox_outbox_parked_rows",
		"pgbox_consumer_dead_letter_rows", "pgbox_inbox_oldest_key_age_seconds", "pgbox_relay_lanes_unowned",
		"pgbox_xmin_horizon_age_seconds", "pgbox_xmin_horizon_age_transactions"} {
		watched := regexp.MustCompile(`\b` + m + `\b`)
		require.True(t, watched.MatchString(exprs), "docs/alerts.yml has no rule over %s", m)
	}

	rawDash := read(t, "docs/dashboard.json")
	var dash struct {
		Title  string           `json:"title"`
		Panels []map[string]any `json:"panels"`
	}
	require.NoError(t, json.Unmarshal([]byte(rawDash), &dash), "docs/dashboard.json")
	require.NotEmpty(t, dash.Title)
	targets := 0
	for _, p := range dash.Panels {
		tgs, _ := p["targets"].([]any)
		for _, tg := range tgs {
			expr, _ := tg.(map[string]any)["expr"].(string)
			require.Regexp(t, pgboxIdentRe, expr, "panel %v", p["title"])
			targets++
		}
	}
	require.Greater(t, targets, 20)

	for file, text := range map[string]string{"docs/alerts.yml": raw, "docs/dashboard.json": rawDash} {
		used := map[string]bool{}
		for _, name := range pgboxIdentRe.FindAllString(text, -1) {
			require.True(t, isMetric(names, name), "%s names %s, which pgboxprom does not export", file, name)
			used[name] = true
		}
		require.NotEmpty(t, used, file)
	}
}

// TestDocsNameRealMetricsAndTables: every pgbox_ identifier in the Markdown
// docs is a metric pgboxprom exports or a name the migrations create (or the
// goose table, or the demo's schema).
func TestDocsNameRealMetricsAndTables(t *testing.T) {
	t.Parallel()
	known := metricNames(t)
	entries, err := os.ReadDir(filepath.Join(root, "migrations"))
	require.NoError(t, err)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			for _, n := range pgboxIdentRe.FindAllString(read(t, "migrations/"+e.Name()), -1) {
				known[n] = true
			}
		}
	}
	known[migrations.TableName] = true
	known["pgbox_demo"] = true // the demo's schema
	for path, doc := range markdown(t) {
		for _, n := range pgboxIdentRe.FindAllString(doc, -1) {
			require.True(t, isMetric(known, n), "%s names %s: neither a metric pgboxprom exports nor a name the migrations create", path, n)
		}
	}
}

// formatValue writes a default as the docs do: durations in their largest
// whole unit (24h, 10s, 250ms), cleanup.Forever as "forever".
func formatValue(v any) string {
	d, ok := v.(time.Duration)
	if !ok {
		return fmt.Sprint(v)
	}
	switch {
	case d == cleanup.Forever:
		return "forever"
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	default:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	}
}

// TestLibraryDefaults: docs/operations.md's table of library defaults quotes
// every exported XxxDefault constant, with its value.
func TestLibraryDefaults(t *testing.T) {
	t.Parallel()
	constants := map[string]any{
		"relay.LanesDefault":                relay.LanesDefault,
		"relay.BatchSizeDefault":            relay.BatchSizeDefault,
		"relay.PollIntervalDefault":         relay.PollIntervalDefault,
		"relay.BusyPollIntervalDefault":     relay.BusyPollIntervalDefault,
		"relay.HeartbeatIntervalDefault":    relay.HeartbeatIntervalDefault,
		"relay.LeaseTTLDefault":             relay.LeaseTTLDefault,
		"relay.MaxAttemptsDefault":          relay.MaxAttemptsDefault,
		"relay.MaxBackoffDefault":           relay.MaxBackoffDefault,
		"relay.UnknownTopicWindowDefault":   relay.UnknownTopicWindowDefault,
		"relay.KafkaOutageAlertDefault":     relay.KafkaOutageAlertDefault,
		"relay.SweepIntervalDefault":        relay.SweepIntervalDefault,
		"relay.StopTimeoutDefault":          relay.StopTimeoutDefault,
		"relay.MaxMessageBytesDefault":      relay.MaxMessageBytesDefault,
		"outbox.MaxBytesDefault":            outbox.MaxBytesDefault,
		"outbox.ChannelDefault":             outbox.ChannelDefault,
		"inbox.BatchSizeDefault":            inbox.BatchSizeDefault,
		"inbox.BatchWaitDefault":            inbox.BatchWaitDefault,
		"inbox.MaxAttemptsDefault":          inbox.MaxAttemptsDefault,
		"inbox.RetryBackoffDefault":         inbox.RetryBackoffDefault,
		"inbox.MaxRetryBackoffDefault":      inbox.MaxRetryBackoffDefault,
		"inbox.DeadLetterSuffixDefault":     inbox.DeadLetterSuffixDefault,
		"inbox.DrainTimeoutDefault":         inbox.DrainTimeoutDefault,
		"inboxfranz.CommitIntervalDefault":  inboxfranz.CommitIntervalDefault,
		"inboxfranz.LeaveTimeoutDefault":    inboxfranz.LeaveTimeoutDefault,
		"cleanup.BufferDefault":             cleanup.BufferDefault,
		"cleanup.BatchSizeDefault":          cleanup.BatchSizeDefault,
		"cleanup.PauseDefault":              cleanup.PauseDefault,
		"cleanup.IntervalDefault":           cleanup.IntervalDefault,
		"cleanup.KafkaTimeoutDefault":       cleanup.KafkaTimeoutDefault,
		"cleanup.ParkedDefault":             cleanup.ParkedDefault,
		"cleanup.DeadLettersDefault":        cleanup.DeadLettersDefault,
		"cleanup.AttemptsDefault":           cleanup.AttemptsDefault,
		"inbox.LockTimeoutDefault":          inbox.LockTimeoutDefault,
		"inbox.DedupDefault":                inbox.DedupDefault,
		"inspect.ExactLimitDefault":         inspect.ExactLimitDefault,
		"inspect.StatementTimeoutDefault":   inspect.StatementTimeoutDefault,
		"inspect.ParkedListDefault":         inspect.ParkedListDefault,
		"inspect.HorizonListDefault":        inspect.HorizonListDefault,
		"inspect.ListLimitDefault":          inspect.ListLimitDefault,
		"inspect.OpsBatchDefault":           inspect.OpsBatchDefault,
		"inspect.HeldScanDefault":           inspect.HeldScanDefault,
		"inspect.StoryLimitDefault":         inspect.StoryLimitDefault,
		"console.MaxActionRowsDefault":      console.MaxActionRowsDefault,
		"console.QueryTimeoutDefault":       console.QueryTimeoutDefault,
		"console.KafkaWaitDefault":          console.KafkaWaitDefault,
		"console.SummaryConcurrencyDefault": console.SummaryConcurrencyDefault,
		"console.SummaryTimeoutDefault":     console.SummaryTimeoutDefault,
		"console.SummaryMaxAgeDefault":      console.SummaryMaxAgeDefault,
		"pgboxprom.ScrapeTimeoutDefault":    pgboxprom.ScrapeTimeoutDefault,
		"pgboxprom.LatencyPollDefault":      pgboxprom.LatencyPollDefault,
	}
	for _, name := range exportedDefaults(t) {
		_, ok := constants[name]
		require.True(t, ok, "%s is not in this test's table (add it here and to docs/operations.md)", name)
	}
	doc := read(t, "docs/operations.md")
	rowRe := regexp.MustCompile("(?m)^\\| `([a-z]+\\.[A-Za-z]+Default)` \\| `([^`]*)` \\|")
	seen := map[string]bool{}
	for _, m := range rowRe.FindAllStringSubmatch(doc, -1) {
		v, ok := constants[m[1]]
		require.True(t, ok, "docs/operations.md quotes %s, which this test does not know (add it here)", m[1])
		require.Equal(t, formatValue(v), m[2], "docs/operations.md: %s", m[1])
		seen[m[1]] = true
	}
	var missing []string
	for name := range constants {
		if !seen[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "docs/operations.md's library defaults table lacks these constants")
}

// exportedDefaults lists the XxxDefault constants the library packages
// declare (cmd/, examples/ and every internal/ package excluded: they are
// no API), as package.Name.
func exportedDefaults(t *testing.T) []string {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^\t([A-Z][A-Za-z0-9]*Default)\b[^=\n]*=`)
	var out []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || rel == "cmd" || rel == "examples" || d.Name() == "internal" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := filepath.Base(filepath.Dir(path))
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			out = append(out, pkg+"."+m[1])
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, len(out), 25, "the source scan found too few defaults")
	return out
}

// TestRelativeLinksResolve: every relative link of the Markdown docs points
// at a file of the tree.
func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	link := regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`)
	for path, doc := range markdown(t) {
		for _, m := range link.FindAllStringSubmatch(doc, -1) {
			target := filepath.Join(root, filepath.Dir(path), m[1])
			_, err := os.Stat(target)
			require.NoError(t, err, "%s links to %s", path, m[1])
		}
	}
}
