package inbox_test

// Review 34: attacks on 9a721a5 (ProcessBatch's first insert without a probe,
// the fallback to ON CONFLICT on every redelivery, and the per-Inbox probe
// counter). Each test asserts behaviour; none is skipped.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// pev is an event message keyed by its event-id header, with payload "v-<id>"
// unless value is given.
func pev(id string, offset int64, value ...string) inbox.Message {
	v := "v-" + id
	if len(value) > 0 {
		v = value[0]
	}
	return msg("orders", 0, offset, v, outbox.Header{Key: "event-id", Value: []byte(id)})
}

// storing is a handler that stores "r-<value>" as the result and writes a
// payments row.
func storing(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	if err := inbox.SetResult(ctx, []byte("r-"+string(m.Value))); err != nil {
		return err
	}
	return payValue(ctx, tx, m)
}

// payValue is pay with the event named by the payload (one per key here).
func payValue(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ($1, 100)`, string(m.Value))
	return err
}

// primeKeys commits the given ids (one batch, through a throwaway Inbox of
// the same consumer so the probe counter of the Inbox under test is not
// touched).
func primeKeys(t *testing.T, b *testBundle, ids ...string) {
	t.Helper()
	ctx := context.Background()
	ms := make([]inbox.Message, len(ids))
	for i, id := range ids {
		ms[i] = pev(id, int64(1000+i))
	}
	prime := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	require.NoError(t, b.beginFunc(ctx, t, func(tx pgx.Tx) error {
		res, err := processBatch(ctx, prime, tx, ms, storing)
		for _, r := range res {
			require.False(t, r.Duplicate)
		}
		return err
	}))
}

// turnProbeOn makes ib probe for its next batches: one batch whose only key
// is known.
func turnProbeOn(t *testing.T, b *testBundle, ib *inbox.Inbox, known string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.beginFunc(ctx, t, func(tx pgx.Tx) error {
		res, err := processBatch(ctx, ib, tx, []inbox.Message{pev(known, 1)}, storing)
		if err == nil {
			require.True(t, res[0].Duplicate)
		}
		return err
	}))
}

// Attack: where the conflicting key sits in the batch (first, last, only,
// middle, all, repeated within the batch), with the probe off (plain insert
// fails, fallback) and on (probe form): results (Duplicate, Stored, Key), the
// handler calls, Stats and payments must be exact either way, for pgx and
// database/sql transactions.
func TestProbeAttackConflictPosition(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		batch []string // ids; "o*" are committed before, "n*" new
	}{
		{"only", []string{"o1"}},
		{"first", []string{"o1", "n1", "n2", "n3"}},
		{"last", []string{"n1", "n2", "n3", "o9"}},
		{"middle", []string{"n1", "o5", "n9"}},
		{"first_in_input_last_in_key_order", []string{"o9", "n1", "n2"}},
		{"all", []string{"o3", "o1", "o2"}},
		{"repeat_old", []string{"o1", "n1", "o1", "n1"}},
		{"repeat_new_then_old", []string{"n1", "n1", "o9", "n2", "o9"}},
	}
	for _, probe := range []bool{false, true} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("probe=%v/%s", probe, c.name), func(t *testing.T) {
				t.Parallel()
				forKinds(t, func(t *testing.T, b *testBundle) {
					ctx := context.Background()
					primeKeys(t, b, "o0", "o1", "o2", "o3", "o5", "o9")
					ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
					if probe {
						turnProbeOn(t, b, ib, "o0")
					}
					before := ib.Stats()
					ms := make([]inbox.Message, len(c.batch))
					for i, id := range c.batch {
						ms[i] = pev(id, int64(i+10))
					}
					var calls []string
					h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
						calls = append(calls, string(m.Value))
						return storing(ctx, tx, m)
					}
					tx := b.begin(t)
					res, err := processBatch(ctx, ib, tx, ms, h)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, `SELECT 1`)
					require.NoError(t, err, "the transaction is usable")
					require.NoError(t, tx.Commit(ctx))

					seen := map[string]bool{}
					var wantCalls []string
					wantNew, wantDup := 0, 0
					for i, id := range c.batch {
						r := res[i]
						require.Equal(t, id, r.Key, "key of %d", i)
						dup := strings.HasPrefix(id, "o") || seen[id]
						require.Equal(t, dup, r.Duplicate, "message %d (%s)", i, id)
						require.Equal(t, "r-v-"+id, string(r.Stored), "stored result of message %d (%s)", i, id)
						if dup {
							wantDup++
						} else {
							wantNew++
							wantCalls = append(wantCalls, "v-"+id)
						}
						seen[id] = true
					}
					require.Equal(t, wantCalls, calls, "handler runs once per new key, in input order")
					got := ib.Stats()
					require.Equal(t, uint64(wantNew), got.Processed-before.Processed)
					require.Equal(t, uint64(wantDup), got.Duplicates-before.Duplicates)
					require.Equal(t, 6+wantNew, b.payments(t))
					require.Equal(t, 6+wantNew, b.inboxRows(t))
					require.Zero(t, b.count(t, `SELECT count(*) FROM (SELECT event FROM payments GROUP BY event HAVING count(*) > 1) d`))
				})
			})
		}
	}
}

// Attack: a duplicate with another payload must still be refused with
// ErrFingerprintMismatch on the fallback path (probe off) and the probe
// path, naming the message; nothing of the batch remains; the caller's
// transaction keeps its prior writes and stays usable.
func TestProbeAttackFingerprintMismatchOnFallback(t *testing.T) {
	t.Parallel()
	for _, probe := range []bool{false, true} {
		t.Run(fmt.Sprintf("probe=%v", probe), func(t *testing.T) {
			t.Parallel()
			forKinds(t, func(t *testing.T, b *testBundle) {
				ctx := context.Background()
				primeKeys(t, b, "o0", "o5")
				ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
				if probe {
					turnProbeOn(t, b, ib, "o0")
				}
				before := ib.Stats()
				tx := b.begin(t)
				_, err := tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ('prior', 1)`)
				require.NoError(t, err)
				calls := 0
				ms := []inbox.Message{pev("n1", 1), pev("o5", 2, "tampered"), pev("n9", 3)}
				_, err = processBatch(ctx, ib, tx, ms, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
					calls++
					return pay(ctx, tx, m)
				})
				require.ErrorIs(t, err, inbox.ErrFingerprintMismatch)
				var me *inbox.MessageError
				require.True(t, errors.As(err, &me))
				require.Equal(t, 1, me.Index)
				require.Zero(t, calls)
				require.Equal(t, uint64(1), ib.Stats().FingerprintMismatches-before.FingerprintMismatches)
				require.Equal(t, before.Processed, ib.Stats().Processed)
				// Usable, prior write kept, nothing of the batch.
				var n int
				require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox WHERE key IN ('n1','n9')`).Scan(&n))
				require.Zero(t, n)
				require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM payments WHERE event = 'prior'`).Scan(&n))
				require.Equal(t, 1, n)
				require.NoError(t, tx.Commit(ctx))
				require.Equal(t, 3, b.payments(t)) // 2 primed + prior
				require.Equal(t, 2, b.inboxRows(t))
			})
		})
	}
}

// Attack: a caller's transaction with prior writes, its own savepoints and
// earlier ProcessBatch calls (whose keys are not committed yet, so a second
// batch of the same keys in the same transaction meets its own rows): after
// the fallback the transaction keeps every prior write, the caller's
// savepoint still works (rolling back to it undoes only what came after),
// and keys processed earlier in the same transaction are duplicates.
func TestProbeAttackCallerSavepointsAndPriorWrites(t *testing.T) {
	t.Parallel()
	forKinds(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		primeKeys(t, b, "o1", "o2")
		ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
		tx := b.begin(t)
		_, err := tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ('prior', 1)`)
		require.NoError(t, err)
		// First batch in the tx: new keys only (plain insert succeeds).
		res, err := processBatch(ctx, ib, tx, []inbox.Message{pev("a1", 1), pev("a2", 2)}, storing)
		require.NoError(t, err)
		require.False(t, res[0].Duplicate || res[1].Duplicate)

		// The caller's own savepoint.
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		_, err = sp.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ('in-savepoint', 1)`)
		require.NoError(t, err)
		// A batch meeting a committed key (o1) and a key of this same tx (a2):
		// the plain insert fails, the fallback runs.
		res, err = processBatch(ctx, ib, sp, []inbox.Message{pev("a2", 3), pev("b1", 4), pev("o1", 5)}, storing)
		require.NoError(t, err)
		require.True(t, res[0].Duplicate, "a2 was processed earlier in this transaction")
		require.Equal(t, "r-v-a2", string(res[0].Stored))
		require.False(t, res[1].Duplicate)
		require.True(t, res[2].Duplicate)
		require.Equal(t, "r-v-o1", string(res[2].Stored))
		// The caller rolls back its savepoint: b1 and 'in-savepoint' go, the
		// rest stays.
		require.NoError(t, sp.Rollback(ctx))
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM payments WHERE event IN ('prior')`).Scan(&n))
		require.Equal(t, 1, n)
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM payments WHERE event = 'in-savepoint'`).Scan(&n))
		require.Zero(t, n)
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox WHERE key IN ('a1','a2')`).Scan(&n))
		require.Equal(t, 2, n, "the first batch's keys survive the fallback and the caller's rollback")
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox WHERE key = 'b1'`).Scan(&n))
		require.Zero(t, n)
		// b1 again, in the same tx: processed now.
		res, err = processBatch(ctx, ib, tx, []inbox.Message{pev("b1", 4), pev("a1", 6)}, storing)
		require.NoError(t, err)
		require.False(t, res[0].Duplicate)
		require.True(t, res[1].Duplicate)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 2+1+3, b.payments(t)) // primed, prior, a1 a2 b1
		require.Equal(t, 5, b.inboxRows(t))
	})
}

// Attack: a zombie (another consumer after a rebalance, same consumer name)
// processes an overlapping batch concurrently, both orders of commit and
// rollback, with the waiting side's probe on and off (probe on: the key is
// committed between the probe's snapshot and the insert). Exactly one effect
// per key; the waiting side reports Duplicate with the stored result iff
// the other committed.
func TestProbeAttackZombieOverlap(t *testing.T) {
	t.Parallel()
	for _, probe := range []bool{false, true} {
		for _, commit := range []bool{true, false} {
			t.Run(fmt.Sprintf("probe=%v/first_commits=%v", probe, commit), func(t *testing.T) {
				t.Parallel()
				forKinds(t, func(t *testing.T, b *testBundle) {
					ctx := context.Background()
					primeKeys(t, b, "o0", "o7")
					zombie := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
					owner := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
					if probe {
						turnProbeOn(t, b, owner, "o0")
					}
					tx1 := b.begin(t)
					res1, err := processBatch(ctx, zombie, tx1, []inbox.Message{pev("k1", 1), pev("k2", 2), pev("k3", 3)}, storing)
					require.NoError(t, err)
					for _, r := range res1 {
						require.False(t, r.Duplicate)
					}
					tx2 := b.begin(t)
					pid2 := pid(t, tx2)
					type outcome struct {
						res []inbox.Result
						err error
					}
					done := make(chan outcome, 1)
					go func() {
						// k3 and k2 in flight in tx1, k4 new, o7 committed.
						res, err := processBatch(ctx, owner, tx2, []inbox.Message{pev("k4", 4), pev("k3", 3), pev("o7", 5), pev("k2", 2)}, storing)
						done <- outcome{res, err}
					}()
					b.waitBlocked(t, pid2)
					if commit {
						require.NoError(t, tx1.Commit(ctx))
					} else {
						require.NoError(t, tx1.Rollback(ctx))
					}
					o := <-done
					require.NoError(t, o.err)
					require.NoError(t, tx2.Commit(ctx))
					require.False(t, o.res[0].Duplicate)
					require.Equal(t, commit, o.res[1].Duplicate, "k3")
					require.True(t, o.res[2].Duplicate, "o7")
					require.Equal(t, "r-v-o7", string(o.res[2].Stored))
					require.Equal(t, commit, o.res[3].Duplicate, "k2")
					if commit {
						require.Equal(t, "r-v-k3", string(o.res[1].Stored))
						require.Equal(t, 2+4, b.payments(t))
					} else {
						require.Equal(t, 2+3, b.payments(t))
					}
					require.Zero(t, b.count(t, `SELECT count(*) FROM (SELECT event FROM payments GROUP BY event HAVING count(*) > 1) d`))
					require.Equal(t, b.payments(t), b.inboxRows(t))
				})
			})
		}
	}
}

// Attack: Config.LockTimeout with a batch that holds a committed duplicate
// (so the plain insert fails at once and the fallback is what waits) and a
// key in flight: ErrInFlight, the caller's lock_timeout is back, the
// transaction is usable; and a fallback that succeeds leaves the caller's
// lock_timeout too.
func TestProbeAttackLockTimeoutOnFallback(t *testing.T) {
	t.Parallel()
	for _, probe := range []bool{false, true} {
		t.Run(fmt.Sprintf("probe=%v", probe), func(t *testing.T) {
			t.Parallel()
			forKinds(t, func(t *testing.T, b *testBundle) {
				ctx := context.Background()
				primeKeys(t, b, "o0", "o1")
				ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id"), LockTimeout: 50 * time.Millisecond})
				if probe {
					turnProbeOn(t, b, ib, "o0")
				}
				show := func(tx pgx.Tx) string {
					var s string
					require.NoError(t, tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&s))
					return s
				}
				tx1 := b.begin(t)
				_, err := processBatch(ctx, ib, tx1, []inbox.Message{pev("k5", 5)}, pay)
				require.NoError(t, err)

				tx2 := b.begin(t)
				_, err = tx2.Exec(ctx, `SET LOCAL lock_timeout = '7s'`)
				require.NoError(t, err)
				_, err = processBatch(ctx, ib, tx2, []inbox.Message{pev("o1", 1), pev("k5", 5), pev("n1", 6)}, pay)
				require.ErrorIs(t, err, inbox.ErrInFlight)
				require.Equal(t, "7s", show(tx2))
				var n int
				require.NoError(t, tx2.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox WHERE key = 'n1'`).Scan(&n))
				require.Zero(t, n, "nothing of the failed batch")

				res, err := processBatch(ctx, ib, tx2, []inbox.Message{pev("o1", 1), pev("n1", 6)}, pay)
				require.NoError(t, err)
				require.True(t, res[0].Duplicate)
				require.False(t, res[1].Duplicate)
				require.Equal(t, "7s", show(tx2), "the caller's lock_timeout after a fallback that succeeded")
				require.NoError(t, tx2.Commit(ctx))
				require.NoError(t, tx1.Commit(ctx))
				require.Equal(t, 2+2, b.payments(t))
			})
		})
	}
}

// Attack: DedupWatermarkAndKeys, where the watermark statement runs in the
// same pipeline as the insert that now fails on every producer-side
// duplicate: the retry must move the watermark once, report gaps right,
// and results/Stats must be exact.
func TestProbeAttackWatermarkAndKeysFallback(t *testing.T) {
	t.Parallel()
	forKinds(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		ib := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermarkAndKeys, Key: inbox.ByHeader("event-id")})
		run := func(ms ...inbox.Message) []inbox.Result {
			t.Helper()
			tx := b.begin(t)
			res, err := processBatch(ctx, ib, tx, ms, storing)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			return res
		}
		run(pev("A", 0), pev("B", 1))
		require.Equal(t, 1, b.watermark(t, 0))
		// Producer-side duplicate of A at offset 3 (a gap: offset 2 missing),
		// C new at 4, B's redelivery at 1 below the watermark.
		fresh := newInbox(t, inbox.Config{Dedup: inbox.DedupWatermarkAndKeys, Key: inbox.ByHeader("event-id")})
		ib = fresh // probe off: the plain insert fails on A
		res := run(pev("B", 1), pev("A", 3), pev("C", 4), pev("D", 5))
		var dups []bool
		for _, r := range res {
			dups = append(dups, r.Duplicate)
		}
		require.Equal(t, []bool{true, true, false, false}, dups)
		require.EqualValues(t, 1, res[1].Gap, "offset 2 never came")
		require.Zero(t, res[2].Gap)
		require.Equal(t, "r-v-A", string(res[1].Stored))
		require.Equal(t, 5, b.watermark(t, 0))
		require.Equal(t, inbox.Stats{Processed: 2, Duplicates: 2, Gaps: 1}, ib.Stats())
		require.Equal(t, 4, b.payments(t))
		require.Equal(t, 4, b.inboxRows(t))
	})
}

// Attack: ProcessBatchAtOnce on the fallback path: the batch handler gets
// exactly the new messages, SetBatchResult lands on the right keys,
// duplicates get the stored results.
func TestProbeAttackAtOnceFallback(t *testing.T) {
	t.Parallel()
	for _, probe := range []bool{false, true} {
		t.Run(fmt.Sprintf("probe=%v", probe), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			primeKeys(t, b, "o0", "o3")
			ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
			if probe {
				turnProbeOn(t, b, ib, "o0")
			}
			var got []string
			tx := b.begin(t)
			res, err := ib.ProcessBatchAtOnce(ctx, tx, []inbox.Message{pev("n2", 1), pev("o3", 2), pev("n1", 3), pev("n2", 4)},
				func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
					for i, m := range ms {
						got = append(got, string(m.Value))
						if err := inbox.SetBatchResult(ctx, i, []byte("r-"+string(m.Value))); err != nil {
							return err
						}
						if err := payValue(ctx, tx, m); err != nil {
							return err
						}
					}
					return nil
				})
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, []string{"v-n2", "v-n1"}, got)
			require.Equal(t, []bool{false, true, false, true}, []bool{res[0].Duplicate, res[1].Duplicate, res[2].Duplicate, res[3].Duplicate})
			for i, id := range []string{"n2", "o3", "n1", "n2"} {
				require.Equal(t, "r-v-"+id, string(res[i].Stored), i)
			}
			require.Equal(t, 4, b.payments(t))
		})
	}
}

// deleteTracer runs a DELETE of a key, committed on another pool, just
// before the statement it watches for is sent on the traced pool (once).
type deleteTracer struct {
	other *pgxpool.Pool
	key   string
	match func(sql string) bool
	fired atomic.Bool
	err   error
}

func (d *deleteTracer) maybe(ctx context.Context, sql string) {
	if d.match(sql) && d.fired.CompareAndSwap(false, true) {
		_, d.err = d.other.Exec(context.WithoutCancel(ctx), `DELETE FROM pgbox_inbox WHERE key = $1`, d.key)
	}
}
func (d *deleteTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	d.maybe(ctx, q.SQL)
	return ctx
}
func (d *deleteTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (d *deleteTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, bd pgx.TraceBatchStartData) context.Context {
	for _, q := range bd.Batch.QueuedQueries {
		d.maybe(ctx, q.SQL)
	}
	return ctx
}
func (d *deleteTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (d *deleteTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Attack: cleanup deletes a conflicting key concurrently, (a) between the
// failed plain insert and the fallback's ON CONFLICT insert, (b) between the
// fallback insert and the read of the stored rows (readConflicts re-inserts).
// Either way the batch succeeds, its transaction is usable, every key of it
// has its row after commit, and the key that vanished is processed (it is
// new again: the same outcome the probing form had).
func TestProbeAttackCleanupVanishes(t *testing.T) {
	t.Parallel()
	isFallbackInsert := func(s string) bool {
		return strings.Contains(s, "ON CONFLICT (consumer, key) DO NOTHING") && strings.Contains(s, "unnest")
	}
	isTouch := func(s string) bool { return strings.HasPrefix(s, "WITH locked AS") }
	for name, match := range map[string]func(string) bool{"before_fallback_insert": isFallbackInsert, "before_touch": isTouch} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			primeKeys(t, b, "o1", "o2")
			tr := &deleteTracer{other: b.pool, key: "o1", match: match}
			cfg := b.pool.Config()
			cfg.ConnConfig.Tracer = tr
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			var calls []string
			res, err := ib.ProcessBatch(ctx, tx, []inbox.Message{pev("n1", 1), pev("o1", 2), pev("o2", 3)}, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				calls = append(calls, string(m.Value))
				return storing(ctx, tx, m)
			})
			require.NoError(t, tr.err)
			require.True(t, tr.fired.Load(), "the delete was injected")
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			require.False(t, res[0].Duplicate)
			require.False(t, res[1].Duplicate, "o1 vanished: processed again")
			require.True(t, res[2].Duplicate)
			require.Equal(t, []string{"v-n1", "v-o1"}, calls)
			require.Equal(t, 3, b.inboxRows(t))
			require.Equal(t, "r-v-o1", string(res[1].Stored))
		})
	}
}

// Attack: many goroutines sharing one *Inbox (the probe counter flips and
// counts down concurrently: run with -race), overlapping random batches,
// some rolled back. Each committed key has exactly one effect; results and
// Stats match what the calls returned.
func TestProbeAttackSharedInboxRace(t *testing.T) {
	t.Parallel()
	forKinds(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
		const workers, rounds, keys = 8, 40, 120
		var processed, dups atomic.Uint64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 34))
				for r := range rounds {
					n := 1 + rng.IntN(12)
					ms := make([]inbox.Message, n)
					for i := range ms {
						id := fmt.Sprintf("k%03d", rng.IntN(keys))
						ms[i] = pev(id, int64(r*100+i))
					}
					rollback := rng.IntN(5) == 0
					var res []inbox.Result
					tx, err := b.beginKind(ctx, t)
					if err != nil {
						errs <- err
						return
					}
					res, err = processBatch(ctx, ib, tx, ms, storing)
					if err != nil {
						_ = tx.Rollback(ctx)
						errs <- fmt.Errorf("worker %d round %d: %w", w, r, err)
						return
					}
					for i, x := range res {
						if x.Duplicate {
							dups.Add(1)
						} else {
							processed.Add(1)
						}
						if string(x.Stored) != "r-"+string(ms[i].Value) {
							errs <- fmt.Errorf("worker %d round %d: message %d stored %q", w, r, i, x.Stored)
							_ = tx.Rollback(ctx)
							return
						}
					}
					if rollback {
						err = tx.Rollback(ctx)
					} else {
						err = tx.Commit(ctx)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, inbox.Stats{Processed: processed.Load(), Duplicates: dups.Load()}, ib.Stats())
		require.Zero(t, b.count(t, `SELECT count(*) FROM (SELECT event FROM payments GROUP BY event HAVING count(*) > 1) d`),
			"a key's effect committed twice")
		require.Equal(t, b.inboxRows(t), b.payments(t))
	})
}

// violationCounter counts statements failed with 23505 on a traced pool.
type violationCounter struct{ uniqueViolations }

// bloatRun is one measured scenario: the failed inserts and the heap tuples
// they left dead (aborted inserts; each also leaves an entry in every index
// of pgbox_inbox that it reached: 3 indexes since migration 00130, so up to
// 3 dead index entries per dead tuple).
type bloatRun struct {
	failedInserts int64
	abortedTuples int64
	batches       int
}

// measureBloat runs scenario on a one-connection pool (so its statistics
// can be flushed) and counts the tuples inserted into pgbox_inbox that are
// not there: the aborted inserts of failed statements.
func measureBloat(t *testing.T, scenario func(run func(ib *inbox.Inbox, ms []inbox.Message) int, ib func() *inbox.Inbox) int) bloatRun {
	t.Helper()
	b := setup(t)
	ctx := context.Background()
	vc := &violationCounter{}
	cfg := b.pool.Config()
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = vc
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	tupIns := func() int64 {
		_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT pg_stat_clear_snapshot()::text || ''`).Scan(new(string)))
		require.NoError(t, pool.QueryRow(ctx, `SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'pgbox_inbox'::regclass`).Scan(&n))
		return n
	}
	batches := 0
	run := func(ib *inbox.Inbox, ms []inbox.Message) int {
		t.Helper()
		batches++
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		res, err := ib.ProcessBatch(ctx, tx, ms, storing)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		d := 0
		for _, r := range res {
			if r.Duplicate {
				d++
			}
		}
		return d
	}
	var rows0 int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox`).Scan(&rows0))
	ins0, v0 := tupIns(), vc.n.Load()
	newIb := func() *inbox.Inbox { return newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")}) }
	committedBefore := scenario(run, newIb)
	_ = committedBefore
	var rows1 int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox`).Scan(&rows1))
	ins1 := tupIns()
	return bloatRun{failedInserts: vc.n.Load() - v0, abortedTuples: (ins1 - ins0) - int64(rows1-rows0), batches: batches}
}

// hid is an event id whose order (bytewise) is unrelated to i, as with
// random ids (UUIDs): a batch's new and redelivered keys interleave in the
// insert's key order.
func hid(i int) string {
	x := uint32(i)*2654435761 + 12345
	return fmt.Sprintf("%08x-%d", x, i)
}

func hbatch(partition int32, from, n int) []inbox.Message {
	ms := make([]inbox.Message, n)
	for i := range ms {
		id := hid(from + i)
		ms[i] = msg("orders", partition, int64(from+i), "v-"+id, outbox.Header{Key: "event-id", Value: []byte(id)})
	}
	return ms
}

// Attack (cost): dead tuples and failed statements a redelivery storm
// leaves. Three shapes, each R redelivered batches of 50 after the keys
// were processed once (not measured):
//
//   - run: one partition's R batches redelivered back to back (the shape
//     the commit optimises for);
//   - overlap: each redelivered batch half old keys, half new (a rewind
//     that overlaps new records), back to back;
//   - interleaved: the same overlapping batches of partition 0, but one
//     *Inbox is shared by the consumer's partitions (as ProcessBatch's
//     callers and the adapters share it) and 20 fresh batches of other
//     partitions run between two batches of partition 0.
//
// The commit's claim is "a run of redeliveries fails once". The test
// asserts it for each shape: at most one failed insert and at most one
// batch's worth of aborted tuples per shape. It logs the numbers. Measured
// (R=20, 50 per batch, 20 others): at 9a721a5^ every shape 0 failed inserts,
// 0 aborted tuples; at 9a721a5 run 1/1, overlap 1/1, interleaved 20 failed
// inserts/30 aborted tuples/40 dead index entries, late_dup_interleaved 20
// failed inserts/1000 aborted tuples (interleaved shapes failed: the probe
// counter was per *Inbox, and fresh batches of other partitions counted it
// down, so each batch of the redelivering partition failed its insert
// again; the probe now lasts a time window instead, 502b0e4).
func TestProbeAttackRedeliveryStormBloat(t *testing.T) {
	t.Parallel()
	const R, size, others = 20, 50, 20
	shapes := map[string]func(run func(*inbox.Inbox, []inbox.Message) int, newIb func() *inbox.Inbox) int{
		"run": func(run func(*inbox.Inbox, []inbox.Message) int, newIb func() *inbox.Inbox) int {
			ib := newIb()
			for i := range R {
				run(newIb(), hbatch(0, i*size, size)) // first delivery: other Inboxes, not measured in probe state
			}
			for i := range R {
				require.Equal(t, size, run(ib, hbatch(0, i*size, size)))
			}
			return 0
		},
		"overlap": func(run func(*inbox.Inbox, []inbox.Message) int, newIb func() *inbox.Inbox) int {
			ib := newIb()
			for i := range R {
				run(newIb(), hbatch(0, i*size, size/2))
			}
			for i := range R {
				require.Equal(t, size/2, run(ib, hbatch(0, i*size, size)))
			}
			return 0
		},
		"interleaved": func(run func(*inbox.Inbox, []inbox.Message) int, newIb func() *inbox.Inbox) int {
			ib := newIb()
			for i := range R {
				run(newIb(), hbatch(0, i*size, size/2))
			}
			next := 1_000_000
			for i := range R {
				require.Equal(t, size/2, run(ib, hbatch(0, i*size, size)))
				for p := range others {
					require.Zero(t, run(ib, hbatch(int32(1+p), next, size)))
					next += size
				}
			}
			return 0
		},
	}
	// late_dup_interleaved: as interleaved, but each batch of partition 0 is
	// 49 new keys and one redelivered key that sorts after them (the worst
	// place for it: the plain insert writes the 49 rows, then fails).
	shapes["late_dup_interleaved"] = func(run func(*inbox.Inbox, []inbox.Message) int, newIb func() *inbox.Inbox) int {
		ib := newIb()
		late := func(i int) inbox.Message {
			id := fmt.Sprintf("zz-late-%03d", i)
			return msg("orders", 0, int64(i), "v-"+id, outbox.Header{Key: "event-id", Value: []byte(id)})
		}
		for i := range R {
			run(newIb(), []inbox.Message{late(i)})
		}
		next := 1_000_000
		for i := range R {
			require.Equal(t, 1, run(ib, append(hbatch(0, 500_000+i*size, size-1), late(i))))
			for p := range others {
				require.Zero(t, run(ib, hbatch(int32(1+p), next, size)))
				next += size
			}
		}
		return 0
	}
	for name, shape := range shapes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// The priming batches (first deliveries, new keys) fail nothing,
			// so everything counted comes from the redeliveries.
			before := measureBloat(t, shape)
			// The row a plain insert fails on has no index entry (the primary
			// key, checked first, refused it); each row it wrote before has
			// one in each of pgbox_inbox's 3 indexes.
			t.Logf("%s: %d batches, %d failed inserts (23505), %d aborted heap tuples, %d dead index entries",
				name, before.batches, before.failedInserts, before.abortedTuples, 3*(before.abortedTuples-before.failedInserts))
			require.LessOrEqual(t, before.failedInserts, int64(1), "a run of redeliveries fails its insert once")
			require.LessOrEqual(t, before.abortedTuples, int64(size), "at most one batch's worth of aborted inserts")
		})
	}
}

// Attack: the fallback now runs on every redelivery, so it must work in
// every way callers run their transactions: pgx's query exec modes (simple
// protocol is what PgBouncer users set) and the isolation levels a payment
// service may use. A batch of a committed key, a new key and a repeat runs
// through the failed plain insert and the fallback (probe off), then a
// second batch through the probe.
func TestProbeAttackExecModesAndIsolation(t *testing.T) {
	t.Parallel()
	modes := map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"cache_describe":  pgx.QueryExecModeCacheDescribe,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
		"exec":            pgx.QueryExecModeExec,
		"simple_protocol": pgx.QueryExecModeSimpleProtocol,
	}
	isos := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	for mname, mode := range modes {
		for _, iso := range isos {
			t.Run(fmt.Sprintf("%s/%s", mname, strings.ReplaceAll(string(iso), " ", "_")), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				ctx := context.Background()
				primeKeys(t, b, "o1", "o2")
				cfg := b.pool.Config()
				cfg.ConnConfig.DefaultQueryExecMode = mode
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				ib := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id"), LockTimeout: time.Second})
				for round, ids := range [][]string{{"n1", "o1", "n1"}, {"o2", "n2", "n1"}} {
					tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
					require.NoError(t, err)
					_, err = tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ($1, 1)`, fmt.Sprintf("prior-%d", round))
					require.NoError(t, err)
					ms := make([]inbox.Message, len(ids))
					for i, id := range ids {
						ms[i] = pev(id, int64(i))
					}
					res, err := ib.ProcessBatch(ctx, tx, ms, storing)
					require.NoError(t, err, "round %d", round)
					for i, id := range ids {
						want := strings.HasPrefix(id, "o") || (round == 0 && i == 2) || (round == 1 && id == "n1")
						require.Equal(t, want, res[i].Duplicate, "round %d message %d", round, i)
						require.Equal(t, "r-v-"+id, string(res[i].Stored), "round %d message %d", round, i)
					}
					require.NoError(t, tx.Commit(ctx))
				}
				require.Equal(t, 2+2+2, b.payments(t))
				require.Equal(t, 4, b.inboxRows(t))
			})
		}
	}
}
