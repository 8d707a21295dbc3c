package console_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/console"
)

// TestOverviewShowsHorizonHolder: a session holding a REPEATABLE READ
// snapshot is listed in the overview's xmin-horizon section with its pid,
// application and state.
func TestOverviewShowsHorizonHolder(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.Inspect.HorizonList = 100000 })
	pid, _ := b.db.HoldSnapshot(t, "console-horizon-holder")

	over := b.as("vera", viewerPass).get(t, "/")
	require.Contains(t, over, `id="horizon-summary"`)
	require.Regexp(t, fmt.Sprintf(`<td>session</td><td class="n">%d</td><td>pgbox</td><td>pgbox</td><td>console-horizon-holder</td><td>idle in transaction</td>`, pid), over)
	require.Contains(t, over, "pg_terminate_backend(pid)")
}
