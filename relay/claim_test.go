package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/outbox"
)

// claim reads pgbox_outbox_claim2's result with targets declared once and
// only the columns each kind of row fills (the claim-wide ones from the
// first slot row). It must read the same claim as decoding every column of
// every row, each slot row's claim-wide columns overwriting the previous
// ones (claimEveryColumn, how it was read before): rows with headers of
// different lengths beside rows without, keyless rows, a rewind (the
// rewind arrays), a parked row.
func TestClaimReadsWhatEveryColumnSays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newFloorBundle(t)
	var msgs []outbox.Message
	for i := range 60 {
		m := outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "k-%d", i%7), Value: fmt.Appendf(nil, "v-%d", i)}
		switch i % 4 {
		case 0:
			m.Headers = []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}, {Key: "c"}}
		case 1:
			m.Headers = []outbox.Header{{Key: fmt.Sprint("only-", i), Value: []byte("x")}}
		case 2:
			m.Key = nil
		}
		msgs = append(msgs, m)
	}
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = now() WHERE id = (SELECT min(id) FROM pgbox_outbox WHERE key = 'k-3')`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox_rewinds (slot, from_id) VALUES (3, 1), (200, 5)`)
	require.NoError(t, err)

	for round := range 3 {
		a := b.r.floors.args(b.r.floors.order(nil), false)
		got, err := b.r.claim(ctx, &a)
		require.NoError(t, err)
		want, err := b.r.claimEveryColumn(ctx, &a)
		require.NoError(t, err)
		require.NotEmpty(t, got.rows)
		require.Len(t, got.meta.slots, 256)
		if round == 0 {
			require.NotEmpty(t, got.meta.rwSlots, "the rewinds are read")
		}
		_, ok := parseSnapshot(got.meta.snap)
		require.True(t, ok, "the snapshot %q is read", got.meta.snap)
		// Each claim reads its own snapshot: other tests' transactions move it.
		got.meta.snap, want.meta.snap = "", ""
		require.Equal(t, want, got, "round %d", round)
		b.r.floors.claimed(&got, b.r.claimPerSlot(), b.r.cfg.BatchSize, time.Now(), true)
	}
}

// claimEveryColumn is claim as it read the result before: every column of
// every row, into pointers declared per row.
func (r *Relay) claimEveryColumn(ctx context.Context, a *claimArgs) (claimed, error) {
	a.instance, a.lanes, a.perSlot, a.batch = r.id, r.cfg.Lanes, r.claimPerSlot(), r.cfg.BatchSize
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, a.sql()...)
	if err != nil {
		return claimed{}, err
	}
	defer rows.Close()
	c := claimed{meta: claimMeta{sweep: a.sweep, rescanFrom: a.settled + 1}}
	for rows.Next() {
		var (
			x                          row
			id, floor, seq, hw, rwSeen *int64
			eventID                    *outbox.EventID
			topic, off, ident, snap    *string
			createdAt                  *time.Time
			attempts                   *int32
			reset, rescan              *bool
			rwSlots                    []int32
			rwFrom                     []int64
		)
		if err := rows.Scan(&id, &eventID, &x.slot, &topic, &x.key, &x.value, &x.headers, &createdAt, &attempts, &x.epoch,
			&floor, &seq, &hw, &off, &ident, &reset, &rwSeen, &rwSlots, &rwFrom, &rescan, &snap); err != nil {
			return claimed{}, err
		}
		if id == nil {
			m := &c.meta
			m.slots, m.epochs, m.floors = append(m.slots, x.slot), append(m.epochs, x.epoch), append(m.floors, *floor)
			m.seqLast, m.seqHW, m.seqOff, m.ident, m.reset = seq, deref(hw), deref(off), deref(ident), deref(reset)
			m.rewindSeen, m.rwSlots, m.rwFrom, m.rescan, m.snap = deref(rwSeen), rwSlots, rwFrom, deref(rescan), deref(snap)
			continue
		}
		x.id, x.eventID, x.topic, x.createdAt, x.attempts = *id, *eventID, *topic, *createdAt, *attempts
		c.rows = append(c.rows, x)
	}
	return c, rows.Err()
}
