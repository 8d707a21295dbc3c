package relay

// Second review of 00160 after 6b5bbfe (a trigger records a rewind when a
// parked row's key, topic or slot is changed by hand; docs/outbox-sql.md:
// "Changing a parked row's key, topic or slot frees the rows it held, as a
// retry does"). These tests watch the relay's floors (the floor hook) so
// that the attack starts only once the floor has passed the held row, as
// it does in production within a few polls.

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

type floorWatchedRelay struct {
	t  *testing.T
	db *testdb.DB
	r  *Relay
	mu sync.Mutex
	fl [256]int64
}

// startFloorWatched runs a relay (sweep an hour away) whose floors the test
// can read after every move. Its lease lasts 30 s: with a 1 s lease, a
// heartbeat late under -race on a loaded machine let the lanes go and
// come back under new epochs, which drops the floors and found the
// stranded rows by luck.
func startFloorWatched(t *testing.T) *floorWatchedRelay {
	t.Helper()
	db := testdb.New(t)
	cluster := kafkatest.New(t, kfake.SeedTopics(3, "events", "rerouted"))
	kc := kafkatest.Config()
	kc.Producer.Idempotent = true
	kc.Producer.RequiredAcks = sarama.WaitForAll
	kc.Net.MaxOpenRequests = 1
	kc.Producer.Return.Successes = true
	r, err := New(Config{Pool: db.Pool, Brokers: cluster.ListenAddrs(), Kafka: kc, Instance: "a", Lanes: 8,
		HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: 30 * time.Second, PollInterval: 100 * time.Millisecond,
		SweepInterval: time.Hour, Channel: "pgbox_" + db.Schema, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	w := &floorWatchedRelay{t: t, db: db, r: r}
	r.floors.hook = func(f *floorState) {
		w.mu.Lock()
		w.fl = f.floor
		w.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return w
}

func (w *floorWatchedRelay) exec(q string, args ...any) {
	w.t.Helper()
	_, err := w.db.Pool.Exec(context.Background(), q, args...)
	require.NoError(w.t, err)
}

func (w *floorWatchedRelay) count(where string) int {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pgbox_outbox WHERE "+where).Scan(&n))
	return n
}

func (w *floorWatchedRelay) idSlot(where string) (id int64, slot int) {
	w.t.Helper()
	require.NoError(w.t, w.db.Pool.QueryRow(context.Background(), "SELECT id, slot FROM pgbox_outbox WHERE "+where).Scan(&id, &slot))
	return id, slot
}

// waitFloorPast waits until slot's floor is above id.
func (w *floorWatchedRelay) waitFloorPast(slot int, id int64) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		f := w.fl[slot]
		w.mu.Unlock()
		if f > id {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("slot %d's floor never passed id %d (at %d)", slot, id, f)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rewindReaches requires a rewind that lowers slot's floor to id or below:
// once a floor has passed a row, it is what brings the claim back to it
// (otherwise: the sweep, counted below a floor, or a floor reset or long
// writer's rescan by chance, which is why this is asked, not timed).
func (w *floorWatchedRelay) rewindReaches(slot int, id int64, fail string) {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgbox_outbox_rewinds WHERE slot = $1 AND from_id <= $2`, slot, id).Scan(&n))
	if n == 0 {
		w.t.Fatalf("%s: no rewind reaches slot %d at or below id %d, and that slot's floor has passed it: it waits for the sweep (ERROR, RowsBelowFloor)", fail, slot, id)
	}
}

// waitGone waits up to 5 s for the rows where to leave the outbox.
func (w *floorWatchedRelay) waitGone(where, fail string) time.Duration {
	w.t.Helper()
	t0 := time.Now()
	for w.count(where) > 0 {
		if time.Since(t0) > 5*time.Second {
			w.t.Fatalf("%s: still in the outbox %v later (the sweep is an hour away)", fail, time.Since(t0).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(t0)
}

const otherRows = `INSERT INTO pgbox_outbox (topic, key, value) SELECT 'events', convert_to('o' || g, 'UTF8'), 'other' FROM generate_series(1, 300) g`

// A parked row's key is "fixed" by hand (6b5bbfe's own scenario, the "key
// changed" case of TestAttack160ParkedRowKeyClearedReleasesHeldRow):
// UPDATE pgbox_outbox SET key = 'fixed'. Nothing recomputes slot on an
// UPDATE (pgbox_outbox_fill_slot is BEFORE INSERT), so the row stays in its
// old key's slot while its new key's rows are in another. It holds the new
// key's later rows (the claim's probe matches topic and key, in any slot),
// and the floor of their slot passes them, as it passes any held row. When
// the operator then retries it, the rewind (OLD.slot, OLD.id) lowers the
// floor of the row's own slot only: the new key's held row waits below its
// slot's floor for the sweep (SweepInterval, a minute by default), which
// publishes it and reports a hole in the floor's rule (ERROR,
// RowsBelowFloor, the PgboxRelayRowsBelowFloor alert): the false alarm
// 6b5bbfe set out to remove, moved to the new key. The retried row is also
// claimed from a slot that is not its key's (the relay logs an ERROR
// blaming its writer) and its key's rows are sent by two lanes.
//
// "key and slot" (the operator recomputes slot = pgbox_outbox_slot(key,
// event_id)) PASSES: the held row goes out at the retry. "key only", what
// the docs describe, FAILS on 6b5bbfe: no rewind reaches the held row's
// slot (rewindReaches; asked rather than timed, as a floor reset or a long
// writer's rescan elsewhere on a shared server finds the row by chance).
// Measured: with a 2 s sweep the row goes out at the sweep, RowsBelowFloor
// 1; with the sweep an hour away it is still there 5 s after the retry.
func TestAttack160bRekeyedParkedRowRetryReleasesNewKeyRows(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]string{
		"key only":     `UPDATE pgbox_outbox SET key = 'fixed' WHERE value = 'parked'`,
		"key and slot": `UPDATE pgbox_outbox SET key = 'fixed', slot = pgbox_outbox_slot('fixed', event_id) WHERE value = 'parked'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := startFloorWatched(t)
			w.exec(`INSERT INTO pgbox_outbox (topic, key, value, parked_at, last_error) VALUES ('events', 'k', 'parked', now(), 'bad key')`)
			w.exec(change)
			w.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('events', 'fixed', 'held')`)
			w.exec(otherRows) // more than 64 ids after them: the floors may pass them (seq_hw)
			parked, _ := w.idSlot(`value = 'parked'`)
			held, newSlot := w.idSlot(`value = 'held'`)
			var oldSlot int
			require.NoError(t, w.db.Pool.QueryRow(context.Background(), `SELECT pgbox_outbox_slot('k', NULL)`).Scan(&oldSlot))
			require.NotEqual(t, oldSlot, newSlot, "the scenario needs the two keys in two slots")
			w.waitFloorPast(newSlot, held)
			require.Equal(t, 1, w.count(`value = 'held'`), "held behind its key's parked row")
			n, err := inspect.RetryParked(context.Background(), w.db.Pool, inspect.ParkedFilter{IDs: []int64{parked}})
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			w.waitGone(`value = 'parked'`, "the retried row")
			w.rewindReaches(newSlot, held, "the retried row went out, but the row of its new key it held")
			took := w.waitGone(`value = 'held'`, "the row of its new key it held")
			require.Zero(t, w.r.Stats().RowsBelowFloor)
			t.Logf("the held row went out %v after its parked row", took.Round(time.Millisecond))
		})
	}
}

// The mirror of 6b5bbfe's case: the row a parked row holds, not the parked
// row, gets another key or topic by hand (an operator lets a key's later
// rows go without retrying its poison row; a script reroutes them to
// another topic; a key "fixed" row by row). The row is no longer held, but
// the floor has passed it and no trigger fires (the rekeyed trigger's WHEN
// asks for OLD.parked_at IS NOT NULL): it waits for the sweep, which counts
// it below a floor (ERROR, RowsBelowFloor) though the rule held: the false
// alarm 6b5bbfe removes for the parked row. FAILS on 6b5bbfe (no rewind
// reaches the row's slot; measured: with a 2 s sweep, RowsBelowFloor 1).
func TestAttack160bHeldRowRekeyedGoesOutWithoutTheSweep(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]string{
		"key":   `UPDATE pgbox_outbox SET key = 'k2' WHERE value = 'held'`,
		"topic": `UPDATE pgbox_outbox SET topic = 'rerouted' WHERE value = 'held'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := startFloorWatched(t)
			w.exec(`INSERT INTO pgbox_outbox (topic, key, value, parked_at) VALUES ('events', 'k', 'parked', now())`)
			w.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('events', 'k', 'held')`)
			w.exec(otherRows)
			held, s := w.idSlot(`value = 'held'`)
			w.waitFloorPast(s, held)
			require.Equal(t, 1, w.count(`value = 'held'`), "held behind its key's parked row")
			w.exec(change)
			w.rewindReaches(s, held, "the row no longer held")
			took := w.waitGone(`value = 'held'`, "the row no longer held")
			require.Zero(t, w.r.Stats().RowsBelowFloor)
			t.Logf("the row went out %v after the change", took.Round(time.Millisecond))
		})
	}
}
