package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// TestReplayHeaderGivesOwnKey: a record carrying inbox.ReplayHeader (an
// operator's replay of a dead letter) is processed under key + "/replay/" +
// id, once, with Process and ProcessBatch and any strategy; the original
// key still dedupes the original record.
func TestReplayHeaderGivesOwnKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev := outbox.Header{Key: "event-id", Value: []byte("E1")}
	replay := func(id string) outbox.Header { return outbox.Header{Key: inbox.ReplayHeader, Value: []byte(id)} }

	for _, tc := range []struct {
		name     string
		strategy inbox.KeyStrategy
		orig     inbox.Message
		replay   inbox.Message // the replay, as the source topic delivers it: a new offset
		key      string
	}{
		{"ByHeader", inbox.ByHeader("event-id"), msg("orders", 0, 1, "a", ev), msg("orders", 0, 9, "a", ev, replay("7")), "E1/replay/7"},
		{"ByOffset", inbox.ByOffset(), msg("orders", 0, 1, "a"), msg("orders", 0, 1, "a", replay("7")), "orders/0/1/replay/7"},
	} {
		ib := newInbox(t, inbox.Config{Consumer: "svc-" + tc.name, Key: tc.strategy})
		// The original was recorded (as the adapter does when dead-lettering).
		res, err := b.process(t, ib, tc.orig, func(context.Context, pgx.Tx, inbox.Message) error { return nil })
		require.NoError(t, err)
		require.False(t, res.Duplicate)

		before := b.payments(t)
		res, err = b.process(t, ib, tc.replay, pay)
		require.NoError(t, err, tc.name)
		require.False(t, res.Duplicate, "%s: the replay must be processed, not skipped as the original", tc.name)
		require.Equal(t, tc.key, res.Key)
		require.Equal(t, before+1, b.payments(t))

		// Its redelivery (Process and ProcessBatch) and a rewind over the original: no second effect.
		res, err = b.process(t, ib, tc.replay, pay)
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		tx := b.begin(t)
		rs, err := ib.ProcessBatch(ctx, tx, []inbox.Message{tc.orig, tc.replay}, pay)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.True(t, rs[0].Duplicate)
		require.True(t, rs[1].Duplicate)
		require.Equal(t, before+1, b.payments(t), tc.name)

		// A forced second replay has its own id, so its own key.
		res, err = b.process(t, ib, msg(tc.replay.Topic, 0, tc.replay.Offset, "a", append(tc.replay.Headers, replay("7.2"))...), pay)
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		require.Equal(t, before+2, b.payments(t))
	}

	// An empty replay header is bad input, not a silent fallback to the original key.
	ib := newInbox(t, inbox.Config{Consumer: "svc-empty"})
	_, err := b.process(t, ib, msg("orders", 0, 2, "a", replay("")), pay)
	require.ErrorIs(t, err, inbox.ErrInvalidMessage)
	require.ErrorContains(t, err, inbox.ReplayHeader)
}
