package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
	const claim2 = `SELECT key, convert_from(value, 'UTF8') FROM pgbox_outbox_claim2('x', 16,
		(SELECT array_agg(g) FROM generate_series(0, 255) g), array_fill(0::bigint, ARRAY[256]), array_fill(0::bigint, ARRAY[256]),
		NULL, 0, 0, 0, '{}', false, 100, 1000) WHERE id IS NOT NULL`
	for _, c := range []struct{ name, claim string }{{"pgbox_outbox_claim2", claim2}, {"pgbox_outbox_claim", legacy}} {
		for _, how := range []string{"insert", "update"} {
			t.Run(c.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				out, tries := parkedPairRaceOn(t, c.claim, how)
				require.Zero(t, out, "%s: a row left its key's parked earlier row behind in %d of %d tries", c.name, out, tries)
			})
		}
	}
}

// parkedPairRaceOn is parkedPairRace (parkedrace_test.go) on the latest
// schema with the claim statement claim (key and value of the claimed rows).
func parkedPairRaceOn(t *testing.T, claim, how string) (out, tries int) {
	t.Helper()
	ctx := context.Background()
	db := testdb.New(t)
	for _, s := range []string{
		`ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`,
		`INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at) SELECT g, 16, 'x', now() + interval '1 hour' FROM generate_series(0, 15) g`,
		`INSERT INTO pgbox_outbox (topic, key, value, parked_at) SELECT 'dead', convert_to('d' || g, 'UTF8'), 'v', now() FROM generate_series(1, 60000) g`,
	} {
		_, err := db.Pool.Exec(ctx, s)
		require.NoError(t, err)
	}
	hold, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(ctx) })
	var n int
	require.NoError(t, hold.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET key = NULL WHERE topic = 'dead'`)
	require.NoError(t, err)

	took := time.Hour
	for range 3 {
		t0 := time.Now()
		_, err = db.Pool.Exec(ctx, claim)
		require.NoError(t, err)
		took = min(took, time.Since(t0))
	}
	const pair = `INSERT INTO pgbox_outbox (topic, key, value, parked_at)
		VALUES ('t', convert_to($1, 'UTF8'), 'earlier', $2), ('t', convert_to($1, 'UTF8'), 'later', NULL)`
	for tries = range 30 {
		type claimed struct {
			earlier, later bool
			err            error
		}
		done := make(chan claimed, 1)
		key := fmt.Sprintf("k%d", tries)
		var earlier int64
		if how == "update" {
			require.NoError(t, db.Pool.QueryRow(ctx, pair+` RETURNING id`, key, nil).Scan(&earlier))
		}
		go func() {
			rows, err := db.Pool.Query(ctx, claim)
			if err != nil {
				done <- claimed{err: err}
				return
			}
			var c claimed
			var k []byte
			var v string
			_, c.err = pgx.ForEachRow(rows, []any{&k, &v}, func() error {
				c.earlier = c.earlier || (string(k) == key && v == "earlier")
				c.later = c.later || (string(k) == key && v == "later")
				return nil
			})
			done <- c
		}()
		time.Sleep(took * time.Duration(1+tries%5) / 10)
		if how == "update" {
			_, err = db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = now(), last_error = 'parked by a script' WHERE id = $1`, earlier)
		} else {
			_, err = db.Pool.Exec(ctx, pair, key, time.Now())
		}
		require.NoError(t, err)
		c := <-done
		require.NoError(t, c.err)
		if c.later && !c.earlier {
			out++
		}
		_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox WHERE topic = 't'`)
		require.NoError(t, err)
	}
	t.Logf("%s: claim %v, the later row out first in %d of %d tries", how, took, out, tries+1)
	return out, tries + 1
}

// Review of 00160: Down then Up again, twice, on a schema with rows, parked
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
		_, err = p.Down(ctx)
		require.NoError(t, err)
		check(fmt.Sprintf("down %d", i+1), false)
		_, err = p.Up(ctx)
		require.NoError(t, err)
		check(fmt.Sprintf("up %d", i+1), true)
	}
}
