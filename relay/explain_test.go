package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
)

// The claim query probes each owned slot through pgbox_outbox_claim_idx and
// never scans the table, however large the backlog (doc.go shows the plan on
// 10M rows). Here: 300k rows, a third parked.
func TestClaimQueryUsesIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, parked_at)
		SELECT gen_random_uuid(), g % 256, 'events', ('k' || g)::bytea, '\x00'::bytea,
		       CASE WHEN g % 3 = 0 THEN now() END
		FROM generate_series(1, 300000) g;
		INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at, epoch)
		SELECT g, 16, CASE WHEN g < 4 THEN 'me' ELSE 'other' END, now() + interval '1 hour', g + 1
		FROM generate_series(0, 15) g;
		ANALYZE pgbox_outbox; ANALYZE pgbox_relay_lanes;`)
	require.NoError(t, err)

	rows, err := db.Pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) "+claimSQL, "me", 500, 16, allSlots(0), 62)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	t.Log("\n" + text)
	require.Contains(t, text, "Index Scan using pgbox_outbox_claim_idx on pgbox_outbox")
	// Whether a parked row holds a row back: one probe of the parked rows' index.
	require.Contains(t, text, "Index Scan using pgbox_outbox_parked_key_idx on pgbox_outbox")
	require.NotContains(t, text, "Seq Scan on pgbox_outbox")
	require.NotContains(t, text, "Bitmap Heap Scan on pgbox_outbox")

	// And the claim returns the right rows: only owned lanes, unparked, oldest first per slot.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r := &Relay{cfg: Config{Pool: db.Pool, BatchSize: 500, Lanes: 16}, id: "me"}
	got, err := r.claim(cctx, allSlots(0))
	require.NoError(t, err)
	require.Len(t, got, 500)
	last := map[int16]int64{}
	for _, x := range got {
		require.Less(t, slot.Lane(int(x.slot), 16), 4, "slot %d belongs to an owned lane", x.slot)
		require.NotZero(t, x.id%3, "parked rows are skipped") // g % 3 = 0 were parked; id = g
		require.Greater(t, x.id, last[x.slot], "id order within a slot")
		last[x.slot] = x.id
		require.Equal(t, int64(slot.Lane(int(x.slot), 16))+1, x.epoch, "the claim's lane is slot.Lane's")
	}
}

// With a few hot keys the slot statistics are skewed, and a claim written
// as slot = s AND id > bound ORDER BY id made the planner walk the primary
// key in id order for every slot, filtering on slot: seconds per claim on
// an empty slot of a large table. The claim's row comparison keeps it on
// pgbox_outbox_claim_idx, in the custom plans of the first executions and
// in the generic plan after them.
func TestClaimQueryUsesIndexWithHotKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), (g % 10) * 7, 'events', ('k' || g % 10)::bytea, '\x00'::bytea
		FROM generate_series(1, 100000) g;
		INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at, epoch)
		SELECT g, 16, 'me', now() + interval '1 hour', g + 1 FROM generate_series(0, 15) g;
		ANALYZE pgbox_outbox; ANALYZE pgbox_relay_lanes;`)
	require.NoError(t, err)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release() // a failed check must not leave the pool waiting at cleanup
		_, err = conn.Exec(ctx, "SET plan_cache_mode = "+mode)
		require.NoError(t, err)
		rows, err := conn.Query(ctx, "EXPLAIN (COSTS OFF) "+claimSQL, "me", 500, 16, allSlots(0), 125)
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		_, err = conn.Exec(ctx, "RESET plan_cache_mode")
		require.NoError(t, err)
		text := strings.Join(plan, "\n")
		require.Contains(t, text, "Index Scan using pgbox_outbox_claim_idx on pgbox_outbox", mode+":\n"+text)
		require.NotContains(t, text, "pgbox_outbox_pkey", mode+":\n"+text)
		require.NotContains(t, text, "Bitmap Heap Scan on pgbox_outbox", mode+":\n"+text)
	}
}
