package inspect_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// inspect reports lanes and slots with the facts the outbox writer and the
// relay use (internal/slot: the slot count, the lane formula, the lane
// default), never a copy that could drift: its sources hold none of them.
func TestInspectUsesTheSlotFacts(t *testing.T) {
	t.Parallel()
	copies := map[string]*regexp.Regexp{
		"the slot count (slot.Count)":          regexp.MustCompile(`\b(256|255)\b`),
		"the lane formula (slot.Lane)":         regexp.MustCompile(`(?i)slot\w*\s*%|%\s*(\$\d|\w*lane)`),
		"the lane default (slot.LanesDefault)": regexp.MustCompile(`Lanes\s*=\s*\d|LanesDefault\s*=`),
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for what, re := range copies {
			require.Nil(t, re.Find(src), "%s copies %s: %q", f, what, re.Find(src))
		}
	}
}
