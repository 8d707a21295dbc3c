package relay_test

// Second review of 00170 (719dd04): seq_hw read stale in ways the
// transaction id F does not cover. Each test FAILS on 719dd04.

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// ATTACK B1. recorded()'s argument: "a writer that read an older seq_hw
// took its transaction id before the claim that raised seq_hw committed".
// Not under REPEATABLE READ or SERIALIZABLE: the writer's snapshot is taken
// at its transaction's first statement (a SELECT of business data, no
// transaction id yet), and the statement trigger's read of
// pgbox_relay_marker.seq_hw uses that snapshot, however late the INSERT
// comes. Here the writer's snapshot is taken before the relay raises
// seq_hw and settles a bound above it; the sequence is then set back (to
// the seq_hw the writer's snapshot holds, or anywhere above it); the
// writer's INSERT takes its transaction id now (above every sample's F),
// reads the old seq_hw, moves nothing, and takes an id the relay settled.
// Read-committed writers move the sequence forward to seq_hw and past what
// the relay saw before a claim reads it lower (as in attack 1 of
// attack170_test.go, claims wait on a lock; under load a slow claim does),
// so no claim notices the reset: the floors are above the row when the
// writer commits. The row waits for the sweep (an hour here), and the
// key's later event went out first.
func TestAttack170bRepeatableReadWriterReadsStaleSeqHW(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			cfg := b.config("a")
			cfg.SweepInterval = time.Hour
			start(t, cfg)
			b.write(t, msg(b.topic, "warm", "first"))
			waitFor(t, "drained", func() bool { return b.outboxCount(t, "true") == 0 })

			// The writer's transaction reads business data first: its
			// snapshot is fixed from here on; it has no transaction id.
			writer, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			defer func() { _ = writer.Rollback(ctx) }()
			var oldHW int64
			require.NoError(t, writer.QueryRow(ctx, `SELECT coalesce((SELECT seq_hw FROM pgbox_relay_marker), 0)`).Scan(&oldHW))

			last, hw := settledAboveHW(t, b)
			require.Greater(t, hw, oldHW+1)

			release := blockClaims(t, b)
			reset := max(oldHW, 1)
			_, err = b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', $1)`, reset)
			require.NoError(t, err)
			var heldID int64
			require.NoError(t, writer.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ($1, 'warm', 'held')
				RETURNING id`, b.topic).Scan(&heldID))
			// Read-committed writers go on: moved forward to seq_hw, then past
			// what the relay saw.
			_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
				SELECT $1, 'busy', g::text::bytea FROM generate_series(1, 100) g`, b.topic)
			require.NoError(t, err)
			var now int64
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_sequence_last_value('pgbox_outbox_id_seq')`).Scan(&now))
			t.Logf("writer's snapshot seq_hw %d; settled %d, seq_hw %d; reset to %d; held row %d; sequence now %d",
				oldHW, last, hw, reset, heldID, now)
			release()
			waitFor(t, "the busy rows published", func() bool { return b.outboxCount(t, "key = 'busy'") == 0 })
			time.Sleep(10 * cfg.PollInterval) // claims move the floors
			require.NoError(t, writer.Commit(ctx))
			b.write(t, msg(b.topic, "warm", "after"))

			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && b.outboxCount(t, "key = 'warm'") > 0; {
				time.Sleep(100 * time.Millisecond)
			}
			require.Zero(t, b.outboxCount(t, "key = 'warm'"),
				"the held row (id %d, at or below the settled bound %d) is left in the outbox", heldID, min(last, hw))
		})
	}
}

// ATTACK B2. setval(seq, n, false) and ALTER SEQUENCE ... RESTART WITH n
// (an operator jumping the ids forward, past a restored backup's) leave
// the sequence not yet called: pg_sequence_last_value is NULL, which the
// statement trigger (00120) reads as 0, below seq_hw, and it sets the
// sequence BACK to seq_hw. The next ids are ones already handed out: the
// rows still in the outbox (unpublished, or parked) make every writer's
// INSERT fail with a duplicate key until the sequence passes them; the
// ones published are handed out again. The operator's jump is lost. FAILS
// on 719dd04.
func TestAttack170bSetvalNotCalledForwardIsSetBack(t *testing.T) {
	for _, how := range []string{"setval", "restart"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b, _, last, hw := hwAttack(t)

			release := blockClaims(t, b)
			defer release()
			// Rows not yet published (or parked): ids above seq_hw.
			_, err := b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
				SELECT $1, 'waiting', g::text::bytea FROM generate_series(1, 10) g`, b.topic)
			require.NoError(t, err)
			jump := last + 1000
			switch how {
			case "setval":
				_, err = b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', $1, false)`, jump)
			case "restart":
				_, err = b.db.Pool.Exec(ctx, `ALTER TABLE pgbox_outbox ALTER COLUMN id RESTART WITH `+strconv.FormatInt(jump, 10))
			}
			require.NoError(t, err)
			var first int64
			require.NoError(t, b.db.Pool.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ($1, 'after', 'one')
				RETURNING id`, b.topic).Scan(&first))
			t.Logf("read %d, seq_hw %d; sequence set to start at %d; the next row took %d", last, hw, jump, first)
			_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
				SELECT $1, 'after', g::text::bytea FROM generate_series(1, $2::int) g`, b.topic, last-hw+20)
			require.NoError(t, err, "a writer's INSERT after the operator moved the sequence forward")
			require.Equal(t, jump, first, "the sequence the operator moved forward is set back")
		})
	}
}

// ATTACK B3. An operator (or a script "clearing" the relay's state) sets
// pgbox_relay_marker.seq_hw lower, then sets the sequence back. The
// writers' triggers read the lowered seq_hw and move nothing; the relay's
// settled bound and floors are from before (the ident did not change: the
// marker row and its token are the same). As in attack 1 of
// attack170_test.go, a held writer takes an id the relay settled and the
// others carry the sequence past what the relay saw before a claim reads
// it lower. FAILS on 719dd04.
func TestAttack170bSeqHWLoweredThenReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, cfg, last, hw := hwAttack(t)

	release := blockClaims(t, b)
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_relay_marker SET seq_hw = 0`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 1)`)
	require.NoError(t, err)
	held, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = held.Rollback(ctx) }()
	var heldID int64
	require.NoError(t, held.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ($1, 'warm', 'held')
		RETURNING id`, b.topic).Scan(&heldID))
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
		SELECT $1, 'busy', g::text::bytea FROM generate_series(1, 200) g`, b.topic)
	require.NoError(t, err)
	t.Logf("settled %d, seq_hw %d; seq_hw set to 0, sequence to 1; held row %d", last, hw, heldID)
	release()
	waitFor(t, "the busy rows published", func() bool { return b.outboxCount(t, "key = 'busy'") == 0 })
	time.Sleep(10 * cfg.PollInterval)
	require.NoError(t, held.Commit(ctx))
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && b.outboxCount(t, "key = 'warm'") > 0; {
		time.Sleep(100 * time.Millisecond)
	}
	require.Zero(t, b.outboxCount(t, "key = 'warm'"), "the held row (id %d) is left in the outbox", heldID)
}

// ATTACK B4. 00170's mid-statement path moves the sequence forward to
// greatest(seen, seq_hw): but the statement's own rows before the reset
// took ids above seen (seen is the sequence when the statement started).
// A multi-row INSERT ... SELECT (or a COPY) whose sequence is set back
// between its rows: the next row takes seen+1 again, the id of its own
// first row, and the whole statement fails on the primary key. (On 00120
// the row took a low id and the statement succeeded.) No relay needed:
// seq_hw at or below seen (a relay that trails, or none yet). FAILS on
// 719dd04.
func TestAttack170bResetBetweenRowsOfOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value)
		SELECT $1, 'before', g::text::bytea FROM generate_series(1, 50) g`, b.topic)
	require.NoError(t, err)

	// Row 1 takes its id and is inserted; row 2 waits (a slow SELECT).
	require.NoError(t, resetDuringInsert(t, b, b.db.Pool, "between", 5, 2),
		"a multi-row INSERT whose sequence was set back between its rows")
	require.Equal(t, 5, b.outboxCount(t, "key = 'between' AND id > 50"))
}
