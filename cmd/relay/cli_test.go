package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox"
)

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	db := []string{"DATABASE_URL=postgres://alice:hunter2@127.0.0.1:1/db"}
	cases := []struct {
		name string
		env  []string
		args []string
		want []string // all must appear in stderr
	}{
		{"no command", nil, nil, []string{"Usage: relay <command>"}},
		{"unknown command", nil, []string{"frobnicate"}, []string{`unknown command "frobnicate"`, "run, migrate"}},
		{"unknown flag", db, []string{"migrate", "up", "--lanes", "3"}, []string{"-lanes", "relay migrate --help"}},
		{"missing database", nil, []string{"migrate", "up"}, []string{"DATABASE_URL", "--database-url"}},
		{"migrate without action", db, []string{"migrate"}, []string{"up, down or status"}},
		{"migrate bad action", db, []string{"migrate", "sideways"}, []string{"up, down or status", "sideways"}},
		{"bad env enum", append(db, "PGBOX_LOG_FORMAT=xml"), []string{"migrate", "status"},
			[]string{`"xml"`, "PGBOX_LOG_FORMAT", "--log-format", `"text", "json"`}},
		{"bad flag enum", db, []string{"migrate", "status", "--log-level=loud"},
			[]string{`"loud"`, "--log-level", "PGBOX_LOG_LEVEL", `"debug", "info", "warn", "error"`}},
		{"bad duration env", append(db, "KAFKA_BROKERS=127.0.0.1:9092", "PGBOX_CLEANUP_INTERVAL=soon"), []string{"run"},
			[]string{`"soon"`, "PGBOX_CLEANUP_INTERVAL", "a duration"}},
		{"negative duration", append(db, "KAFKA_BROKERS=127.0.0.1:9092"), []string{"run", "--shutdown-timeout=-1s"},
			[]string{"--shutdown-timeout", "PGBOX_SHUTDOWN_TIMEOUT", "at least"}},
		{"int out of range", append(db, "KAFKA_BROKERS=127.0.0.1:9092", "PGBOX_CLEANUP_BATCH_SIZE=0"), []string{"cleanup"},
			[]string{"PGBOX_CLEANUP_BATCH_SIZE", "from 1 to 100000"}},
		{"missing brokers", db, []string{"run"}, []string{"KAFKA_BROKERS", "--kafka-brokers"}},
		{"broker without port", append(db, "KAFKA_BROKERS=kafka1"), []string{"cleanup"}, []string{`"kafka1"`, "host:port"}},
		{"bad kafka version", append(db, "KAFKA_BROKERS=k:9092", "PGBOX_KAFKA_VERSION=banana"), []string{"cleanup"},
			[]string{"PGBOX_KAFKA_VERSION", "like 0.11.0, 2.8"}},
		{"sasl mechanism unknown", append(db, "KAFKA_BROKERS=k:9092", "PGBOX_KAFKA_SASL_MECHANISM=GSSAPI"), []string{"cleanup"},
			[]string{"PGBOX_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"}},
		{"sasl without password", append(db, "KAFKA_BROKERS=k:9092", "PGBOX_KAFKA_SASL_MECHANISM=PLAIN", "PGBOX_KAFKA_SASL_USER=u"), []string{"cleanup"},
			[]string{"PGBOX_KAFKA_SASL_PASSWORD"}},
		{"tls cert without key", append(db, "KAFKA_BROKERS=k:9092", "PGBOX_KAFKA_TLS_CERT=/c.pem"), []string{"cleanup"},
			[]string{"PGBOX_KAFKA_TLS_KEY", "together"}},
		{"bad bool", append(db, "KAFKA_BROKERS=k:9092"), []string{"cleanup", "--dry-run=perhaps"},
			[]string{"--dry-run", "true or false"}},
		{"version with args", nil, []string{"version", "extra"}, []string{"no arguments"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runRelay(t, time.Minute, tc.env, tc.args...)
			require.Equal(t, 2, r.Code, "stderr: %s", r.Stderr)
			for _, w := range tc.want {
				require.Contains(t, r.Stderr, w)
			}
			require.NotContains(t, r.Stderr+r.Stdout, "hunter2", "a password reached the output")
		})
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://alice:hunter2@127.0.0.1:1/db", "KAFKA_BROKERS=k:9092",
		"PGBOX_KAFKA_SASL_MECHANISM=PLAIN", "PGBOX_KAFKA_SASL_USER=u", "PGBOX_KAFKA_SASL_PASSWORD=sw0rdfish"}
	// A bad value in a secret setting: the message names it, not its value.
	r := runRelay(t, time.Minute, env, "cleanup", "--kafka-sasl-password=", "--kafka-sasl-mechanism=SCRAM-SHA-1")
	require.Equal(t, 2, r.Code)
	require.Contains(t, r.Stderr, "--kafka-sasl-mechanism")

	// Unreachable database: the error is printed with the DSN redacted.
	r = runRelay(t, time.Minute, env, "cleanup", "--log-format=json")
	require.Equal(t, 1, r.Code, r.Stderr)
	out := r.Stdout + r.Stderr
	require.NotContains(t, out, "hunter2")
	require.NotContains(t, out, "sw0rdfish")
	require.Contains(t, out, "alice:xxxxx@")
	// --log-format=json: the log lines are JSON objects with snake_case keys.
	var logLines int
	for _, line := range strings.Split(r.Stderr, "\n") {
		if strings.HasPrefix(line, "{") {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &m), line)
			require.Equal(t, "ERROR", m["level"])
			require.Contains(t, m, "err")
			logLines++
		}
	}
	require.Positive(t, logLines)
}

func TestHelpListsEverySetting(t *testing.T) {
	t.Parallel()
	r := runRelay(t, time.Minute, nil, "--help")
	require.Equal(t, 0, r.Code, r.Stderr)
	opts := &options{}
	set := newSettings()
	opts.bind(set, allGroups...)
	require.Greater(t, len(set.list), 30)
	for _, st := range set.list {
		line := ""
		for _, l := range strings.Split(r.Stdout, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "--"+st.name+" ") {
				line = l
			}
		}
		require.NotEmpty(t, line, "--help does not list --%s", st.name)
		require.Contains(t, line, st.env)
		require.Contains(t, line, "default ")
	}
	for _, c := range commands {
		require.Contains(t, r.Stdout, c.synopsis)
		sub := runRelay(t, time.Minute, nil, c.name, "--help")
		require.Equal(t, 0, sub.Code, sub.Stderr)
		require.Contains(t, sub.Stdout, "Usage: relay "+c.synopsis)
	}
}

// TestHelpSummariesAreSentences: `relay --help` gives each command one whole
// sentence (it used to show the first line of a longer text, cut mid-sentence).
func TestHelpSummariesAreSentences(t *testing.T) {
	t.Parallel()
	r := runRelay(t, time.Minute, nil, "--help")
	require.Equal(t, 0, r.Code, r.Stderr)
	for _, c := range commands {
		line := ""
		for _, l := range strings.Split(r.Stdout, "\n") {
			if strings.HasPrefix(l, "  "+c.synopsis+" ") {
				line = strings.TrimSpace(strings.TrimPrefix(l, "  "+c.synopsis))
			}
		}
		require.NotEmpty(t, line, "--help lists no %s", c.synopsis)
		require.Regexp(t, `^[A-Z][^:]*\.$`, line, "%s: a summary is one whole sentence", c.name)
		require.Equal(t, 1, strings.Count(line, "."), "%s: one sentence: %q", c.name, line)
	}
}

func TestFlagBeatsEnv(t *testing.T) {
	t.Parallel()
	opts := &options{}
	set := newSettings()
	opts.bind(set, allGroups...)
	env := map[string]string{"PGBOX_CLEANUP_INTERVAL": "5m", "PGBOX_LOG_FORMAT": "json", "KAFKA_BROKERS": "a:1, b:2"}
	pos, err := set.parse("run", []string{"migrate-arg", "--cleanup-interval=0", "x"}, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"migrate-arg", "x"}, pos)
	require.Equal(t, time.Duration(0), opts.CleanupInterval, "the flag wins over the environment")
	require.Equal(t, "json", opts.LogFormat, "the environment wins over the default")
	require.Equal(t, []string{"a:1", "b:2"}, opts.Kafka.Brokers)
	require.Equal(t, cleanupBufferDefault, opts.CleanupBuffer, "default when neither is set")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := runRelay(t, time.Minute, nil, "version")
	require.Equal(t, 0, r.Code, r.Stderr)
	// The release is pgbox.Version (which CHANGELOG.md's newest entry
	// names: the root package's TestChangelogNamesVersion).
	require.Equal(t, "relay "+pgbox.Version, strings.SplitN(r.Stdout, "\n", 2)[0])
	require.Contains(t, r.Stdout, "schema "+schemaVersion())
	require.NotEqual(t, "none", schemaVersion())
}

// TestDocsListEverySetting keeps docs/operations.md's configuration table in
// step with the binary's settings: a row per setting, with its environment
// variable, and the default and description --help shows, word for word.
func TestDocsListEverySetting(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	require.NoError(t, err)
	doc := string(b)
	opts := &options{}
	set := newSettings()
	opts.bind(set, allGroups...)
	var missing []string
	defer func() {
		require.Empty(t, missing, "docs/operations.md lacks these rows (the meaning is --help's text, word for word):\n%s", strings.Join(missing, ""))
	}()
	for _, st := range set.list {
		if st.group == "Demo" {
			continue // no command reads them: the demo has its own (docs/demo.md)
		}
		def := "`" + st.def + "`"
		if st.def == "" {
			def = "—"
		}
		row := "| `--" + st.name + "` | `" + st.env + "` | " + def + " | " + strings.ReplaceAll(st.help(), "|", `\|`) + " |\n"
		if !strings.Contains(doc, row) {
			missing = append(missing, row)
		}
	}
}

// TestLibrariesDoNotImportKfake: only cmd/ and tests may depend on the
// embedded broker; a service importing pgbox's libraries never builds it.
func TestLibrariesDoNotImportKfake(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/pgbox/pgbox/inbox", "github.com/pgbox/pgbox/outbox",
		"github.com/pgbox/pgbox/relay", "github.com/pgbox/pgbox/cleanup", "github.com/pgbox/pgbox/migrations").CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "github.com/IBM/sarama", "go list -deps output looks wrong")
	require.NotContains(t, string(out), "franz-go/pkg/kfake")
	require.NotContains(t, string(out), "prometheus", "the Prometheus client is the binary's only")
}
