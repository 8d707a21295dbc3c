package inspect_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
	"github.com/pgbox/pgbox/relay/lane"
)

// inspect reports lanes and slots with the facts of their owners (the
// lane default and lane formula: relay; the slot count: outbox), never a
// copy that could drift: its sources hold no slot count and no lane
// formula of their own.
func TestInspectUsesTheRelaysFacts(t *testing.T) {
	t.Parallel()
	require.Equal(t, relay.LanesDefault, inspect.LanesDefault)
	for slot := range outbox.Slots {
		require.Equal(t, relay.LaneOf(slot, 7), lane.Of(slot, 7))
	}
	copies := map[string]*regexp.Regexp{
		"the slot count (outbox.Slots)":         regexp.MustCompile(`\b(256|255)\b`),
		"the lane formula (relay.LaneOf)":       regexp.MustCompile(`(?i)slot\w*\s*%|%\s*(\$\d|\w*lane)`),
		"the lane default (relay.LanesDefault)": regexp.MustCompile(`LanesDefault\s*=\s*\d`),
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
