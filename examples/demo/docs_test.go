package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocsListEveryDemoSetting keeps docs/demo.md's settings table in step
// with the demo's own flags: every PGBOX_DEMO_ setting has a row with its
// environment variable and its default.
func TestDocsListEveryDemoSetting(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "demo.md"))
	require.NoError(t, err)
	doc := string(b)

	var help bytes.Buffer
	_, err = parseOptions([]string{"-help"}, &help, func(string) string { return "" })
	require.Error(t, err, "-help returns flag.ErrHelp")
	// flag.PrintDefaults: "  -orders int\n    \tunique orders ... (env PGBOX_DEMO_ORDERS) (default 2000)"
	flagRe := regexp.MustCompile(`(?m)^  -([a-z-]+)[^\n]*\n((?:    \t[^\n]*\n?)+)`)
	envRe := regexp.MustCompile(`\(env (PGBOX_DEMO_[A-Z_]+)\)(?: \(default (.+?)\))?\s*$`)
	var n int
	for _, m := range flagRe.FindAllStringSubmatch(help.String(), -1) {
		usage := strings.Join(strings.Fields(m[2]), " ")
		e := envRe.FindStringSubmatch(usage)
		if e == nil {
			continue
		}
		def := strings.Trim(e[2], `"`)
		if def == "" {
			def = "false" // PrintDefaults omits false booleans' defaults
		}
		row := "| `--" + m[1] + "` | `" + e[1] + "` | `" + def + "` |"
		require.Contains(t, doc, row, "docs/demo.md has no row for --%s with its default", m[1])
		n++
	}
	require.GreaterOrEqual(t, n, 10, "the demo's --help output looks wrong:\n%s", help.String())
}
