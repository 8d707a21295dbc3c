package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// Review of 00150: Down then Up again, twice, with an operator's own
// settings on the tables (autovacuum off on the outbox, a cost limit on
// the lanes, a fillfactor on the history) and outbox rows present. Each
// Up sets 00150's thresholds, each Down removes them and nothing else:
// the operator's settings and 00002's scale factors stay, and no row is
// touched.
func TestAttack150DownUpKeepsOperatorSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Empty(t)
	sqlDB := db.SQL(t)
	require.NoError(t, migrations.Up(ctx, sqlDB))
	for _, s := range []string{
		`ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`,
		`ALTER TABLE pgbox_relay_lanes SET (autovacuum_vacuum_cost_limit = 500)`,
		`ALTER TABLE pgbox_relay_history SET (fillfactor = 90)`,
		`INSERT INTO pgbox_outbox (topic, key, value) SELECT 't', convert_to('k' || g, 'UTF8'), 'v' FROM generate_series(1, 100) g`,
	} {
		_, err := db.Pool.Exec(ctx, s)
		require.NoError(t, err)
	}
	operator := map[string]string{
		"pgbox_outbox":        "autovacuum_enabled=off",
		"pgbox_relay_lanes":   "autovacuum_vacuum_cost_limit=500",
		"pgbox_relay_history": "fillfactor=90",
	}
	outboxScale := []string{"autovacuum_vacuum_scale_factor=0.01", "autovacuum_analyze_scale_factor=0.02", "autovacuum_vacuum_cost_delay=0"}
	check := func(up bool) {
		t.Helper()
		for table, o := range operator {
			require.Contains(t, reloptions(t, db, table), o, "up %v: %s", up, table)
		}
		require.Subset(t, reloptions(t, db, "pgbox_outbox"), outboxScale, "up %v", up)
		has := func(table, o string) bool {
			for _, x := range reloptions(t, db, table) {
				if x == o {
					return true
				}
			}
			return false
		}
		require.Equal(t, up, has("pgbox_outbox", "autovacuum_vacuum_threshold=5000"), "up %v", up)
		require.Equal(t, up, has("pgbox_relay_history", "autovacuum_analyze_threshold=10000"), "up %v", up)
		require.Equal(t, up, has("pgbox_relay_lanes", "autovacuum_vacuum_threshold=100000"), "up %v", up)
		require.Equal(t, up, has("pgbox_relay_marker", "autovacuum_analyze_threshold=100000"), "up %v", up)
		require.Equal(t, up, has("pgbox_relay_instances", "autovacuum_vacuum_threshold=100000"), "up %v", up)
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
		require.Equal(t, 100, n)
	}
	check(true)
	for range 2 {
		downTo(t, sqlDB, "00150_quiet_autovacuum.sql")
		_, err := migrations.Down(ctx, sqlDB, migrations.DownConfig{Yes: true, Force: true})
		require.NoError(t, err)
		check(false)
		require.NoError(t, migrations.Up(ctx, sqlDB))
		check(true)
	}
}
