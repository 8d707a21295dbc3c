package archtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// oldName is the binary's name before it followed the design card
// (cmd/relay/). Spelled in two halves so this file does not trip its own test.
const oldName = "pgbox-" + "relay"

// labelLines lists, per file, the lines where the old name is allowed: labels
// that identify pgbox to other systems, not the command. A line of that file
// may name it when it contains one of the markers.
var labelLines = map[string][]string{
	// The Kafka client.id the brokers see (sarama's config and the binary's
	// --kafka-client-id default, and its row in the settings table).
	"relay/config.go":      {"c.ClientID = "},
	"cmd/relay/options.go": {"kafkaClientIDDefault"},
	"docs/operations.md":   {"`--kafka-client-id`"},
	// PostgreSQL's application_name (pg_stat_activity).
	"cmd/relay/db.go":                {"dbconf.Config("},
	"internal/dbconf/dbconf_test.go": {"Config(", "application_name"},
	// The scale run counts the relay's connections by application_name.
	"integration_test/tenants_test.go":        {"application_name", "connections at the end"},
	"integration_test/tenants_report_test.go": {"pg_stat_activity"},
	"docs/tenants-scale.md":                   {"pg_stat_activity"},
	// The Prometheus alert group, and the PrometheusRule generated from it.
	"docs/alerts.yml":                       {"- name: "},
	"deploy/kubernetes/prometheusrule.yaml": {"- name: "},
	// Builds the relay of an older commit, where the command had its old
	// name (the marker is the script's own comment and loop).
	"scripts/bench-against.sh": {"became cmd/relay", "for pkg in", "no relay command"},
}

// root is the module's root directory, from this package's.
var root = filepath.Join("..", "..")

// TestBinaryIsCalledRelay: `go install …/cmd/relay` makes a binary named
// relay, `make build` writes bin/relay, and no code, doc, script or test
// calls the command by its old name; only the labels in labelLines keep it.
func TestBinaryIsCalledRelay(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", "{{.Name}} {{.Target}}", module+"/cmd/relay").Output()
	require.NoError(t, err)
	f := strings.Fields(string(out))
	require.Len(t, f, 2, "go list: %q", out)
	require.Equal(t, "main", f[0])
	require.Equal(t, "relay", filepath.Base(f[1]), "go install …/cmd/relay names the binary after its directory")

	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	require.Contains(t, string(makefile), "-o bin/relay ./cmd/relay", "make build writes bin/relay")

	_, err = os.Stat(filepath.Join(root, "cmd", oldName))
	require.True(t, os.IsNotExist(err), "cmd/%s still exists", oldName)

	var bad []string
	eachLine(t, func(rel string, n int, line string) {
		if strings.Contains(line, oldName) && !isLabel(rel, line) {
			bad = append(bad, rel+":"+strconv.Itoa(n)+": "+strings.TrimSpace(line))
		}
	})
	require.Empty(t, bad, "the binary is `relay` (cmd/relay); these lines call it %s. A label that identifies pgbox to another system goes in labelLines", oldName)
}

func isLabel(rel, line string) bool {
	for _, m := range labelLines[rel] {
		if strings.Contains(line, m) {
			return true
		}
	}
	return false
}

// eachLine calls fn for every line of every text file of the tree (dot
// directories but CI's, bin/, go.sum and binaries left out), with its path relative to
// the root and its 1-based number.
func eachLine(t *testing.T, fn func(rel string, n int, line string)) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			// Dot directories (.git, .pgbox data) and build outputs are not
			// the project's text; CI's are.
			ci := d.Name() == ".ci" || d.Name() == ".github"
			if rel != "." && (strings.HasPrefix(d.Name(), ".") && !ci || rel == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if rel == "go.sum" || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // a binary (a built relay, a test binary): not source
		}
		files++
		for i, line := range strings.Split(string(b), "\n") {
			fn(rel, i+1, line)
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 100, "the tree walk found too few files")
}
