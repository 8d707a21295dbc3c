package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// TestDuplicateKeepsKeyAsLongAsItsLastCopy: a relay that re-sends an event
// after its crash window puts a second copy of the record in Kafka, later
// than the first. Cleanup measures a key's age from its row, so a duplicate
// delivery must move the row's times forward: otherwise the key is pruned
// while the later copy can still be redelivered (a rewind), and that copy
// is processed a second time. Found by the chaos harness
// (integration_test TestScenarioLateDuplicate); Process and ProcessBatch
// alike.
func TestDuplicateKeepsKeyAsLongAsItsLastCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	ev := func(id string, offset int64, at time.Time) inbox.Message {
		m := msg("orders", 0, offset, "v-"+id, outbox.Header{Key: "event-id", Value: []byte(id)})
		m.Timestamp = at
		return m
	}
	old := time.Now().Add(-72 * time.Hour).UTC().Truncate(time.Microsecond)
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond) // a producer clock running ahead

	// The first copies, processed three days ago.
	for i, id := range []string{"single", "batch-a", "batch-b"} {
		_, err := b.process(t, ib, ev(id, int64(i), old), pay)
		require.NoError(t, err)
	}
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_inbox SET received_at = $1`, old)
	require.NoError(t, err)
	age := func(key string) time.Time {
		var at time.Time
		require.NoError(t, b.db.Pool.QueryRow(ctx,
			`SELECT GREATEST(received_at, record_at) FROM pgbox_inbox WHERE key = $1`, key).Scan(&at))
		return at
	}
	require.WithinDuration(t, old, age("single"), time.Second)

	// The late copies arrive now: duplicates, and the keys' age restarts.
	before := time.Now()
	res, err := b.process(t, ib, ev("single", 10, before), pay)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.False(t, age("single").Before(before.Add(-time.Second)), "a duplicate delivery restarts the key's age")

	tx := b.begin(t)
	rs, err := ib.ProcessBatch(ctx, tx, []inbox.Message{ev("batch-b", 11, later), ev("new", 12, before), ev("batch-a", 13, before)}, pay)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.True(t, rs[0].Duplicate)
	require.False(t, rs[1].Duplicate)
	require.True(t, rs[2].Duplicate)
	require.False(t, age("batch-a").Before(before.Add(-time.Second)))
	require.WithinDuration(t, later, age("batch-b"), time.Millisecond, "the later copy's own timestamp counts")
	require.Equal(t, 4, b.payments(t), "each event had one effect")
}
