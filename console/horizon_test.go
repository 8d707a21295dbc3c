package console_test

import (
	"context"
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
	ctx := context.Background()
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET application_name = 'console-horizon-holder'`)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM pgbox_outbox`)
	require.NoError(t, err)

	over := b.as("vera", viewerPass).get(t, "/")
	require.Contains(t, over, `id="horizon-summary"`)
	require.Regexp(t, fmt.Sprintf(`<td>session</td><td class="n">%d</td><td>pgbox</td><td>pgbox</td><td>console-horizon-holder</td><td>idle in transaction</td>`, conn.Conn().PgConn().PID()), over)
	require.Contains(t, over, "pg_terminate_backend(pid)")
}
