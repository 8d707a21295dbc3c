package pgbox_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox"
)

// The newest release CHANGELOG.md names is the one the code reports
// (`relay version` prints pgbox.Version: cmd/relay.TestVersion).
func TestChangelogNamesVersion(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+\S*)`).FindSubmatch(b)
	require.NotNil(t, m, "CHANGELOG.md has no release heading like \"## v1.2.3\"")
	require.Equal(t, pgbox.Version, string(m[1]), "CHANGELOG.md's newest release and pgbox.Version differ")
	require.Regexp(t, `^v\d+\.\d+\.\d+$`, pgbox.Version, "pgbox.Version is a semantic version with a leading v")
}
