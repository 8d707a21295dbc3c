// Package archtest keeps the package table of DESIGN.md true: which pgbox
// package may import what.
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

// TestOnlyExamplesAndTestsImportKfake: the embedded broker is for the demo
// and tests (the end-to-end harness runs it as its own process); no library
// or binary code links it.
func TestOnlyExamplesAndTestsImportKfake(t *testing.T) {
	t.Parallel()
	for _, p := range listAll(t) {
		r := rel(p.ImportPath)
		if strings.HasPrefix(r, "examples/") || strings.HasPrefix(r, "integration_test/") || r == "internal/kafkatest" || r == "inbox/internal/consumetest" {
			continue
		}
		require.Empty(t, importsPrefix(p.Imports, kfake), "%s imports kfake outside a _test file", p.ImportPath)
	}
	for _, d := range deps(t, module+"/cmd/relay") {
		require.NotEqual(t, kfake, d, "the production binary links kfake")
	}
}

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
		if r == "pgboxprom" || strings.HasPrefix(r, "cmd/") || strings.HasPrefix(r, "examples/") {
			continue
		}
		require.Empty(t, importsPrefix(p.Imports, prometheus), "%s imports the Prometheus client", p.ImportPath)
	}
	for _, lib := range []string{"inbox", "outbox", "relay", "cleanup", "migrations", "inspect"} {
		for _, d := range deps(t, module+"/"+lib) {
			require.False(t, strings.HasPrefix(d, prometheus), "%s links %s", lib, d)
			require.NotEqual(t, kfake, d, "%s links kfake", lib)
		}
	}
}

// TestInboxCoreHasNoSarama: Inbox.Process needs pgx only; the sarama
// consumer-group adapter lives in its own package.
func TestInboxCoreHasNoSarama(t *testing.T) {
	t.Parallel()
	for _, d := range deps(t, module+"/inbox") {
		require.NotEqual(t, sarama, d, "package inbox links sarama: the consumer adapter belongs in inbox/inboxsarama")
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

// TestConsumerAdaptersLinkOnlyTheirClient: the consumer loop the adapters
// share links no Kafka client, and each adapter links only its own, so a
// service on franz-go never links sarama and the reverse.
func TestConsumerAdaptersLinkOnlyTheirClient(t *testing.T) {
	t.Parallel()
	const franz = "github.com/twmb/franz-go"
	isClient := func(d, client string) bool { return d == client || strings.HasPrefix(d, client+"/") }
	for pkg, banned := range map[string][]string{
		"inbox":                  {sarama, franz},
		"inbox/internal/consume": {sarama, franz},
		"inbox/inboxsarama":      {franz},
		"inbox/inboxfranz":       {sarama},
	} {
		for _, d := range deps(t, module+"/"+pkg) {
			for _, b := range banned {
				require.False(t, isClient(d, b), "%s links %s", pkg, d)
			}
		}
	}
}

// TestCleanupLinksNoKafkaClient: the cleaner reads Kafka through
// cleanup.Admin, a client-neutral interface (cleanup/internal/cleanupadmin), so a service embeds cleanup (and
// inspect, which reads its cutoffs) with either client and links only the
// one it chose: cleanupsarama links sarama, cleanupkgo franz-go, neither the
// other. pgboxprom reaches cleanup without its sarama implementation.
func TestCleanupLinksNoKafkaClient(t *testing.T) {
	t.Parallel()
	const franz = "github.com/twmb/franz-go/"
	for _, lib := range []string{"cleanup", "cleanup/internal/cleanupadmin", "inspect"} {
		for _, d := range deps(t, module+"/"+lib) {
			require.False(t, d == sarama || strings.HasPrefix(d, sarama+"/"), "%s links %s: the cleaner's Kafka client belongs in cleanup/cleanupsarama", lib, d)
			require.False(t, strings.HasPrefix(d, franz), "%s links %s: the cleaner's Kafka client belongs in cleanup/cleanupkgo", lib, d)
		}
	}
	for _, d := range deps(t, module+"/cleanup/cleanupkgo") {
		require.False(t, d == sarama || strings.HasPrefix(d, sarama+"/"), "cleanup/cleanupkgo links %s", d)
	}
	for _, d := range deps(t, module+"/cleanup/cleanupsarama") {
		require.False(t, strings.HasPrefix(d, franz), "cleanup/cleanupsarama links %s", d)
	}
	for _, d := range deps(t, module+"/pgboxprom") {
		require.NotEqual(t, module+"/cleanup/cleanupsarama", d, "pgboxprom links sarama through cleanup")
	}
}
