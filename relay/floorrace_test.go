package relay_test

// Issue 32 case 4: an operator's retry of a parked row racing the relay's
// claims must not let the key's later row go first.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
)

// parkedKey commits, in one transaction, key's row "1" already parked (as
// the relay parks a row that failed MaxAttempts times) and its rows "2"
// and "3", which the parked row holds back; it returns the parked row's id.
func parkedKey(ctx context.Context, t *testing.T, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, key string) int64 {
	t.Helper()
	var id int64
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	ev := outbox.NewEventID()
	require.NoError(t, tx.QueryRow(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		VALUES ($1, $2, 'events', $3, '1', 5, 'failed on purpose (test)', now()) RETURNING id`,
		ev, slot.Of([]byte(key), ev), []byte(key)).Scan(&id))
	require.NoError(t, outbox.Write(ctx, tx, msg("events", key, "2"), msg("events", key, "3")))
	require.NoError(t, tx.Commit(ctx))
	return id
}

// heldKey starts a relay, gives key a parked row "1" holding rows "2" and
// "3" (parkedKey), and lets filler traffic raise the floors past them.
func heldKey(t *testing.T, key string) (*testBundle, *collector, int64) {
	t.Helper()
	b, _ := fsSetup(t, nil)
	events := collect(t, b, "events")
	warm(t, b)
	parked := parkedKey(context.Background(), t, b.db.Pool, key)
	stop := filler(t, b)
	time.Sleep(1500 * time.Millisecond) // the floors pass rows 2 and 3
	stop()
	return b, events, parked
}

// Case 4, deterministic: the claim is held between its statements (the
// test holds a lock on the outbox sequence, which the claim reads after
// the rewinds and before the parked rows and the rows) while the operator
// retries the parked row. The retry must not commit inside the claim: the
// key goes out 1, 2, 3, 4, never 4, 1, 2, 3.
func TestFloorSafeRetryInsideAClaim(t *testing.T) {
	operatorInsideAClaim(t, inspect.RetryParked, []string{"1", "2", "3", "4"})
}

// The same with a discard: the key goes out 2, 3, 4.
func TestFloorSafeDiscardInsideAClaim(t *testing.T) {
	operatorInsideAClaim(t, inspect.DiscardParked, []string{"2", "3", "4"})
}

func operatorInsideAClaim(t *testing.T, action func(context.Context, inspect.Querier, inspect.ParkedFilter) (int64, error), want []string) {
	ctx := context.Background()
	const key = "held-key"
	b, events, parked := heldKey(t, key)
	time.Sleep(500 * time.Millisecond)
	require.Empty(t, events.byKey()[key], "the parked row holds its key")

	// Hold the sequence (the claim stalls at its sequence read) and write
	// the key's row 4 in the same transaction: its id is above every floor.
	lock, err := pgx.Connect(ctx, b.db.URL)
	require.NoError(t, err)
	defer lock.Close(ctx)
	ltx, err := lock.Begin(ctx)
	require.NoError(t, err)
	_, err = ltx.Exec(ctx, `ALTER SEQUENCE pgbox_outbox_id_seq CACHE 1`)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, ltx, msg("events", key, "4")))
	waitFor(t, "a claim waits for a lock", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%pgbox_outbox_claim%'`).Scan(&n))
		return n > 0
	})

	op, err := pgx.Connect(ctx, b.db.URL)
	require.NoError(t, err)
	defer op.Close(ctx)
	retried := make(chan error, 1)
	go func() {
		_, err := action(ctx, op, inspect.ParkedFilter{IDs: []int64{parked}})
		retried <- err
	}()
	// The retry either commits now (inside the stalled claim) or waits for
	// the claim: give it the time to do either.
	done := false
	select {
	case err := <-retried:
		require.NoError(t, err)
		done = true
		t.Log("the retry committed while a claim was stalled between its reads")
	case <-time.After(2 * time.Second):
		t.Log("the retry waits for the claim")
	}
	require.NoError(t, ltx.Commit(ctx))
	if !done {
		select {
		case err := <-retried:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("the retry never finished")
		}
	}
	events.requireOrder(t, map[string][]string{key: want}, 20*time.Second)
}

// Case 4, continuous: 200 keys each with a parked row and two rows it holds
// and a later row, retried one by one while filler traffic keeps claims
// running back to back. Every key goes out 1, 2, 3, 4.
func TestFloorSafeRetryRacingClaims(t *testing.T) {
	ctx := context.Background()
	b, _ := fsSetup(t, nil)
	events := collect(t, b, "events")
	warm(t, b)
	const keys = 200
	op, err := pgx.Connect(ctx, b.db.URL)
	require.NoError(t, err)
	defer op.Close(ctx)
	ids := make([]int64, keys)
	want := map[string][]string{}
	for i := range keys {
		k := fmt.Sprintf("race-%d", i)
		ids[i] = parkedKey(ctx, t, op, k)
		want[k] = []string{"1", "2", "3", "4"}
	}
	stop := filler(t, b)
	defer stop()
	time.Sleep(1500 * time.Millisecond) // the floors pass the held rows
	for i := range keys {
		b.write(t, msg("events", fmt.Sprintf("race-%d", i), "4"))
	}
	time.Sleep(500 * time.Millisecond)
	var wg sync.WaitGroup
	for w := range 4 { // four operators, each retrying its keys one by one
		conn, err := pgx.Connect(ctx, b.db.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		wg.Go(func() {
			for i := w; i < keys; i += 4 {
				_, err := inspect.RetryParked(ctx, conn, inspect.ParkedFilter{IDs: []int64{ids[i]}})
				if err != nil {
					t.Errorf("retry: %v", err)
					return
				}
				time.Sleep(time.Duration(i%7) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	events.requireOrder(t, want, 30*time.Second)
}
