package relay

// Second review of 00160 after 6b5bbfe: the rekeyed trigger
// (pgbox_outbox_rewind_rekeyed, AFTER UPDATE OF key, topic, slot) and the
// finish's coalesce(o.parked_at, ...) / "o.parked_at = now() AS parked".

import (
	"context"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

func (g *finishRig) rewinds() int {
	g.t.Helper()
	var n int
	require.NoError(g.t, g.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_outbox_rewinds`).Scan(&n))
	return n
}

// Which statements write a rewind through 00120's triggers: a parked row
// unparked or deleted, one rewind each. Not an INSERT (parked or not, slot
// filled by the BEFORE INSERT trigger or given), not an UPDATE of a row's
// key, topic or slot, parked or not (a rekeyed parked row's held rows go
// out at the sweep: docs/outbox-sql.md), not the relay's finish (its SET
// names attempts, last_error, failing_since and parked_at only) whether it
// parks the row, keeps a park made from outside, or counts a failure.
// (The review wrote it for 00160 with a rekey trigger, since dropped: a
// writer's own insert-then-update stalled every claim behind its
// transaction, TestAttack160cWriterRekeyInOpenTransactionStallsClaims.)
func TestAttack160bRewindTriggersFireOnlyWhereTheyShould(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 2, 0)
	step := func(what string, want int, sql string, args ...any) {
		t.Helper()
		before := g.rewinds()
		g.exec(sql, args...)
		require.Equal(t, want, g.rewinds()-before, what)
	}
	step("insert parked, slot filled", 0, `INSERT INTO pgbox_outbox (topic, key, value, parked_at) VALUES ('t', 'p1', 'parked', now())`)
	step("insert parked, slot given", 0, `INSERT INTO pgbox_outbox (topic, key, value, slot, parked_at) VALUES ('t', 'p2', 'parked', pgbox_outbox_slot('p2', NULL), now())`)
	step("insert parked, keyless", 0, `INSERT INTO pgbox_outbox (topic, value, parked_at) VALUES ('t', 'parked', now())`)
	step("key, topic, slot set to themselves", 0, `UPDATE pgbox_outbox SET key = key, topic = topic, slot = slot WHERE value = 'parked'`)
	step("key set to NULL on a keyless parked row", 0, `UPDATE pgbox_outbox SET key = NULL WHERE key IS NULL AND value = 'parked'`)
	step("an unparked row's key changed", 0, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'u', 'live');
		UPDATE pgbox_outbox SET key = 'u2', topic = 't2', slot = 7 WHERE value = 'live'`)
	g.exec(`DELETE FROM pgbox_outbox WHERE value = 'live'`)
	step("a parked row's key changed", 0, `UPDATE pgbox_outbox SET key = 'p1b' WHERE key = 'p1'`)
	step("a parked row moved to another slot", 0, `UPDATE pgbox_outbox SET slot = (slot + 1) % 256 WHERE key = 'p2'`)
	step("merge changing a parked row's key", 0, `MERGE INTO pgbox_outbox o USING (SELECT 'p1b'::bytea AS k) s ON o.key = s.k
		WHEN MATCHED THEN UPDATE SET key = 'p1c'`)
	step("merge changing a parked row's topic", 0, `MERGE INTO pgbox_outbox o USING (SELECT 'p1c'::bytea AS k) s ON o.key = s.k
		WHEN MATCHED THEN UPDATE SET topic = 'other'`)
	step("key changed and unparked at once", 1, `UPDATE pgbox_outbox SET key = 'p1d', parked_at = NULL WHERE key = 'p1c'`)
	g.exec(`DELETE FROM pgbox_outbox`)

	// The relay's finish: a failure counted (attempt 1 of 2), then parked
	// by the relay (attempt 2), on a row of its own.
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'poison')`)
	before := g.rewinds()
	rows := g.claim()
	require.Len(t, rows, 1)
	g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge})
	require.Zero(t, g.r.parked.Load())
	rows = g.claim()
	require.Len(t, rows, 1)
	g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge})
	require.EqualValues(t, 1, g.r.parked.Load(), "the relay's own park is reported")
	require.Equal(t, before, g.rewinds(), "the finish writes no rewind")
	got := g.rows()
	require.Len(t, got, 1)
	require.True(t, got[0].Parked)
	g.exec(`DELETE FROM pgbox_outbox`)

	// A row parked from outside while it is sent, whose send fails: kept
	// parked, not reported parked by the relay, no rewind.
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k2', 'poison')`)
	rows = g.claim()
	require.Len(t, rows, 1)
	g.exec(`UPDATE pgbox_outbox SET parked_at = now() - interval '1 hour' WHERE id = $1`, rows[0].id)
	before = g.rewinds()
	g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge})
	require.EqualValues(t, 1, g.r.parked.Load(), "a park from outside is not the relay's")
	require.Equal(t, before, g.rewinds())
	var kept bool
	require.NoError(t, g.db.Pool.QueryRow(context.Background(),
		`SELECT parked_at < now() - interval '59 minutes' FROM pgbox_outbox WHERE id = $1`, rows[0].id).Scan(&kept))
	require.True(t, kept, "the operator's timestamp stays")

	// The same, at MaxAttempts: the relay's rule would park it too, but the
	// park is the operator's: not reported.
	g.exec(`DELETE FROM pgbox_outbox`)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value, attempts) VALUES ('t', 'k3', 'poison', 1)`)
	rows = g.claim()
	require.Len(t, rows, 1)
	g.exec(`UPDATE pgbox_outbox SET parked_at = now() WHERE id = $1`, rows[0].id)
	g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge})
	require.EqualValues(t, 1, g.r.parked.Load(), "a park from outside is not the relay's, even at MaxAttempts")

	// Its send succeeds: deleted, and the deleted-parked trigger writes its
	// rewind (00120).
	g.exec(`DELETE FROM pgbox_outbox`)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k4', 'fine')`)
	rows = g.claim()
	require.Len(t, rows, 1)
	g.exec(`UPDATE pgbox_outbox SET parked_at = now() WHERE id = $1`, rows[0].id)
	before = g.rewinds()
	g.finish(rows, map[int]error{0: nil})
	require.Empty(t, g.rows())
	require.Equal(t, before+1, g.rewinds())
}

// A row parked from outside while the relay sends it, whose send then
// fails permanently below MaxAttempts: 6b5bbfe keeps the park, and does not
// report it parked (right: the relay did not park it), but finish counts
// it in Retried (len(badIDs) - parked), "row sends that failed and were
// left for a later pass" (outbox/relay.go, pgbox_relay_retried_total): no
// later pass will send it; it waits for an operator. FAILS on 6b5bbfe
// (Retried 1).
func TestAttack160bRowParkedFromOutsideIsNotCountedRetried(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'poison')`)
	rows := g.claim()
	require.Len(t, rows, 1)
	g.exec(`UPDATE pgbox_outbox SET parked_at = now(), last_error = 'parked by an operator' WHERE id = $1`, rows[0].id)
	g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge})
	require.True(t, g.rows()[0].Parked)
	require.Empty(t, g.claim(), "no later pass sends it")
	st := g.r.Stats()
	require.Zero(t, st.Parked, "not parked by the relay")
	require.Zero(t, st.Retried, "counted as left for a later pass, though it waits for an operator")
}
