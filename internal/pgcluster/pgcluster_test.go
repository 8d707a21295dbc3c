package pgcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/pgcluster"
)

// A committed row survives a crash restart (-m immediate) and a stop/start on
// the same port; a connection open across the crash is broken, a new one works.
func TestClusterSurvivesImmediateRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Settings: []string{"fsync = off"}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Destroy(false)) })
	require.NoError(t, c.CreateDatabase(ctx, "app"))

	conn, err := pgx.Connect(ctx, c.URL("app"))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (42)`)
	require.NoError(t, err)

	port := c.Port
	require.NoError(t, c.RestartImmediate(ctx))
	require.Equal(t, port, c.Port)
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "a connection open across the crash must be broken")
	_ = conn.Close(ctx)

	var v int
	conn, err = pgx.Connect(ctx, c.URL("app"))
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, `SELECT v FROM t`).Scan(&v))
	require.Equal(t, 42, v)
	_ = conn.Close(ctx)

	require.NoError(t, c.Stop(ctx))
	_, err = pgx.Connect(ctx, c.URL("app"))
	require.Error(t, err, "a stopped server refuses connections")
	require.NoError(t, c.StartAgain(ctx))
	conn, err = pgx.Connect(ctx, c.URL("app"))
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, `SELECT v FROM t`).Scan(&v))
	require.Equal(t, 42, v)
	_ = conn.Close(ctx)
}

func TestFindBinDirHonoursEnv(t *testing.T) {
	t.Setenv(pgcluster.BinDirEnv, t.TempDir())
	_, err := pgcluster.FindBinDir()
	require.ErrorContains(t, err, pgcluster.BinDirEnv)
}
