package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// reloptions are table's storage parameters in db's schema.
func reloptions(t *testing.T, db *testdb.DB, table string) []string {
	t.Helper()
	var opts []string
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(c.reloptions, '{}') FROM pg_class c WHERE c.relname = $1 AND c.relnamespace = $2::regnamespace`,
		table, db.Schema).Scan(&opts))
	return opts
}

// Migration 00150 makes the tables the relay reads at every claim due for
// autovacuum after 5,000 or 100,000 dead or changed rows rather than 50 (each pass replans every
// statement over them in every backend); its Down restores PostgreSQL's
// defaults and keeps the scale factors 00002 set and an operator's own
// settings.
func TestQuietAutovacuumThresholds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Empty(t)
	sqlDB := db.SQL(t)
	require.NoError(t, migrations.Up(ctx, sqlDB))

	want := map[string][]string{
		"pgbox_outbox": {"autovacuum_vacuum_threshold=5000", "autovacuum_vacuum_insert_threshold=5000",
			"autovacuum_analyze_threshold=10000"},
		"pgbox_relay_history": {"autovacuum_vacuum_threshold=5000", "autovacuum_vacuum_insert_threshold=5000",
			"autovacuum_analyze_threshold=10000"},
		"pgbox_relay_lanes":     {"autovacuum_vacuum_threshold=100000", "autovacuum_analyze_threshold=100000"},
		"pgbox_relay_marker":    {"autovacuum_vacuum_threshold=100000", "autovacuum_analyze_threshold=100000"},
		"pgbox_relay_instances": {"autovacuum_vacuum_threshold=100000", "autovacuum_analyze_threshold=100000"},
	}
	outboxScale := []string{"autovacuum_vacuum_scale_factor=0.01", "autovacuum_analyze_scale_factor=0.02", "autovacuum_vacuum_cost_delay=0"}
	for table, opts := range want {
		require.Subset(t, reloptions(t, db, table), opts, table)
	}
	require.Subset(t, reloptions(t, db, "pgbox_outbox"), outboxScale, "00002's settings stay")

	downTo(t, sqlDB, "00150_quiet_autovacuum.sql")
	plan, err := migrations.Down(ctx, sqlDB, migrations.DownConfig{})
	require.NoError(t, err)
	require.Equal(t, "00150_quiet_autovacuum.sql", plan.Source)
	for table, opts := range want {
		got := reloptions(t, db, table)
		for _, o := range opts {
			require.NotContains(t, got, o, table)
		}
	}
	require.ElementsMatch(t, outboxScale, reloptions(t, db, "pgbox_outbox"), "Down keeps 00002's settings")

	// An operator's own setting of another parameter survives Up.
	_, err = db.Pool.Exec(ctx, `ALTER TABLE pgbox_outbox SET (autovacuum_vacuum_cost_limit = 500)`)
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.Subset(t, reloptions(t, db, "pgbox_outbox"), append(want["pgbox_outbox"], "autovacuum_vacuum_cost_limit=500"))
}
