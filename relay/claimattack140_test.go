package relay

// Hostile review 140 of commits 2402b91, 370b88f, 10c1150 (migration 00140,
// the claim's new result read, the backlog count on its own goroutine).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// attack140Bodies installs 00120's claim (00140's Down text) as
// pgbox_outbox_claim2_00120 next to 00140's pgbox_outbox_claim2, and returns
// the texts of both (00140's Up and Down) to swap them in as
// pgbox_outbox_claim2.
func attack140Bodies(t *testing.T, db *testdb.DB) (up, down string) {
	t.Helper()
	up = sqlFile(t, "00140_claim_cost.sql", "")
	down = sqlFile(t, "00140_claim_cost.sql", "-- +goose Down")
	require.NotEqual(t, up, down)
	_, err := db.Pool.Exec(context.Background(), replaceOnce(down, "FUNCTION pgbox_outbox_claim2(", "FUNCTION pgbox_outbox_claim2_00120("))
	require.NoError(t, err)
	return up, down
}

func replaceOnce(s, old, new string) string {
	i := indexOf(s, old)
	if i < 0 {
		panic("no " + old)
	}
	return s[:i] + new + s[i+len(old):]
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// Attack 1: 00140 returns what 00120 returns for every input, not just the
// hand-picked states of TestClaimCostMigrationClaimsWhat00120Claims.
// Randomized: a lane table in the middle of a lanes change (rows made for
// two lane counts at once, as an operator's change or a second relay with
// another Lanes setting leaves it), owners and expired leases mixed, p_lanes
// NULL/0/negative/1/the table's/the other count/256; p_slots empty, one,
// 256, 300, with duplicates, NULLs, negatives and slots >= 256; floors and
// epochs arrays shorter/longer than the slots, with NULLs; NULL ident,
// seq_seen, rewind_seen, settled, sweep, per_slot, batch; batch 0; floors
// off (trigger disabled, sequence cache); marker missing; parked keys;
// rewinds. Both bodies run in one REPEATABLE READ snapshot, in alternating
// order, each in a savepoint (an error in one must be the other's error).
func TestClaimAttack140RandomizedEquivalence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	attack140Bodies(t, db)

	var msgs []outbox.Message
	for i := range 400 {
		m := outbox.Message{Topic: fmt.Sprint("t", i%3), Key: fmt.Appendf(nil, "k-%d", i%50), Value: fmt.Appendf(nil, "v-%d", i)}
		if i%11 == 0 {
			m.Key = nil
		}
		msgs = append(msgs, m)
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
	var maxID int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) FROM pgbox_outbox`).Scan(&maxID))
	var ended int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&ended)
	}))

	rng := rand.New(rand.NewPCG(140, 1))
	owners := []string{"me", "other", ""}
	var idents []string
	n := 1000
	if testing.Short() {
		n = 80
	}
	nonEmpty, withRows, mixedLanes := 0, 0, 0
	errs := map[string]int{}
	for it := range n {
		// The lane table: lanes made for count A on lanes [0, A) and for count
		// B on lanes [A, B) (B > A), or all for one count.
		a := []int{1, 2, 4, 8, 16}[rng.IntN(5)]
		b := a
		if rng.IntN(2) == 0 {
			b = a * (2 + rng.IntN(3))
			mixedLanes++
		}
		_, err := pool.Exec(ctx, resetLanesSQL)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at, epoch)
			SELECT g, CASE WHEN g < $1 THEN $1 ELSE $2 END,
			       (ARRAY['me','me','me','other',NULL])[1 + floor(random()*5)::int],
			       CASE WHEN random() < 0.85 THEN now() + interval '1 hour' ELSE now() - interval '1 second' END,
			       (random()*3)::int
			  FROM generate_series(0, $2 - 1) g`, a, b)
		require.NoError(t, err)

		// Outbox-side state.
		if rng.IntN(4) == 0 {
			_, err = pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = CASE WHEN random() < 0.1 THEN now() END`)
			require.NoError(t, err)
		}
		if rng.IntN(4) == 0 {
			_, err = pool.Exec(ctx, `INSERT INTO pgbox_outbox_rewinds (slot, from_id) VALUES ($1, $2)`, rng.IntN(256), rng.Int64N(maxID+2))
			require.NoError(t, err)
		}
		if rng.IntN(10) == 0 {
			_, err = pool.Exec(ctx, `DELETE FROM pgbox_relay_marker`)
			require.NoError(t, err)
		}
		switch rng.IntN(12) {
		case 0:
			_, err = pool.Exec(ctx, `ALTER TABLE pgbox_outbox DISABLE TRIGGER pgbox_outbox_xid_first`)
		case 1:
			_, err = pool.Exec(ctx, `ALTER TABLE pgbox_outbox ENABLE TRIGGER pgbox_outbox_xid_first`)
		case 2:
			_, err = pool.Exec(ctx, `ALTER SEQUENCE pgbox_outbox_id_seq CACHE 2`)
		case 3:
			_, err = pool.Exec(ctx, `ALTER SEQUENCE pgbox_outbox_id_seq CACHE 1`)
		}
		require.NoError(t, err)

		// Arguments.
		var lanes *int32
		if rng.IntN(12) != 0 {
			v := []int32{-4, 0, 1, int32(a), int32(a), int32(b), int32(b), int32(a) + 1, 256}[rng.IntN(9)]
			lanes = &v
		}
		nSlots := []int{0, 1, 1, 2, 17, 256, 256, 256, 300}[rng.IntN(9)]
		slots := make([]*int32, nSlots)
		perm := rng.Perm(256)
		for i := range slots {
			var v int32
			switch rng.IntN(40) {
			case 0:
				slots[i] = nil
				continue
			case 1:
				v = -int32(rng.IntN(20))
			case 2:
				v = 256 + int32(rng.IntN(40))
			case 3:
				if i > 0 && slots[i-1] != nil {
					v = *slots[i-1] // a duplicate
				}
			default:
				v = int32(perm[i%256])
			}
			slots[i] = &v
		}
		arr := func(l int, gen func() *int64) []*int64 {
			out := make([]*int64, l)
			for i := range out {
				out[i] = gen()
			}
			return out
		}
		lenOf := func() int {
			switch rng.IntN(10) {
			case 0:
				return max(0, nSlots-1-rng.IntN(3))
			case 1:
				return nSlots + 1 + rng.IntN(3)
			}
			return nSlots
		}
		floors := arr(lenOf(), func() *int64 {
			if rng.IntN(30) == 0 {
				return nil
			}
			v := rng.Int64N(maxID + 5)
			return &v
		})
		epochs := arr(lenOf(), func() *int64 {
			if rng.IntN(30) == 0 {
				return nil
			}
			v := rng.Int64N(3)
			return &v
		})
		var ident *string
		if len(idents) > 0 && rng.IntN(3) != 0 {
			ident = &idents[rng.IntN(len(idents))]
		} else if rng.IntN(2) == 0 {
			s := "nope"
			ident = &s
		}
		opt := func(v int64) *int64 {
			if rng.IntN(15) == 0 {
				return nil
			}
			return &v
		}
		seqSeen := opt(rng.Int64N(maxID * 2))
		rewind := opt(rng.Int64N(20))
		settled := opt(rng.Int64N(maxID + 5))
		writers := []int64{}
		switch rng.IntN(4) {
		case 0:
			writers = []int64{ended}
		case 1:
			writers = []int64{ended + 1_000_000}
		case 2:
			writers = []int64{ended, ended + 1_000_000}
		}
		var sweep *bool
		if rng.IntN(15) != 0 {
			v := rng.IntN(5) == 0
			sweep = &v
		}
		var perSlot, batch *int32
		if rng.IntN(15) != 0 {
			v := []int32{0, 1, 7, 16, 500}[rng.IntN(5)]
			perSlot = &v
		}
		if rng.IntN(15) != 0 {
			v := []int32{0, 1, 10, 100, 500, 10_000}[rng.IntN(6)]
			batch = &v
		}
		instance := owners[min(rng.IntN(5), 1)]

		call := func(tx pgx.Tx, fn string) ([][]any, string) {
			sp, err := tx.Begin(ctx)
			require.NoError(t, err)
			rows, err := sp.Query(ctx, `SELECT * FROM `+fn+`($1, $2, $3::int[], $4::bigint[], $5::bigint[], $6, $7, $8, $9, $10::bigint[], $11, $12, $13)`,
				instance, lanes, slots, floors, epochs, ident, seqSeen, rewind, settled, writers, sweep, perSlot, batch)
			var out [][]any
			if err == nil {
				for rows.Next() {
					v, err := rows.Values()
					require.NoError(t, err)
					out = append(out, v)
				}
				err = rows.Err()
			}
			if err != nil {
				require.NoError(t, sp.Rollback(ctx))
				return nil, err.Error()
			}
			require.NoError(t, sp.Commit(ctx))
			return out, ""
		}
		desc := fmt.Sprintf("it %d: table lanes %d/%d, p_lanes %v, %d slots, %d floors, %d epochs, ident %v, seqSeen %v, rewind %v, settled %v, writers %v, sweep %v, perSlot %v, batch %v, instance %s",
			it, a, b, deref(lanes), nSlots, len(floors), len(epochs), ident != nil, deref(seqSeen), deref(rewind), deref(settled), writers, deref(sweep), deref(perSlot), deref(batch), instance)
		require.NoError(t, pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			var old, now [][]any
			var oldErr, nowErr string
			if it%2 == 0 {
				old, oldErr = call(tx, "pgbox_outbox_claim2_00120")
				now, nowErr = call(tx, "pgbox_outbox_claim2")
			} else {
				now, nowErr = call(tx, "pgbox_outbox_claim2")
				old, oldErr = call(tx, "pgbox_outbox_claim2_00120")
			}
			require.Equal(t, oldErr, nowErr, desc)
			if oldErr != "" {
				errs[oldErr]++
			}
			// 00120's premise: the claim-wide columns are the same on every
			// slot row.
			for i, v := range old {
				if v[0] == nil && i > 0 {
					require.Equal(t, old[0][11:], v[11:], "00120 slot rows disagree: %s", desc)
				}
			}
			var want [][]any
			for i, v := range old {
				want = append(want, slices.Clone(v))
				if v[0] == nil && i > 0 {
					for j := 11; j < claimCols; j++ {
						want[i][j] = nil
					}
				}
			}
			require.Equal(t, want, now, desc)
			if len(now) > 0 {
				nonEmpty++
				// Whatever the claim returns, its first row is a slot row that
				// carries the claim-wide columns (ident is never NULL).
				require.Nil(t, now[0][0], "first row is a slot row: %s", desc)
				require.NotNil(t, now[0][14], "first row carries ident: %s", desc)
				if s, ok := now[0][14].(string); ok && !slices.Contains(idents, s) {
					idents = append(idents, s)
				}
				for _, v := range now {
					if v[0] != nil {
						withRows++
						break
					}
				}
			}
			return nil
		}))
	}
	t.Logf("%d iterations, %d with slot rows, %d with rows, %d with a mixed lane table, idents %d", n, nonEmpty, withRows, mixedLanes, len(idents))
	t.Logf("errors (the same from both): %v", errs)
	require.Positive(t, withRows)
}

// Attack 2: the new read against both bodies (00140 as migrated; 00120 as
// 00140's Down leaves it, with a binary of this release still running) reads
// the same claim as the pre-2402b91 read of 00120's body, through a drain
// with rewinds, parked keys, floors off and on, a lane count the table does
// not have (no slot rows: zero claim-wide columns either way) and the sweep;
// the floor state it leaves is the same too.
func TestClaimAttack140ReadBothBodies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newB := newFloorBundle(t)
	up, down := attack140Bodies(t, newB.db)
	pool := newB.db.Pool
	// A second Relay on the same schema with its own floor state, reading
	// 00120's result the old way.
	oldR := testRelay(newB.r.cfg, newB.r.id)

	install := func(body string) {
		_, err := pool.Exec(ctx, body)
		require.NoError(t, err)
	}
	round := func(name string, sweep bool, lanes int) {
		newB.r.cfg.Lanes, oldR.cfg.Lanes = lanes, lanes
		aNew := newB.r.floors.args(newB.r.floors.order(nil), sweep)
		aOld := oldR.floors.args(oldR.floors.order(nil), sweep)
		require.Equal(t, aOld.sql(), aNew.sql(), "%s: the two relays' floors diverged", name)
		install(down)
		want, err := oldR.claimEveryColumn(ctx, &aOld, false)
		require.NoError(t, err)
		aNew2 := aNew
		gotOn120, err := newB.r.claim(ctx, &aNew2)
		require.NoError(t, err)
		install(up)
		gotOn140, err := newB.r.claim(ctx, &aNew)
		require.NoError(t, err)
		for _, c := range []*claimed{&want, &gotOn120, &gotOn140} {
			if len(c.meta.slots) > 0 {
				_, ok := parseSnapshot(c.meta.snap)
				require.True(t, ok, "%s: snapshot %q", name, c.meta.snap)
			}
			c.meta.snap = ""
		}
		require.Equal(t, want, gotOn120, "%s: new read of 00120's body", name)
		require.Equal(t, want, gotOn140, "%s: new read of 00140's body", name)
		// Publish half of the rows (a failed batch for the rest), as the
		// worker records them.
		published := map[int64]bool{}
		for i, x := range gotOn140.rows {
			if i%5 != 4 {
				published[x.id] = true
			}
		}
		var ids []int64
		for id := range published {
			ids = append(ids, id)
		}
		_, err = pool.Exec(ctx, `DELETE FROM pgbox_outbox WHERE id = ANY($1)`, ids)
		require.NoError(t, err)
		now := time.Now()
		newB.r.floors.claimed(&gotOn140, newB.r.claimPerSlot(), newB.r.cfg.BatchSize, now, true)
		oldR.floors.claimed(&want, oldR.claimPerSlot(), oldR.cfg.BatchSize, now, true)
		newB.r.floors.recorded(&gotOn140, 0, published)
		oldR.floors.recorded(&want, 0, published)
		require.Equal(t, oldR.floors.floor, newB.r.floors.floor, "%s: floors", name)
		require.Equal(t, oldR.floors.ident, newB.r.floors.ident, "%s: ident", name)
		require.Equal(t, oldR.floors.seqSeen, newB.r.floors.seqSeen, "%s: seqSeen", name)
		require.Equal(t, oldR.floors.rewindSeen, newB.r.floors.rewindSeen, "%s: rewindSeen", name)
		require.Equal(t, oldR.floors.off, newB.r.floors.off, "%s: off", name)
	}
	newB.writeRows(600, 40, "a")
	for i := range 4 {
		round(fmt.Sprint("drain ", i), false, 1)
	}
	_, err := pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = now() WHERE id = (SELECT min(id) FROM pgbox_outbox WHERE key = 'a-3')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgbox_outbox_rewinds (slot, from_id) VALUES (3, 1), (200, 5), (17, 2)`)
	require.NoError(t, err)
	newB.writeRows(300, 40, "b")
	round("rewinds, parked", false, 1)
	round("lanes 2 (table has 1): no slot rows", false, 2)
	round("after no slot rows", false, 1)
	_, err = pool.Exec(ctx, `ALTER TABLE pgbox_outbox DISABLE TRIGGER pgbox_outbox_xid_first`)
	require.NoError(t, err)
	round("floors off (trigger)", false, 1)
	_, err = pool.Exec(ctx, `ALTER TABLE pgbox_outbox ENABLE TRIGGER pgbox_outbox_xid_first`)
	require.NoError(t, err)
	round("floors on again", false, 1)
	round("sweep", true, 1)
	for i := range 3 {
		round(fmt.Sprint("tail ", i), false, 1)
	}
}

// Attack 3: a result whose first row is not a slot row, and slot rows that
// do not come first (a planner that ran the UNION ALL's branches otherwise,
// a parallel append): the read takes the claim-wide columns from the first
// slot row it meets, and reads the same claim as from the function's own
// order. A function over 00140's returns its rows reversed, then rows first.
func TestClaimAttack140ResultOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newFloorBundle(t)
	b.writeRows(300, 30, "k")
	pool := b.db.Pool
	_, err := pool.Exec(ctx, `ALTER FUNCTION pgbox_outbox_claim2(text, int, int[], bigint[], bigint[], text, bigint, bigint, bigint, bigint[], boolean, int, int)
		RENAME TO pgbox_outbox_claim2_real`)
	require.NoError(t, err)
	a := b.r.floors.args(b.r.floors.order(nil), false)
	wrap := func(order string) {
		_, err := pool.Exec(ctx, `DROP FUNCTION IF EXISTS pgbox_outbox_claim2(text, int, int[], bigint[], bigint[], text, bigint, bigint, bigint, bigint[], boolean, int, int)`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `CREATE FUNCTION pgbox_outbox_claim2(p_instance text, p_lanes int, p_slots int[], p_floors bigint[],
			p_floor_epochs bigint[], p_ident text, p_seq_seen bigint, p_rewind_seen bigint, p_settled bigint, p_writers bigint[],
			p_sweep boolean, p_per_slot int, p_batch int)
			RETURNS TABLE (id bigint, event_id uuid, slot smallint, topic text, key bytea, value bytea, headers jsonb,
               created_at timestamptz, attempts int, epoch bigint, floor bigint,
               seq_last bigint, seq_hw bigint, seq_off text, ident text, reset boolean, rewind_seen bigint,
               rw_slots int[], rw_from bigint[], rescan boolean, snap text)
			LANGUAGE sql AS $$
			SELECT r.id, r.event_id, r.slot, r.topic, r.key, r.value, r.headers, r.created_at, r.attempts, r.epoch, r.floor,
			       r.seq_last, r.seq_hw, r.seq_off, r.ident, r.reset, r.rewind_seen, r.rw_slots, r.rw_from, r.rescan, r.snap
			  FROM pgbox_outbox_claim2_real(p_instance, p_lanes, p_slots, p_floors, p_floor_epochs, p_ident, p_seq_seen,
			       p_rewind_seen, p_settled, p_writers, p_sweep, p_per_slot, p_batch) WITH ORDINALITY AS r(id, event_id, slot, topic, key, value, headers,
			       created_at, attempts, epoch, floor, seq_last, seq_hw, seq_off, ident, reset, rewind_seen, rw_slots, rw_from, rescan, snap, n)
			 ORDER BY `+order+`
			$$`)
		require.NoError(t, err)
	}
	wrap("r.n")
	a1 := a
	want, err := b.r.claim(ctx, &a1)
	require.NoError(t, err)
	require.NotEmpty(t, want.rows)
	require.NotEmpty(t, want.meta.ident)
	want.meta.snap = ""
	// Data rows first, slot rows after, in their order.
	wrap("(r.id IS NULL), r.n")
	a2 := a
	got, err := b.r.claim(ctx, &a2)
	require.NoError(t, err)
	got.meta.snap = ""
	require.Equal(t, want, got, "rows before the slot rows")
}

// Attack 4: the backlog count on its own goroutine. A count that is running
// (blocked on the history table's lock) when Run's context ends: Run returns
// within the stop timeout, the lanes are released, nothing of the count's is
// left running (goleak at TestMain), and the relay can Run again, its pending
// count request included. Meanwhile with a 40 ms heartbeat the counts are
// requested faster than they run (they coalesce, never overlap: one
// goroutine) while the worker publishes: -race sees the count, the
// heartbeat and the worker touch nothing of each other's.
func TestClaimAttack140CountGoroutine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(4, "events"))
	kcfg := kafkatest.Config()
	kcfg.Producer.Idempotent, kcfg.Producer.RequiredAcks, kcfg.Net.MaxOpenRequests = true, sarama.WaitForAll, 1
	kcfg.Producer.Return.Successes = true
	r, err := New(Config{Pool: db.Pool, Brokers: c.ListenAddrs(), Kafka: kcfg, Instance: "count140", Lanes: 4,
		HeartbeatInterval: 40 * time.Millisecond, LeaseTTL: 2 * time.Second, NoListen: true, StopTimeout: 2 * time.Second})
	require.NoError(t, err)

	write := func(n int) {
		for i := 0; i < n; i += 100 {
			msgs := make([]outbox.Message, 0, 100)
			for j := i; j < min(n, i+100); j++ {
				msgs = append(msgs, outbox.Message{Topic: "events", Key: fmt.Appendf(nil, "k-%d", j%20), Value: []byte("v")})
			}
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
		}
	}
	run := func() (context.CancelFunc, chan error) {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return cancel, done
	}

	// Phase 1: publish with counts requested every 200 ms.
	cancel, done := run()
	write(2000)
	deadline := time.Now().Add(30 * time.Second)
	for r.Stats().Published < 2000 {
		require.True(t, time.Now().Before(deadline), "published %d", r.Stats().Published)
		write(10)
		time.Sleep(20 * time.Millisecond)
	}
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
		if n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d rows left", n)
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a count after the drain
	require.EqualValues(t, 0, r.Stats().Backlog)

	// Phase 2: a count blocked on the history table when ctx ends.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE pgbox_relay_history IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	write(5)
	// Wait until a count is waiting for the lock (each waits one heartbeat
	// interval, its timeout), then end Run's context.
	var waiting int
	for range 500 {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'pgbox_relay_history'::regclass`).Scan(&waiting))
		if waiting > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	require.Positive(t, waiting, "a count waits for the history table")
	t0 := time.Now()
	cancel()
	require.NoError(t, <-done)
	require.Less(t, time.Since(t0), 3*time.Second, "Run returned long after ctx ended")
	var held int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL`).Scan(&held))
	require.Zero(t, held, "the lanes are released at stop")
	require.NoError(t, tx.Rollback(ctx))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'pgbox_relay_history'::regclass`).Scan(&n))
		return n == 0
	}, 5*time.Second, 20*time.Millisecond)

	// Phase 3: Run again; the rows written while stopped are published and
	// the backlog counted.
	cancel, done = run()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&n))
		return n == 0
	}, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return r.Stats().Backlog == 0 }, 5*time.Second, 20*time.Millisecond)
}
