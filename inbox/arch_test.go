package inbox_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// inbox is the core a service on any Kafka client (or none) links: its
// non-test dependencies hold no Kafka client. The sarama adapter lives in
// inbox/inboxsarama.
func TestInboxDoesNotImportSarama(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/pgbox/pgbox/inbox").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/jackc/pgx/v5", "the listing is the real one")
	for _, d := range deps {
		for _, banned := range []string{"github.com/IBM/sarama", "github.com/twmb/franz-go"} {
			require.False(t, d == banned || strings.HasPrefix(d, banned+"/"), "inbox depends on %s", d)
		}
	}
}
