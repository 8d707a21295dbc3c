package relay_test

// Attacks on the floor's rule beyond issue 32's six cases (12cbe87). Each
// writes through something the database allows and checks that every row
// is published promptly (well before the sweep's default minute) and in
// key order.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
)

// The sequence goes back (setval lower) and then, before the relay's next
// claim, forward past the highest value the relay has seen: a "sequence
// read lower than one already seen" is never observed, so the floors stay
// above the reissued ids. Here the relay's claims wait (an operator
// statement holds the lock the claim takes first) while setval and a burst
// of writers run; in production the same happens whenever writers hand
// out more ids between two claims than the sequence went back.
func TestFloorAttackSetvalLowerThenPastSeen(t *testing.T) {
	ctx := context.Background()
	b, _ := fsSetup(t, nil)
	events := collect(t, b, "events")
	want := keyCount{}
	firstWave(t, b, events, want, "k")

	hold, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = hold.Exec(ctx, `LOCK TABLE pgbox_outbox_rewinds IN ROW EXCLUSIVE MODE`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)
	for range 4 { // 400 rows: ids 6..405, past the ~300 the relay saw
		var msgs []outbox.Message
		for i := range 100 {
			msgs = append(msgs, want.next(fmt.Sprintf("k-%d", i%40)))
		}
		b.write(t, msgs...)
	}
	require.NoError(t, hold.Commit(ctx))
	events.requireOrder(t, want, 15*time.Second)
}

// A writer that takes its ids first and inserts them later, as JPA/Hibernate
// does with a sequence generator (SELECT nextval, then INSERT with the id),
// or a loader that copies rows with an id column: the ids are taken before
// the transaction has an id, so the statement trigger comes too late.
func TestFloorAttackNextvalFirstExplicitIDs(t *testing.T) {
	keys := fsKeys(10, "jpa")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		ids := make([]int64, len(keys))
		for i := range keys {
			require.NoError(t, tx.QueryRow(ctx, `SELECT nextval('pgbox_outbox_id_seq')`).Scan(&ids[i]))
		}
		time.Sleep(1500 * time.Millisecond) // the application builds its entities
		for i, k := range keys {
			ev := outbox.NewEventID()
			_, err := tx.Exec(ctx, `INSERT INTO pgbox_outbox (id, event_id, slot, topic, key, value)
				OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3, 'events', $4, '1')`, ids[i], ev, slot.Of([]byte(k), ev), []byte(k))
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(ctx))
	})
}

// The same with COPY and an id column (COPY writes identity values it is
// given, ALWAYS or not).
func TestFloorAttackCopyWithIDColumn(t *testing.T) {
	keys := fsKeys(10, "copyid")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		var first int64
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT nextval('pgbox_outbox_id_seq')`).Scan(&first))
		_, err := b.db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', $1)`, first+int64(len(keys)))
		require.NoError(t, err)
		time.Sleep(1500 * time.Millisecond)
		var rows [][]any
		for i, k := range keys {
			ev := outbox.NewEventID()
			rows = append(rows, []any{first + int64(i), ev, int16(slot.Of([]byte(k), ev)), "events", []byte(k), []byte("1")})
		}
		n, err := b.db.Pool.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"id", "event_id", "slot", "topic", "key", "value"},
			pgx.CopyFromRows(rows))
		require.NoError(t, err)
		require.EqualValues(t, len(keys), n)
	})
}

// An operator unparks a row with plain SQL (psql, not `relay retry`): no
// rewind is written, and the row and the rows it held lie below their
// slot's floor. The key's next row must not overtake them.
func TestFloorAttackUnparkWithPlainSQL(t *testing.T) {
	ctx := context.Background()
	const key = "psql-key"
	b, events, parked := heldKey(t, key)
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = NULL, attempts = 0 WHERE id = $1`, parked)
	require.NoError(t, err)
	b.write(t, msg("events", key, "4"))
	events.requireOrder(t, map[string][]string{key: {"1", "2", "3", "4"}}, 15*time.Second)
}

// The same with a parked row deleted by plain SQL (a discard by hand): the
// rows it held must go out before the key's next row.
func TestFloorAttackDeleteParkedWithPlainSQL(t *testing.T) {
	ctx := context.Background()
	const key = "psql-del"
	b, events, parked := heldKey(t, key)
	_, err := b.db.Pool.Exec(ctx, `DELETE FROM pgbox_outbox WHERE id = $1`, parked)
	require.NoError(t, err)
	b.write(t, msg("events", key, "4"))
	events.requireOrder(t, map[string][]string{key: {"2", "3", "4"}}, 15*time.Second)
}

// The table's owner disables the trigger that takes the writer's
// transaction id first (pg_restore --disable-triggers does ALTER TABLE
// ... DISABLE TRIGGER ALL; so does a hand-run bulk load), then COPY
// streams rows over time. The relay must notice that the rule's premise
// is gone (or the rows must still be safe).
func TestFloorAttackTriggerDisabled(t *testing.T) {
	keys := fsKeys(12, "notrig")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		_, err := b.db.Pool.Exec(ctx, `ALTER TABLE pgbox_outbox DISABLE TRIGGER ALL`)
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"event_id", "slot", "topic", "key", "value", "headers"},
				&slowSource{keys: keys, pause: 200 * time.Millisecond})
			return err
		}))
	})
}

// slowCopy streams keys' "1" rows into pgbox_outbox with COPY, one row
// every 200 ms, in tx.
func slowCopy(ctx context.Context, tx pgx.Tx, keys []string) error {
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"event_id", "slot", "topic", "key", "value", "headers"},
		&slowSource{keys: keys, pause: 200 * time.Millisecond})
	return err
}

// A writer in a savepoint (a subtransaction): the trigger gives the top
// transaction its id before the rows take theirs.
func TestFloorAttackWriterInSavepoint(t *testing.T) {
	keys := fsKeys(12, "savepoint")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return slowCopy(ctx, sp, keys) })
		}))
	})
}

// A writer under session_replication_role = replica (logical replication's
// apply, some restore tools): the trigger is ENABLE ALWAYS.
func TestFloorAttackReplicaRole(t *testing.T) {
	keys := fsKeys(12, "replica")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			return slowCopy(ctx, tx, keys)
		}))
	})
}

// MERGE whose source is slow to compute (PostgreSQL 15+).
func TestFloorAttackSlowMerge(t *testing.T) {
	keys := fsKeys(20, "merge")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		_, err := b.db.Pool.Exec(ctx, `CREATE FUNCTION fs_payload(k text) RETURNS bytea LANGUAGE plpgsql VOLATILE AS $$
			BEGIN PERFORM pg_sleep(0.1); RETURN '1'::bytea; END $$`)
		require.NoError(t, err)
		_, err = b.db.Pool.Exec(ctx, `MERGE INTO pgbox_outbox o
			USING (SELECT k, fs_payload(k) AS v, o FROM unnest($1::text[]) WITH ORDINALITY AS u(k, o)) s ON false
			WHEN NOT MATCHED THEN INSERT (event_id, slot, topic, key, value)
			VALUES (gen_random_uuid(), fs_slot(convert_to(s.k, 'UTF8')), 'events', convert_to(s.k, 'UTF8'), s.v)`, keys)
		require.NoError(t, err)
	})
}
