package relay

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
)

// claimPlans calls the claim function n times on a connection of its own
// with auto_explain reporting the plans of the statements inside it, and
// returns the plans of its per-slot probes (RETURN QUERY). plpgsql plans a
// statement afresh for its first five calls and may switch to a cached
// generic plan after them: n > 5 sees both.
func claimPlans(t *testing.T, db *testdb.DB, n int, args ...any) []string {
	t.Helper()
	ctx := context.Background()
	var super bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super))
	require.True(t, super, "this test loads auto_explain to see the plans inside the claim function: it needs a superuser (make test's private cluster is one)")
	cfg := db.Pool.Config().ConnConfig.Copy()
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, q := range []string{`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_nested_statements = on`, `SET auto_explain.log_level = notice`} {
		_, err = conn.Exec(ctx, q)
		require.NoError(t, err)
	}
	for range n {
		rows, err := conn.Query(ctx, claimSQL, args...)
		require.NoError(t, err)
		rows.Close()
		require.NoError(t, rows.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	var plans []string
	for _, m := range notices {
		if strings.Contains(m, "CROSS JOIN LATERAL") {
			plans = append(plans, m)
		}
	}
	require.Len(t, plans, n, "one per-slot probe plan per call")
	return plans
}

// requireIndexPlans checks that every probe walks pgbox_outbox_claim_idx
// and nothing scans the table or builds a bitmap over it.
func requireIndexPlans(t *testing.T, state string, plans []string) {
	t.Helper()
	for i, p := range plans {
		require.Contains(t, p, "Index Scan using pgbox_outbox_claim_idx on pgbox_outbox c", "%s, call %d:\n%s", state, i+1, p)
		require.NotContains(t, p, "Seq Scan on pgbox_outbox", "%s, call %d:\n%s", state, i+1, p)
		require.NotContains(t, p, "Bitmap Heap Scan on pgbox_outbox", "%s, call %d:\n%s", state, i+1, p)
	}
}

func ownAllLanes(t *testing.T, db *testdb.DB, owned int) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at, epoch)
		SELECT g, 16, CASE WHEN g < $1 THEN 'me' ELSE 'other' END, now() + interval '1 hour', g + 1
		FROM generate_series(0, 15) g`, owned)
	require.NoError(t, err)
	_, err = db.Pool.Exec(context.Background(), `ANALYZE pgbox_relay_lanes`)
	require.NoError(t, err)
}

// The claim probes each owned slot through pgbox_outbox_claim_idx and never
// scans the table, however large the backlog (doc.go shows the plan on 10M
// rows). Here: 300k rows, a third parked, so the parked-key probe runs too.
func TestClaimQueryUsesIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, parked_at)
		SELECT gen_random_uuid(), g % 256, 'events', ('k' || g)::bytea, '\x00'::bytea,
		       CASE WHEN g % 3 = 0 THEN now() END
		FROM generate_series(1, 300000) g;
		ANALYZE pgbox_outbox`)
	require.NoError(t, err)
	ownAllLanes(t, db, 4)

	r := testRelay(Config{Pool: db.Pool, BatchSize: 500, Lanes: 16}, "me")
	plans := claimPlans(t, db, 7, r.testClaimArgs(nil, 62, 500)...)
	t.Log("\n" + plans[len(plans)-1])
	requireIndexPlans(t, "300k rows, a third parked", plans)
	require.Contains(t, plans[0], "Index Scan using pgbox_outbox_parked_key_idx on pgbox_outbox p",
		"whether a parked row holds a row back: one probe of the parked rows' index")

	// And the claim returns the right rows: only owned lanes, unparked, oldest first per slot.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := r.claimSlots(cctx, r.floors.order(nil))
	require.NoError(t, err)
	require.Len(t, got.rows, 500)
	require.Len(t, got.meta.slots, 64, "every slot of the 4 owned lanes is described")
	last := map[int16]int64{}
	for _, x := range got.rows {
		require.Less(t, slot.Lane(int(x.slot), 16), 4, "slot %d belongs to an owned lane", x.slot)
		require.NotZero(t, x.id%3, "parked rows are skipped") // g % 3 = 0 were parked; id = g
		require.Greater(t, x.id, last[x.slot], "id order within a slot")
		last[x.slot] = x.id
		require.Equal(t, int64(slot.Lane(int(x.slot), 16))+1, x.epoch, "the claim's lane is slot.Lane's")
	}
}

// The states that flipped the claim's cached generic plan off the index
// (a sequential scan per slot, or a bitmap scan that never marks dead index
// entries): a bloated heap, a heap emptied by VACUUM beside a large index,
// a burst arriving on a table analyzed while nearly empty, and a few hot
// keys skewing the slot statistics. After ANALYZE of each, the claim's
// probes, in their first custom plans and in the generic plan after them,
// walk pgbox_outbox_claim_idx.
func TestClaimPlanCannotFlip(t *testing.T) {
	t.Parallel()
	states := []struct {
		name, sql string
	}{
		{"bloated heap", `
			INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), g % 256, 'events', ('k' || g % 1000)::bytea, repeat('x', 200)::bytea
			FROM generate_series(1, 200000) g;
			DELETE FROM pgbox_outbox WHERE id % 100 <> 0;
			ANALYZE pgbox_outbox`},
		{"emptied heap beside a large index", `
			INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), g % 256, 'events', ('k' || g % 1000)::bytea, repeat('x', 200)::bytea
			FROM generate_series(1, 200000) g;
			DELETE FROM pgbox_outbox;
			VACUUM pgbox_outbox;
			INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), g % 256, 'events', ('k' || g)::bytea, '\x00'::bytea FROM generate_series(1, 50) g;
			ANALYZE pgbox_outbox`},
		{"burst on a table analyzed nearly empty", `
			INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), g % 256, 'events', ('k' || g)::bytea, '\x00'::bytea FROM generate_series(1, 10) g;
			ANALYZE pgbox_outbox;
			INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), g % 256, 'events', ('k' || g % 1000)::bytea, repeat('x', 200)::bytea
			FROM generate_series(1, 200000) g`},
		{"a few hot keys", `
			INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), (g % 10) * 7, 'events', ('k' || g % 10)::bytea, '\x00'::bytea
			FROM generate_series(1, 100000) g;
			ANALYZE pgbox_outbox`},
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			for _, q := range strings.Split(st.sql, ";") {
				_, err := db.Pool.Exec(context.Background(), q)
				require.NoError(t, err, q)
			}
			ownAllLanes(t, db, 16)
			r := testRelay(Config{Pool: db.Pool, BatchSize: 2000, Lanes: 16}, "me")
			requireIndexPlans(t, st.name, claimPlans(t, db, 7, r.testClaimArgs(nil, 500, 2000)...))
		})
	}
}
