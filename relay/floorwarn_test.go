package relay_test

// Issue 32 case 6: the floor's warnings are true, name the cause and the
// fix, come again whenever the state changes (not once per process), and
// relay.Stats().FloorOff says why floors are off.

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testutil"
)

// warnRelay runs a relay on pool whose log goes to the returned buffer.
func warnRelay(t *testing.T, b *testBundle, pool *pgxpool.Pool) (*running, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	cfg := b.configWithPool(pool, "warn")
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return start(t, cfg), logs
}

// floorWarnings counts the WARN lines about the floor that name cause.
func floorWarnings(logs *lockedBuffer, cause string) int {
	n := 0
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "floor_off="+cause) {
			n++
		}
	}
	return n
}

func anyFloorWarning(logs *lockedBuffer) []string {
	var out []string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "level=WARN") && (strings.Contains(l, "floor") || strings.Contains(l, "sequence")) {
			out = append(out, l)
		}
	}
	return out
}

// A fresh schema (the demo's first run): the sequence has handed out
// nothing; no warning, floors on.
func TestFloorWarnFreshSchemaIsQuiet(t *testing.T) {
	b := setup(t)
	rr, logs := warnRelay(t, b, b.db.Pool)
	waitFor(t, "the relay holds its lanes", func() bool { return rr.r.Stats().Lanes == 8 })
	time.Sleep(2 * time.Second) // several polls with nothing written
	require.Empty(t, anyFloorWarning(logs), "no floor warning on a fresh schema")
	require.Empty(t, floorOffOf(rr.r))
	b.write(t, msg("events", "k", "1"))
	_ = readTopic(t, b, "events", 1)
	time.Sleep(time.Second)
	require.Empty(t, anyFloorWarning(logs), "nor after the first row")
}

// A cached sequence is named with its fix, each time it is set (not once
// per process); floors come back when it is undone, and Stats says why
// they are off meanwhile.
func TestFloorWarnCachedSequenceEveryTime(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	rr, logs := warnRelay(t, b, b.db.Pool)
	waitFor(t, "the relay holds its lanes", func() bool { return rr.r.Stats().Lanes == 8 })
	for round := 1; round <= 2; round++ {
		_, err := b.db.Pool.Exec(ctx, `ALTER SEQUENCE pgbox_outbox_id_seq CACHE 20`)
		require.NoError(t, err)
		waitFor(t, "the cache warning", func() bool { return floorWarnings(logs, "cache") == round })
		require.Contains(t, logs.String(), "ALTER SEQUENCE pgbox_outbox_id_seq CACHE 1", "the warning names the fix")
		require.Equal(t, "cache", floorOffOf(rr.r))
		_, err = b.db.Pool.Exec(ctx, `ALTER SEQUENCE pgbox_outbox_id_seq CACHE 1`)
		require.NoError(t, err)
		waitFor(t, "floors on again", func() bool { return floorOffOf(rr.r) == "" })
	}
}

// A relay role granted as docs/operations.md says, then denied the outbox
// sequence: the warning names the missing privilege and the GRANT, each
// time the privilege goes.
func TestFloorWarnSequencePrivilegeEveryTime(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	role := testutil.NewRole(t, b.db)
	pool, err := pgxpool.New(ctx, role.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rr, logs := warnRelay(t, b, pool)
	waitFor(t, "the relay holds its lanes", func() bool { return rr.r.Stats().Lanes == 8 })
	time.Sleep(time.Second)
	require.Empty(t, anyFloorWarning(logs), "a role granted as documented: floors on, no warning")
	for round := 1; round <= 2; round++ {
		_, err := b.db.Pool.Exec(ctx, `REVOKE ALL ON SEQUENCE pgbox_outbox_id_seq FROM `+role.Name)
		require.NoError(t, err)
		waitFor(t, "the privilege warning", func() bool { return floorWarnings(logs, "privilege") == round })
		require.Contains(t, logs.String(), "GRANT SELECT ON SEQUENCE pgbox_outbox_id_seq", "the warning names the fix")
		require.Equal(t, "privilege", floorOffOf(rr.r))
		_, err = b.db.Pool.Exec(ctx, `GRANT SELECT ON SEQUENCE pgbox_outbox_id_seq TO `+role.Name)
		require.NoError(t, err)
		waitFor(t, "floors on again", func() bool { return floorOffOf(rr.r) == "" })
	}
	b.write(t, msg("events", "k", "1"))
	require.Len(t, readTopic(t, b, "events", 1), 1, "the relay publishes throughout")
}

// Attack: the relay's role was granted on ALL TABLES before migration
// 00120 created pgbox_relay_marker (GRANT ... ON ALL TABLES covers the
// tables that exist when it runs), so it may not touch the marker. The
// claim says floors are off ("marker") and goes on publishing; it must not
// fail every pass.
func TestFloorWarnMarkerPrivilegeKeepsPublishing(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	role := testutil.NewRole(t, b.db)
	_, err := b.db.Pool.Exec(ctx, `REVOKE ALL ON pgbox_relay_marker FROM `+role.Name)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, role.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rr, logs := warnRelay(t, b, pool)
	b.write(t, msg("events", "k", "1"))
	got := readTopic(t, b, "events", 1)
	require.Len(t, got, 1, "the relay publishes without the marker (logs:\n%s)", tail(logs.String(), 2000))
	waitFor(t, "the marker warning", func() bool { return floorWarnings(logs, "marker") >= 1 })
	require.Equal(t, "marker", floorOffOf(rr.r))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
