package relay

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
)

// openWriter begins a transaction that writes n rows (keys prefix-i, one
// per key, spread over the slots) and stays open.
func openWriter(t *testing.T, b *floorBundle, prefix string, n int) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "%s-%d", prefix, i), Value: []byte("v")})
	}
	require.NoError(t, outbox.Write(ctx, tx, msgs...))
	return tx
}

// drainOnly is drain with claims of the slots in only.
func (b *floorBundle) drainOnly(only *slotSet) []int64 {
	ctx := context.Background()
	var ids []int64
	for {
		c, _, err := b.r.takeBatch(ctx, only)
		require.NoError(b.t, err)
		if len(c.rows) == 0 {
			b.r.floors.moved(&c, nil)
			return ids
		}
		var t tally
		for _, x := range c.rows {
			t.okIDs = append(t.okIDs, x.id)
			t.okEvents = append(t.okEvents, pgtype.UUID{Bytes: x.eventID, Valid: true})
			ids = append(ids, x.id)
		}
		var xid int64
		require.NoError(b.t, b.db.Pool.QueryRow(ctx, finishSQL, t.okIDs, []int64{}, []int64{}, []string{}, 5, []bool{}, "0s", t.okEvents, []pgtype.UUID{}).
			Scan(nil, nil, nil, &xid, nil))
		b.r.floors.recorded(&c, xid, t.okSet())
	}
}

// Overlapping long writers: W1 and W2 open, others flow (the floors pass
// W1 provisionally); W1 commits and the first claim after it asks only
// for a slot W1 has no row in; then W2 commits while others flow. Every
// row of both is claimed, none skipped.
func TestFloorAttackOverlappingLongWriters(t *testing.T) {
	ctx := context.Background()
	b := newFloorBundle(t)
	b.writeRows(500, 50, "before")
	require.Len(t, b.drain(), 500)
	w1 := openWriter(t, b, "w1", 40)
	for range 3 {
		b.writeRows(1000, 300, "a")
		require.Len(t, b.drain(), 1000)
	}
	w2 := openWriter(t, b, "w2", 40)
	for range 3 {
		b.writeRows(1000, 300, "b")
		require.Len(t, b.drain(), 1000)
	}
	// Only W1 is watched: samples taken after W2 began list both as
	// running, so the floors wait below W2's ids until W1 ends (a cost,
	// not a loss).
	require.Len(t, b.r.floors.writers, 1)

	// A slot none of W1's keys is in.
	w1slots := map[int]bool{}
	for i := range 40 {
		w1slots[slot.Of(fmt.Appendf(nil, "w1-%d", i), [16]byte{})] = true
	}
	var only slotSet
	for s := range slot.Count {
		if !w1slots[s] {
			only.add(s)
			break
		}
	}
	var lowest int64
	require.NoError(t, w1.QueryRow(ctx, `SELECT min(id) FROM pgbox_outbox WHERE key LIKE 'w1-%'`).Scan(&lowest))
	passed := 0
	for s := range slot.Count {
		if b.r.floors.epoch[s] != 0 && b.r.floors.floor[s] > lowest {
			passed++
		}
	}
	require.Positive(t, passed, "floors passed W1's ids")
	require.NoError(t, w1.Commit(ctx))
	got := b.drainOnly(&only)
	got = append(got, b.drain()...)
	require.Len(t, got, 40, "W1's rows, none skipped")
	for range 2 {
		b.writeRows(1000, 300, "c")
		require.Len(t, b.drain(), 1000)
	}
	require.NoError(t, w2.Commit(ctx))
	b.writeRows(100, 100, "d")
	require.Len(t, b.drain(), 140, "W2's rows and the rows after them, none skipped")
}
