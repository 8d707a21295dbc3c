package relay

// Review of 00160, whose docs (docs/outbox-sql.md) now say a row parked by
// an UPDATE of parked_at from outside the relay "waits for an operator's
// retry and holds its key's later rows, as a row the relay parked does".

import (
	"context"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// An operator parks a row the relay has claimed and is sending (it failed
// before with a permanent error: attempts 1 of 5; the operator parks it to
// stop it). The send fails again; the relay's finish sets parked_at from
// its own rule (CASE ... END without ELSE: NULL below MaxAttempts), so the
// operator's park is undone without a word: the row is claimed and sent
// again, and its key's later rows follow it, though nobody retried it.
// (Key order holds: the unpark writes a rewind. A send that succeeds
// deletes the row whatever its parked_at, as it must: the record is in
// Kafka.)
//
// This test FAILS on eb369ca: the defect is in finishSQL (older than
// 00160), and it contradicts what eb369ca's docs now promise.
func TestAttack160FinishKeepsAParkFromOutside(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value, attempts, last_error, failing_since)
		VALUES ('t', 'k', 'poison', 1, 'a record is larger than the topic''s max.message.bytes', now())`)
	rows := g.claim()
	require.Len(t, rows, 1)
	g.exec(`UPDATE pgbox_outbox SET parked_at = now(), last_error = 'parked by an operator' WHERE id = $1`, rows[0].id)
	g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge})
	got := g.rows()
	require.Len(t, got, 1)
	require.Equal(t, 2, got[0].Attempts, "the failure is counted")
	require.True(t, got[0].Parked, "the operator's park stays: the row waits for a retry")
	require.Empty(t, g.claim(), "the next claim leaves the parked row alone")
	var lastErr string
	require.NoError(t, g.db.Pool.QueryRow(context.Background(), `SELECT last_error FROM pgbox_outbox WHERE id = $1`, rows[0].id).Scan(&lastErr))
	require.Equal(t, "parked by an operator", lastErr, "the operator's reason stays")
}
