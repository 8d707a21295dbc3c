package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// Review of 00160 (hostile). The schema keeps 00100's pgbox_outbox_claim
// for v0.1.0 relays (CHANGELOG: they keep working on the new schema, and
// rolling back the binaries may leave the schema as it is). Its body asks
// whether a keyed row is parked (v_parked) in a statement of its own, before
// the statement that reads the rows: the race 00160 closed in
// pgbox_outbox_claim2 is still open there. The same attack as
// TestClaimSeesParkedRowsInItsOwnSnapshot, on the latest schema, against
// the claim a v0.1.0 relay calls.
//
// This test FAILS on eb369ca: it proves the defect (the later row of a key
// returned without its earlier, parked, row).
func TestAttack160LegacyClaimSeesParkedRowsInItsOwnSnapshot(t *testing.T) {
	t.Parallel()
	const legacy = `SELECT key, convert_from(value, 'UTF8') FROM pgbox_outbox_claim('x', 16,
		(SELECT array_agg(g) FROM generate_series(0, 255) g), array_fill(0::bigint, ARRAY[256]), array_fill(0::bigint, ARRAY[256]),
		100, 1000) WHERE id IS NOT NULL`
	// The control: the same attack on the same schema against 00160's claim
	// finds nothing (TestClaimSeesParkedRowsInItsOwnSnapshot shows it
	// reproduces on 00150's).
	for _, c := range []struct{ name, claim string }{{"pgbox_outbox_claim2", claim2SQL}, {"pgbox_outbox_claim", legacy}} {
		for _, how := range []string{"insert", "update"} {
			t.Run(c.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				out, tries := parkedPairRaceOn(t, 0, c.claim, how)
				require.Zero(t, out, "%s: a row left its key's parked earlier row behind in %d of %d tries", c.name, out, tries)
			})
		}
	}
}

// Review of 00160: Down (to 00150) then Up again, twice, on a schema with rows, parked
// rows (keyed and keyless), a held row and a row of a parked key in another
// topic, while a connection that stands for a running relay keeps calling
// the claim and the sweep's look (plpgsql caches their plans per session):
// every version claims the same rows (the held one never) and names the
// same slots below the floors, the functions keep their call signatures,
// and the session picks up each body without an error.
func TestAttack160DownUpClaimsTheSame(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Empty(t)
	p, err := migrations.NewProvider(db.SQL(t), migrations.Config{})
	require.NoError(t, err)
	_, err = p.Up(ctx)
	require.NoError(t, err)
	var ids struct{ heldA, parkedA, otherA, b1, b2, parkedNil, nil1 int64 }
	for _, s := range []struct {
		q  string
		id *int64
	}{
		{`INSERT INTO pgbox_outbox (topic, key, value, parked_at) VALUES ('t', 'a', 'v', now()) RETURNING id`, &ids.parkedA},
		{`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'a', 'v') RETURNING id`, &ids.heldA},
		{`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('u', 'a', 'v') RETURNING id`, &ids.otherA},
		{`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'b', 'v') RETURNING id`, &ids.b1},
		{`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'b', 'v') RETURNING id`, &ids.b2},
		{`INSERT INTO pgbox_outbox (topic, key, value, parked_at) VALUES ('t', NULL, 'v', now()) RETURNING id`, &ids.parkedNil},
		{`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', NULL, 'v') RETURNING id`, &ids.nil1},
	} {
		require.NoError(t, db.Pool.QueryRow(ctx, s.q).Scan(s.id))
	}
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at)
		SELECT g, 16, 'x', now() + interval '1 hour' FROM generate_series(0, 15) g`)
	require.NoError(t, err)

	relay, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer relay.Release()
	claim := func(sweep bool) []int64 {
		t.Helper()
		rows, err := relay.Query(ctx, `SELECT id FROM pgbox_outbox_claim2('x', 16,
			(SELECT array_agg(g) FROM generate_series(0, 255) g), array_fill(0::bigint, ARRAY[256]), array_fill(0::bigint, ARRAY[256]),
			NULL, 0, 0, 0, '{}', $1, 100, 1000) WHERE id IS NOT NULL ORDER BY id`, sweep)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return got
	}
	below := func() []int32 {
		t.Helper()
		var got []int32
		require.NoError(t, relay.QueryRow(ctx, `SELECT pgbox_outbox_below_floor(
			(SELECT array_agg(g) FROM generate_series(0, 255) g), array_fill(1000000::bigint, ARRAY[256]))`).Scan(&got))
		return got
	}
	var slots []int32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT array_agg(DISTINCT slot::int ORDER BY slot::int) FROM pgbox_outbox
		WHERE id = ANY($1)`, []int64{ids.otherA, ids.b1, ids.b2, ids.nil1}).Scan(&slots))
	want := []int64{ids.otherA, ids.b1, ids.b2, ids.nil1}
	signature := func() string {
		t.Helper()
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT string_agg(p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') ' ||
			pg_get_function_result(p.oid), E'\n' ORDER BY p.proname)
			FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
			 AND p.proname IN ('pgbox_outbox_claim2', 'pgbox_outbox_below_floor')`).Scan(&s))
		return s
	}
	sig := signature()
	check := func(step string, latest bool) {
		t.Helper()
		var body bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT prosrc LIKE '%pk AS MATERIALIZED%' FROM pg_proc
			WHERE proname = 'pgbox_outbox_claim2' AND pronamespace = current_schema()::regnamespace`).Scan(&body))
		require.Equal(t, latest, body, "%s: 00160's body", step)
		require.Equal(t, sig, signature(), "%s: the call signatures a running relay uses", step)
		for range 7 { // past plpgsql's five custom plans, into the generic one
			require.Equal(t, want, claim(false), "%s: the held row (its key's earlier row parked) is never claimed", step)
			require.Equal(t, want, claim(true), "%s (sweep)", step)
			require.Equal(t, slots, below(), "%s: the slots with a claimable row below the floor", step)
		}
	}
	check("up", true)
	for i := range 2 {
		_, err = p.DownTo(ctx, 150) // 00160 and every later version
		require.NoError(t, err)
		check(fmt.Sprintf("down %d", i+1), false)
		_, err = p.Up(ctx)
		require.NoError(t, err)
		check(fmt.Sprintf("up %d", i+1), true)
	}
}
