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

// Rows parked by anyone but the relay (an INSERT that sets parked_at, an
// UPDATE of it from a script or another service) hold their key's later
// rows as the relay's own parking does. Until 00160 the claim asked
// whether any keyed row is parked in a statement of its own, in an older
// snapshot than the statement that reads the rows: a parked row and a
// later row of its key committed between the two let the later row out
// while the earlier one waited (the review of 00150). The window is the
// question's own run time, which a held snapshot over many rows that left
// the parked rows' index stretches to milliseconds, as it can in
// production (pg_dump, a long report): here, while the claim asks, a
// writer commits such a pair
// ("insert": the earlier row inserted parked) or a script parks the earlier
// of two rows written before the claim began ("update").
//
// 00150's claim is attacked the same way and must lose: if the attack
// stopped reproducing the race there, it would prove nothing of 00160.
func TestClaimSeesParkedRowsInItsOwnSnapshot(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		version int64 // 0: every migration
		old     bool
	}{{"00150", 150, true}, {"latest", 0, false}} {
		for _, how := range []string{"insert", "update"} {
			t.Run(c.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				out, tries := parkedPairRace(t, c.version, how)
				if c.old {
					require.Positive(t, out, "the attack did not reproduce 00150's race in %d tries: it proves nothing", tries)
					return
				}
				require.Zero(t, out, "a row left its key's parked earlier row behind in %d of %d tries", out, tries)
			})
		}
	}
}

// claim2SQL claims every slot of the lanes 'x' holds through
// pgbox_outbox_claim2, returning the claimed rows' keys and values.
const claim2SQL = `SELECT key, convert_from(value, 'UTF8') FROM pgbox_outbox_claim2('x', 16,
	(SELECT array_agg(g) FROM generate_series(0, 255) g), array_fill(0::bigint, ARRAY[256]), array_fill(0::bigint, ARRAY[256]),
	NULL, 0, 0, 0, '{}', false, 100, 1000) WHERE id IS NOT NULL`

// parkedPairRace runs the attack (how: "insert" or "update") on a schema
// migrated to version (0: every migration) with pgbox_outbox_claim2, and
// returns in how many of its tries the claim returned a key's later row
// without its earlier one (parked).
func parkedPairRace(t *testing.T, version int64, how string) (out, tries int) {
	t.Helper()
	return parkedPairRaceOn(t, version, claim2SQL, how)
}

// parkedPairRaceOn is parkedPairRace with the claim statement claim (the
// claimed rows' keys and values, for lanes 'x' holds).
func parkedPairRaceOn(t *testing.T, version int64, claim, how string) (out, tries int) {
	t.Helper()
	ctx := context.Background()
	db := testdb.Empty(t)
	p, err := migrations.NewProvider(db.SQL(t), migrations.Config{})
	require.NoError(t, err)
	if version == 0 {
		_, err = p.Up(ctx)
	} else {
		_, err = p.UpTo(ctx, version)
	}
	require.NoError(t, err)
	for _, s := range []string{
		`ALTER TABLE pgbox_outbox SET (autovacuum_enabled = off)`,
		`INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at) SELECT g, 16, 'x', now() + interval '1 hour' FROM generate_series(0, 15) g`,
		`INSERT INTO pgbox_outbox (topic, key, value, parked_at) SELECT 'dead', convert_to('d' || g, 'UTF8'), 'v', now() FROM generate_series(1, 60000) g`,
	} {
		_, err := db.Pool.Exec(ctx, s)
		require.NoError(t, err)
	}
	// The parked rows leave the question's index (their keys cleared: no
	// rewind, they stay parked), and a snapshot held from before keeps
	// every one of their entries there for the question to step over.
	hold, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(ctx) })
	var n int
	require.NoError(t, hold.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
	_, err = db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET key = NULL WHERE topic = 'dead'`)
	require.NoError(t, err)

	// How long the claim takes here (the least of three, planned), so the
	// pair commits inside its question, not after its claim query began;
	// the tries spread over the first half of that.
	took := time.Hour
	for range 3 {
		t0 := time.Now()
		_, err = db.Pool.Exec(ctx, claim)
		require.NoError(t, err)
		took = min(took, time.Since(t0))
	}
	// A key's two rows, the earlier parked at $2 (NULL: not parked).
	const pair = `INSERT INTO pgbox_outbox (topic, key, value, parked_at)
		VALUES ('t', convert_to($1, 'UTF8'), 'earlier', $2), ('t', convert_to($1, 'UTF8'), 'later', NULL)`
	for tries = range 30 {
		type claimed struct {
			earlier, later bool // the key's rows claimed
			err            error
		}
		done := make(chan claimed, 1)
		key := fmt.Sprintf("k%d", tries)
		var earlier int64
		if how == "update" {
			// The first row returned is the first inserted, the earlier.
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
		if c.later && !c.earlier { // both claimed: published in order
			out++
		}
		_, err = db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox WHERE topic = 't'`)
		require.NoError(t, err)
	}
	t.Logf("version %d, %s: claim %v, the later row out first in %d of %d tries", version, how, took, out, tries+1)
	return out, tries + 1
}
