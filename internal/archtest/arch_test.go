// Package archtest holds pgbox's architecture rules, all in one place: which
// package may import or link what (CONTRIBUTING.md, "Package layout"): the
// Kafka clients every package may link (kafkaClients, TestKafkaClients),
// Prometheus and OpenTelemetry each in its own package, inspect and the
// console reading through their narrow imports; and the module-wide source
// rules (one settings word, SQLSTATEs only in internal/pgerr, no registry
// address, one binary name). Add a rule here when you add a boundary.
package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/pgbox/pgbox"

// pkg is what `go list -json` says about one package.
type pkg struct {
	ImportPath   string
	Imports      []string // non-test imports
	TestImports  []string
	XTestImports []string
	Deps         []string
}

// listAll lists every package of the module, tests' imports included.
func listAll(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "-deps=false", module+"/...").Output()
	require.NoError(t, err)
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for {
		var p pkg
		err := dec.Decode(&p)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		pkgs = append(pkgs, p)
	}
	require.Greater(t, len(pkgs), 8, "go list output looks wrong")
	return pkgs
}

// deps lists the packages path links, transitively (non-test).
func deps(t *testing.T, path string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", path).Output()
	require.NoError(t, err)
	return strings.Fields(string(out))
}

func importsPrefix(imports []string, prefix string) string {
	for _, i := range imports {
		if strings.HasPrefix(i, prefix) {
			return i
		}
	}
	return ""
}

const (
	kfake      = "github.com/twmb/franz-go/pkg/kfake"
	sarama     = "github.com/IBM/sarama"
	prometheus = "github.com/prometheus/"
)

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

// TestConsumetestOnlyInTests: the consumer tests' world (a broker, a
// schema) is imported by _test files only.
func TestConsumetestOnlyInTests(t *testing.T) {
	t.Parallel()
	for _, p := range listAll(t) {
		require.NotContains(t, p.Imports, module+"/inbox/internal/consumetest", "%s imports consumetest outside a _test file", p.ImportPath)
	}
}

// TestOnlyPgboxpromImportsPrometheus: the Prometheus client is pgboxprom's
// (and the binary's, and examples') alone.
func TestOnlyPgboxpromImportsPrometheus(t *testing.T) {
	t.Parallel()
	for _, p := range listAll(t) {
		r := rel(p.ImportPath)
		// internal/promtest reads collectors in tests; only _test files
		// import it (below).
		if r == "pgboxprom" || r == "internal/promtest" || strings.HasPrefix(r, "cmd/") || strings.HasPrefix(r, "examples/") {
			continue
		}
		require.Empty(t, importsPrefix(p.Imports, prometheus), "%s imports the Prometheus client", p.ImportPath)
		require.NotContains(t, p.Imports, module+"/internal/promtest", "%s imports promtest outside a _test file", p.ImportPath)
	}
	for _, lib := range []string{"inbox", "outbox", "relay", "cleanup", "migrations", "inspect"} {
		for _, d := range deps(t, module+"/"+lib) {
			require.False(t, strings.HasPrefix(d, prometheus), "%s links %s", lib, d)
		}
	}
}

// TestInspectImportsPgxAndCleanupOnly: the inspection package reads the
// database and cleanup's cutoffs; its dead-letter replay writes through the
// outbox and names inbox's replay header; it reports lanes with the slot
// facts the relay uses (internal/slot). Nothing else of pgbox.
func TestInspectImportsPgxAndCleanupOnly(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+"/inspect").Output()
	require.NoError(t, err)
	for _, i := range strings.Fields(string(out)) {
		if strings.HasPrefix(i, module+"/internal/") {
			continue
		}
		if strings.HasPrefix(i, module+"/") {
			require.Contains(t, []string{module + "/cleanup", module + "/outbox", module + "/inbox"}, i, "inspect imports %s", i)
		} else if strings.Contains(i, ".") {
			require.True(t, strings.HasPrefix(i, "github.com/jackc/pgx/v5"), "inspect imports %s", i)
		}
	}
}

// TestConsoleGoesThroughInspect: the console shows and does everything
// through inspect (cleanup for the types of its rules and stats, outbox for
// header types); it links no Kafka client and no Prometheus, and none of the
// packages that write (relay, inbox) directly.
func TestConsoleGoesThroughInspect(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+"/console").Output()
	require.NoError(t, err)
	for _, i := range strings.Fields(string(out)) {
		if strings.HasPrefix(i, module+"/") {
			require.Contains(t, []string{module + "/inspect", module + "/cleanup", module + "/outbox"}, i, "console imports %s", i)
		} else if strings.Contains(i, ".") {
			require.Contains(t, []string{"github.com/jackc/pgx/v5", "golang.org/x/crypto/bcrypt"}, i, "console imports %s", i)
		}
	}
}

// TestOnlyPgboxotelLinksOpenTelemetry: OpenTelemetry is pgboxotel's
// dependency alone (and its sub-packages'): no other package of the module,
// the binary included, links it.
func TestOnlyPgboxotelLinksOpenTelemetry(t *testing.T) {
	t.Parallel()
	const otel = "go.opentelemetry.io/"
	sawOtel := false
	for _, p := range listAll(t) {
		r := rel(p.ImportPath)
		if r == "pgboxotel" || strings.HasPrefix(r, "pgboxotel/") {
			sawOtel = sawOtel || importsPrefix(p.Imports, otel) != ""
			continue
		}
		for _, d := range p.Deps {
			require.False(t, strings.HasPrefix(d, otel), "%s links %s", r, d)
		}
	}
	require.True(t, sawOtel, "pgboxotel imports no OpenTelemetry package: the listing is not the real one")
}
