package relay

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testutil"
)

// The second line of defence: a floor rule broken on purpose (every floor
// thrown far past the newest row after each claim) hides every new row from
// the normal claims; the sweep's look, every SweepInterval, finds rows
// below the floors, and the next claim reads each owned slot from its
// start, publishes them all, in id order within each slot (so in key
// order), counts them and logs an ERROR. 0 lost.
func TestSweepPublishesRowsBelowABrokenFloor(t *testing.T) {
	t.Parallel()
	b := newFloorBundle(t)
	var logs testutil.SyncBuffer
	b.r.log = slog.New(slog.NewTextHandler(&logs, nil))
	b.r.cfg.SweepInterval = 300 * time.Millisecond
	b.r.looks = make(chan lookRequest, 1)
	require.Empty(t, b.drain(), "nothing yet: the first claim establishes the floors")
	b.r.floors.hook = func(f *floorState) {
		for s := range f.floor {
			if f.epoch[s] != 0 {
				f.floor[s] = 1 << 40
			}
		}
	}
	b.r.floors.moved(&claimed{}, nil) // break the floors now
	b.writeRows(300, 30, "k")
	slotOf := map[int64]int16{}
	rows, err := b.db.Pool.Query(context.Background(), `SELECT id, slot FROM pgbox_outbox`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var sl int16
		require.NoError(t, rows.Scan(&id, &sl))
		slotOf[id] = sl
	}
	require.NoError(t, rows.Err())
	require.Len(t, slotOf, 300)

	var got []int64
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < 300 {
		require.True(t, time.Now().Before(deadline), "the sweep found %d of 300 rows in 30 s", len(got))
		got = append(got, b.drain()...)
		select { // the sweep goroutine's part, run here
		case req := <-b.r.looks:
			b.r.look(context.Background(), req)
		default:
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Len(t, got, 300, "every row, once")
	last := map[int16]int64{}
	for _, id := range got {
		sl, ok := slotOf[id]
		require.True(t, ok, "row %d was written by the test", id)
		require.Greater(t, id, last[sl], "slot %d's rows (so each key's) in id order", sl)
		last[sl] = id
	}
	require.EqualValues(t, 300, b.r.rowsBelowFloor.Load(), "every row counted as found below its floor")
	require.Contains(t, logs.String(), "level=ERROR")
	require.Contains(t, logs.String(), "the sweep found committed rows below their slot's floor")
}

// A writer that sets a keyed row's slot itself, and gets it wrong, is
// named at ERROR (its key's rows may sit in two lanes and overtake each
// other); the row is published all the same.
func TestWrongSlotIsLogged(t *testing.T) {
	t.Parallel()
	b := newFloorBundle(t)
	var logs testutil.SyncBuffer
	b.r.log = slog.New(slog.NewTextHandler(&logs, nil))
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `INSERT INTO pgbox_outbox (slot, topic, key, value)
		VALUES ((pgbox_outbox_slot('order-1', NULL) + 1) % 256, 't', 'order-1', 'v') RETURNING id`).Scan(&id))
	require.Equal(t, []int64{id}, b.drain(), "published all the same")
	require.Contains(t, logs.String(), "level=ERROR")
	require.Contains(t, logs.String(), "an outbox row's slot is not its key's")
	require.Contains(t, logs.String(), fmt.Sprintf("row_id=%d", id))
}
