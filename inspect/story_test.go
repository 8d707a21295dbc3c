package inspect_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// TestReadStory: a key's story has its outbox rows (unparked and parked),
// its dead letter and the dead letter's replays, and every consumer's inbox
// keys for it (the key, an event id, a replay's key); other keys stay out.
func TestReadStory(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx,
		outbox.Message{Topic: "orders", Key: []byte("k1"), Value: []byte("a")},
		outbox.Message{Topic: "orders", Key: []byte("k1"), Value: []byte("b")},
		outbox.Message{Topic: "orders", Key: []byte("k2"), Value: []byte("c")},
		outbox.Message{Topic: "payments", Key: []byte("k1"), Value: []byte("d")}))
	require.NoError(t, tx.Commit(ctx))
	exec(t, db, `UPDATE pgbox_outbox SET parked_at = now(), last_error = 'boom' WHERE id = 2`)
	var ev string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT event_id::text FROM pgbox_outbox WHERE id = 1`).Scan(&ev))
	exec(t, db, `INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value)
		VALUES ('svc', 'orders', 0, 5, 'orders-0-5', 3, 'poison', 'orders.dlq', true, 'k1', 'a')`)
	_, err = inspect.ReplayDead(ctx, db.Pool, []int64{1}, inspect.ReplayConfig{})
	require.NoError(t, err)
	exec(t, db, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset") VALUES
		('svc', 'orders-0-5`+inbox.ReplayKeySuffix+`1', 'orders', 0, 9),
		('audit', $1, 'orders', 0, 4), ('audit', 'k1', 'orders', 0, 3), ('billing', 'k2', 'orders', 0, 6)`, ev)

	st, err := inspect.ReadStory(ctx, db.Pool, inspect.StoryQuery{Topic: "orders", Key: []byte("k1")})
	require.NoError(t, err)
	var ids []int64
	for _, r := range st.Outbox {
		ids = append(ids, r.ID)
	}
	require.ElementsMatch(t, []int64{1, 2, 5}, ids, "both rows of k1 on orders and the replay")
	for _, r := range st.Outbox {
		if r.ID == 5 {
			require.Equal(t, "1", r.ReplayOf)
		}
		if r.ID == 2 {
			require.NotNil(t, r.ParkedAt)
		}
	}
	require.Len(t, st.Dead, 1)
	require.Equal(t, 1, st.Dead[0].Replays)
	var keys []string
	for _, k := range st.Inbox {
		keys = append(keys, k.Consumer+":"+k.Key)
	}
	require.ElementsMatch(t, []string{"audit:" + ev, "audit:k1", "svc:orders-0-5/replay/1"}, keys)

	// By event id alone: the inbox key and (once parked) the row.
	st, err = inspect.ReadStory(ctx, db.Pool, inspect.StoryQuery{EventID: ev})
	require.NoError(t, err)
	require.Len(t, st.Inbox, 1)
	require.Empty(t, st.Outbox, "unparked rows are found through their key")

	parked, err := inspect.ListParked(ctx, db.Pool, inspect.ParkedFilter{Key: []byte("k1")})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.EqualValues(t, 2, parked[0].ID)
	for _, c := range []struct {
		f    inspect.DeadFilter
		want int
		why  string
	}{
		{inspect.DeadFilter{Key: "k1"}, 1, "the record's key"},
		{inspect.DeadFilter{Key: "orders-0-5"}, 1, "the inbox key"},
		{inspect.DeadFilter{ErrorContains: "pois"}, 1, "error text"},
		{inspect.DeadFilter{ErrorContains: "Poison"}, 0, "case sensitive"},
	} {
		dead, err := inspect.ListDead(ctx, db.Pool, c.f)
		require.NoError(t, err)
		require.Len(t, dead, c.want, c.why)
	}

	row, err := inspect.ReadOutboxRow(ctx, db.Pool, 2)
	require.NoError(t, err)
	require.Equal(t, []byte("b"), row.Value)
	_, err = inspect.ReadOutboxRow(ctx, db.Pool, 99)
	require.ErrorIs(t, err, inspect.ErrRowNotFound)
	rec, err := inspect.ReadDeadRecord(ctx, db.Pool, 1)
	require.NoError(t, err)
	require.Equal(t, []byte("a"), rec.RecordValue)

	_, err = inspect.ReadStory(ctx, db.Pool, inspect.StoryQuery{Key: []byte("k1")})
	require.ErrorContains(t, err, "needs its topic")
	_, err = inspect.ReadStory(ctx, db.Pool, inspect.StoryQuery{})
	require.Error(t, err)
}
