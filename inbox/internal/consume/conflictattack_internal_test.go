package consume

// Hostile review of 502b0e4 (the adapters' batches insert their keys
// plainly; a key seen before aborts the adapter's transaction with an
// owntx.Conflict and inTx runs the batch again, up to maxConflictTries).
// These tests drive the loop (Run) with a fake Claim, so that a revoke, a
// zombie's commit or rollback and a slow ROLLBACK land exactly where the
// attack needs them.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// fakeClaim is one partition of topic "orders", fed by the test.
type fakeClaim struct {
	ctx     context.Context
	cancel  context.CancelFunc
	recs    chan inbox.Message
	revoked *atomic.Bool

	mu     sync.Mutex
	marked []int64
}

func newFakeClaim(revoked *atomic.Bool) *fakeClaim {
	ctx, cancel := context.WithCancel(context.Background())
	return &fakeClaim{ctx: ctx, cancel: cancel, recs: make(chan inbox.Message, 64), revoked: revoked}
}

func (c *fakeClaim) Topic() string                           { return "orders" }
func (c *fakeClaim) Partition() int32                        { return 0 }
func (c *fakeClaim) InitialOffset() int64                    { return 0 }
func (c *fakeClaim) TopicID(context.Context) (string, error) { return "", nil }
func (c *fakeClaim) Context() context.Context                { return c.ctx }
func (c *fakeClaim) Records() <-chan inbox.Message           { return c.recs }
func (c *fakeClaim) Message(m inbox.Message) inbox.Message   { return m }
func (c *fakeClaim) Mark(m inbox.Message) {
	c.mu.Lock()
	c.marked = append(c.marked, m.Offset)
	c.mu.Unlock()
}
func (c *fakeClaim) revoke() { c.revoked.Store(true); c.cancel() }
func (c *fakeClaim) lastMarked() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.marked) == 0 {
		return -1
	}
	return c.marked[len(c.marked)-1]
}

func omsg(off int64) inbox.Message {
	return inbox.Message{Topic: "orders", Partition: 0, Offset: off, Value: []byte(fmt.Sprint("payload ", off)), Timestamp: time.Now(),
		Headers: []outbox.Header{{Key: "event-id", Value: []byte(fmt.Sprint("ev-", off))}}}
}

// txTrace counts, on the loop's pool, the transactions begun (BEGIN on
// its own or first in a pipeline) before and after the claim was revoked,
// and can make the first slowRollbacks ROLLBACKs slow.
type txTrace struct {
	revoked       *atomic.Bool
	begins        atomic.Int64
	beginsRevoked atomic.Int64
	rollbacks     atomic.Int64
	slowRollbacks int64
	slow          time.Duration
	trips         atomic.Int64
}

func (tr *txTrace) begin() {
	tr.begins.Add(1)
	if tr.revoked.Load() {
		tr.beginsRevoked.Add(1)
	}
}

func (tr *txTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.trips.Add(1)
	s := strings.ToLower(strings.TrimSpace(d.SQL))
	switch {
	case strings.HasPrefix(s, "begin"):
		tr.begin()
	case strings.HasPrefix(s, "rollback"):
		if tr.rollbacks.Add(1) <= tr.slowRollbacks {
			time.Sleep(tr.slow)
		}
	}
	return ctx
}
func (tr *txTrace) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *txTrace) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	tr.trips.Add(1)
	if d.Batch != nil && len(d.Batch.QueuedQueries) > 0 && strings.HasPrefix(strings.ToLower(d.Batch.QueuedQueries[0].SQL), "begin") {
		tr.begin()
	}
	return ctx
}
func (tr *txTrace) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *txTrace) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// attackWorld is a private schema, a business table without a unique
// constraint (a double effect is two rows), and a traced pool for the loop
// whose sessions carry application_name app.
type attackWorld struct {
	db    *testdb.DB
	pool  *pgxpool.Pool
	trace *txTrace
	app   string

	mu    sync.Mutex
	calls map[int64]int // the loop's handler calls per offset
	logs  bytes.Buffer
}

func newAttackWorld(t *testing.T, revoked *atomic.Bool) *attackWorld {
	t.Helper()
	db := testdb.New(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE effects (id bigserial PRIMARY KEY, "offset" bigint NOT NULL, who text NOT NULL)`)
	require.NoError(t, err)
	w := &attackWorld{db: db, trace: &txTrace{revoked: revoked}, app: fmt.Sprintf("conflictattack-%d", time.Now().UnixNano()), calls: map[int64]int{}}
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = w.app
	cfg.ConnConfig.Tracer = w.trace
	cfg.MaxConns = 4
	w.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(w.pool.Close)
	return w
}

func effectOf(who string) inbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects ("offset", who) VALUES ($1, $2)`, m.Offset, who)
		return err
	}
}

// handler is the loop's per-message handler: it counts its calls.
func (w *attackWorld) handler() inbox.HandlerFunc {
	eff := effectOf("loop")
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		w.mu.Lock()
		w.calls[m.Offset]++
		w.mu.Unlock()
		return eff(ctx, tx, m)
	}
}

// batchHandler is the loop's batch handler: it counts its calls per message.
func (w *attackWorld) batchHandler() inbox.BatchHandlerFunc {
	h := w.handler()
	return func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
		for _, m := range ms {
			if err := h(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}
}

func (w *attackWorld) callsOf(off int64) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls[off]
}

func (w *attackWorld) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, w.db.Pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// waitLocked waits until one of the loop's sessions waits on a lock.
func (w *attackWorld) waitLocked(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		return w.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, w.app) > 0
	}, 10*time.Second, 5*time.Millisecond, "the loop's insert waits on the zombie's key")
}

// loop makes the loop under test: batches of batch, with the per-message
// handler or (batchFn) the batch handler.
func (w *attackWorld) loop(t *testing.T, ib *inbox.Inbox, batch int, batchFn bool) *Loop {
	t.Helper()
	cc := inbox.ConsumerConfig{BatchSize: batch, BatchWait: 200 * time.Millisecond, RetryBackoff: 10 * time.Millisecond,
		MaxRetryBackoff: 20 * time.Millisecond, DrainTimeout: 10 * time.Second, MaxAttempts: 3,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &w.logs, mu: &w.mu}, nil))}
	fn := w.handler()
	if batchFn {
		cc.BatchHandler, fn = w.batchHandler(), nil
	}
	l, err := New(w.pool, ib, fn, Config{Name: "attack", ConsumerConfig: cc}, "New")
	require.NoError(t, err)
	return l
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (w *attackWorld) logText() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logs.String()
}

// run runs l over claim in the background; wait returns Run's error.
func run(l *Loop, claim *fakeClaim) (wait func() error) {
	done := make(chan error, 1)
	go func() { done <- Run[inbox.Message](l, claim) }()
	return func() error {
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("Run did not return")
		}
	}
}

// zombie is another member (another process: its own Inbox) that holds
// the keys of ms uncommitted, having run its handler for them.
func zombie(t *testing.T, w *attackWorld, ms []inbox.Message) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: inbox.ByHeader("event-id")})
	require.NoError(t, err)
	tx, err := w.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	res, err := ib.ProcessBatch(ctx, tx, ms, effectOf("zombie"))
	require.NoError(t, err)
	for _, r := range res {
		require.False(t, r.Duplicate)
	}
	return tx
}

func newSvcInbox(t *testing.T, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	cfg.Consumer = "svc"
	cfg.Key = inbox.ByHeader("event-id")
	ib, err := inbox.New(cfg)
	require.NoError(t, err)
	return ib
}

// setProbeWindow sets the unexported Inbox.probeFor (inbox's export_test
// helper is not visible from here).
func setProbeWindow(ib *inbox.Inbox, d time.Duration) {
	f := reflect.ValueOf(ib).Elem().FieldByName("probeFor")
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().SetInt(int64(d))
}

// feed hands claim offsets 0..n-1.
func feed(claim *fakeClaim, n int64) {
	for i := range n {
		claim.recs <- omsg(i)
	}
}

// stopAfter waits until claim has marked offset last, revokes it and
// checks that Run (wait) ended without an error.
func stopAfter(t *testing.T, claim *fakeClaim, wait func() error, last int64) {
	t.Helper()
	require.Eventually(t, func() bool { return claim.lastMarked() == last }, 10*time.Second, 5*time.Millisecond)
	claim.revoke()
	require.NoError(t, wait())
}

// commitFirst commits offsets 0..n-1 through a first Run (the process that
// then dies before its offsets reach Kafka) and stops it.
func commitFirst(t *testing.T, w *attackWorld, n int64, batchFn bool, cfg inbox.Config) {
	t.Helper()
	var rev atomic.Bool
	claim := newFakeClaim(&rev)
	l := w.loop(t, newSvcInbox(t, cfg), int(n), batchFn)
	wait := run(l, claim)
	feed(claim, n)
	stopAfter(t, claim, wait, n-1)
	w.mu.Lock()
	clear(w.calls)
	w.mu.Unlock()
}

func requireNoAttemptsNoDLQ(t *testing.T, w *attackWorld) {
	t.Helper()
	require.Zero(t, w.count(t, `SELECT count(*) FROM pgbox_consumer_attempts`), "a Conflict is never an attempt")
	require.Zero(t, w.count(t, `SELECT count(*) FROM pgbox_outbox`), "a Conflict is never dead-lettered")
}

func bothHandlers(t *testing.T, body func(t *testing.T, batchFn bool)) {
	for _, batchFn := range []bool{false, true} {
		t.Run(map[bool]string{false: "per-message", true: "batch-handler"}[batchFn], func(t *testing.T) {
			t.Parallel()
			body(t, batchFn)
		})
	}
}

// ATTACK: the retry after the claim was revoked. The loop's batch [0, 1]
// waits on key 0, held by a zombie; the claim is revoked (the session
// ended: Claim.Context's contract is "ends when no new transaction may
// start"), then the zombie commits. The plain insert fails with 23505
// (Conflict) and inTx runs the batch again: in a NEW transaction, begun
// after the revoke (inTx checks only c.work, which outlives the session by
// DrainTimeout, not c.stopped()). At 9a721a5 (ON CONFLICT in the first
// transaction) no transaction began after the revoke: the batch finished in
// the transaction begun before it, within the drain. Offset 1's handler
// running after the revoke is the drain's, and not asserted here.
func TestConflictAttackNoTxAfterRevoke(t *testing.T) {
	t.Parallel()
	bothHandlers(t, func(t *testing.T, batchFn bool) {
		var revoked atomic.Bool
		w := newAttackWorld(t, &revoked)
		ztx := zombie(t, w, []inbox.Message{omsg(0)})
		claim := newFakeClaim(&revoked)
		l := w.loop(t, newSvcInbox(t, inbox.Config{}), 2, batchFn)
		wait := run(l, claim)
		claim.recs <- omsg(0)
		claim.recs <- omsg(1)
		w.waitLocked(t)
		begunBefore := w.trace.begins.Load()
		claim.revoke()
		require.NoError(t, ztx.Commit(context.Background()))
		require.NoError(t, wait())

		require.Equal(t, 1, w.count(t, `SELECT count(*) FROM effects WHERE "offset" = 0`), "offset 0 took effect once (the zombie's)")
		require.LessOrEqual(t, w.count(t, `SELECT count(*) FROM effects WHERE "offset" = 1`), 1)
		requireNoAttemptsNoDLQ(t, w)
		require.Zero(t, l.Stats().Failures)
		t.Logf("begins before revoke %d, after revoke %d; handler calls for offset 1 %d; marked %v",
			begunBefore, w.trace.beginsRevoked.Load(), w.callsOf(1), claim.marked)
		require.Zero(t, w.trace.beginsRevoked.Load(), "a transaction began after the claim was revoked (inTx's Conflict rerun ignores c.stopped())")
	})
}

// ATTACK: a zombie member processes the same keys concurrently; it
// commits, or it rolls back. Either way each key takes effect once, the
// loop's handler runs only for keys that are its own, Stats count each
// message once (no double counting across the Conflict's two tries), and
// nothing reaches the attempts table or the dead letters.
func TestConflictAttackZombieCommitOrRollback(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "zombie-commits", false: "zombie-rolls-back"}[commit], func(t *testing.T) {
			t.Parallel()
			bothHandlers(t, func(t *testing.T, batchFn bool) {
				var revoked atomic.Bool
				w := newAttackWorld(t, &revoked)
				ztx := zombie(t, w, []inbox.Message{omsg(1), omsg(2)})
				claim := newFakeClaim(&revoked)
				ib := newSvcInbox(t, inbox.Config{})
				l := w.loop(t, ib, 4, batchFn)
				wait := run(l, claim)
				feed(claim, 4)
				w.waitLocked(t)
				if commit {
					require.NoError(t, ztx.Commit(context.Background()))
				} else {
					require.NoError(t, ztx.Rollback(context.Background()))
				}
				stopAfter(t, claim, wait, 3)

				require.Equal(t, 4, w.count(t, `SELECT count(DISTINCT "offset") FROM effects`))
				require.Equal(t, 4, w.count(t, `SELECT count(*) FROM effects`), "no double effect")
				require.Equal(t, 4, w.count(t, `SELECT count(*) FROM pgbox_inbox`))
				own := int64(4)
				if commit {
					own = 2
					require.Equal(t, 2, w.count(t, `SELECT count(*) FROM effects WHERE who = 'zombie'`))
					require.Zero(t, w.callsOf(1), "a key the zombie committed never reaches the loop's handler")
					require.Zero(t, w.callsOf(2))
				}
				require.Equal(t, 1, w.callsOf(0))
				require.Equal(t, 1, w.callsOf(3))
				requireNoAttemptsNoDLQ(t, w)
				st := l.Stats()
				require.Equal(t, uint64(own), st.Processed)
				require.Equal(t, uint64(4-own), st.Duplicates)
				require.Zero(t, st.Failures)
				require.Zero(t, st.TransientErrors, "a Conflict is not a transient error")
				require.Zero(t, st.Retries)
				require.Zero(t, st.BatchFallbacks)
				require.Zero(t, st.DeadLettered)
				ist := ib.Stats()
				require.Equal(t, uint64(own), ist.Processed, "the inbox counts each message once across tries")
				require.Equal(t, uint64(4-own), ist.Duplicates)
				require.Zero(t, ist.HandlerErrors)
			})
		})
	}
}

// ATTACK: a restart (SIGKILL-like: offsets 0..3 committed in PostgreSQL but
// not in Kafka) re-reads them with new records after them; a new process
// (new Inbox, probe window closed) meets them with the plain insert. Also
// DedupWatermarkAndKeys, whose watermark upsert runs in the aborted try and
// again in the rerun: the watermark ends at the batch's last offset, no gap
// is reported, and Stats are exact.
func TestConflictAttackRestartRedelivery(t *testing.T) {
	t.Parallel()
	for _, dedup := range []inbox.Dedup{inbox.DedupKeys, inbox.DedupWatermarkAndKeys} {
		t.Run(dedup.String(), func(t *testing.T) {
			t.Parallel()
			bothHandlers(t, func(t *testing.T, batchFn bool) {
				var revoked atomic.Bool
				w := newAttackWorld(t, &revoked)
				cfg := inbox.Config{Dedup: dedup}
				commitFirst(t, w, 4, batchFn, cfg)
				rb := w.trace.rollbacks.Load()

				claim := newFakeClaim(&revoked)
				ib := newSvcInbox(t, cfg)
				l := w.loop(t, ib, 8, batchFn)
				wait := run(l, claim)
				feed(claim, 8)
				stopAfter(t, claim, wait, 7)

				require.Equal(t, 8, w.count(t, `SELECT count(*) FROM effects`))
				require.Equal(t, 8, w.count(t, `SELECT count(DISTINCT "offset") FROM effects`))
				for i := range int64(8) {
					want := 0
					if i >= 4 {
						want = 1
					}
					require.Equal(t, want, w.callsOf(i), "handler calls of offset %d", i)
				}
				requireNoAttemptsNoDLQ(t, w)
				st := l.Stats()
				require.Equal(t, inbox.ConsumerStats{Processed: 4, Duplicates: 4}, st)
				ist := ib.Stats()
				require.Equal(t, uint64(4), ist.Processed)
				require.Equal(t, uint64(4), ist.Duplicates)
				require.Zero(t, ist.Gaps)
				if dedup == inbox.DedupKeys {
					require.Equal(t, int64(1), w.trace.rollbacks.Load()-rb, "the redelivered batch failed its plain insert once")
				}
				if dedup == inbox.DedupWatermarkAndKeys {
					require.Equal(t, 7, w.count(t, `SELECT "offset" FROM pgbox_inbox_watermark WHERE consumer = 'svc'`))
				}
			})
		})
	}
}

// ATTACK: Config.LockTimeout with a key in flight. The plain insert waits
// on the zombie's key and fails with ErrInFlight (retried, uncounted, as
// before the change); once the zombie commits, the next try meets 23505,
// Conflict, and the rerun takes ON CONFLICT. No attempt, no dead letter.
func TestConflictAttackLockTimeoutInFlight(t *testing.T) {
	t.Parallel()
	bothHandlers(t, func(t *testing.T, batchFn bool) {
		var revoked atomic.Bool
		w := newAttackWorld(t, &revoked)
		ztx := zombie(t, w, []inbox.Message{omsg(0)})
		claim := newFakeClaim(&revoked)
		ib := newSvcInbox(t, inbox.Config{LockTimeout: 50 * time.Millisecond})
		l := w.loop(t, ib, 2, batchFn)
		wait := run(l, claim)
		claim.recs <- omsg(0)
		claim.recs <- omsg(1)
		require.Eventually(t, func() bool { return ib.Stats().InFlight >= 2 }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, int64(-1), claim.lastMarked())
		require.NoError(t, ztx.Commit(context.Background()))
		stopAfter(t, claim, wait, 1)

		require.Equal(t, 2, w.count(t, `SELECT count(*) FROM effects`))
		require.Zero(t, w.callsOf(0))
		require.Equal(t, 1, w.callsOf(1))
		requireNoAttemptsNoDLQ(t, w)
		st := l.Stats()
		require.Zero(t, st.Failures)
		require.Zero(t, st.DeadLettered)
		require.Equal(t, uint64(1), st.Processed)
		require.Equal(t, uint64(1), st.Duplicates)
		require.Positive(t, st.TransientErrors, "ErrInFlight is a transient error, as before")
	})
}

// ATTACK: the probe window expires exactly between the failed try and its
// rerun (a slow ROLLBACK longer than the window): the rerun takes the
// plain insert again. slow is how many ROLLBACKs are slow: 1, the third try
// succeeds; 2, all maxConflictTries tries fail, and the batch goes to the
// retry skeleton as an ordinary error. The redelivery must then be neither
// counted as a failure nor dead-lettered, and must still be processed.
func TestConflictAttackProbeWindowExpiresBeforeRerun(t *testing.T) {
	t.Parallel()
	for _, slow := range []int64{1, 2} {
		t.Run(fmt.Sprintf("slow-rollbacks-%d", slow), func(t *testing.T) {
			t.Parallel()
			bothHandlers(t, func(t *testing.T, batchFn bool) {
				var revoked atomic.Bool
				w := newAttackWorld(t, &revoked)
				commitFirst(t, w, 2, batchFn, inbox.Config{})
				rb := w.trace.rollbacks.Load()
				w.trace.slowRollbacks, w.trace.slow = rb+slow, 150*time.Millisecond

				claim := newFakeClaim(&revoked)
				ib := newSvcInbox(t, inbox.Config{})
				setProbeWindow(ib, 50*time.Millisecond)
				l := w.loop(t, ib, 4, batchFn)
				wait := run(l, claim)
				feed(claim, 4)
				stopAfter(t, claim, wait, 3)

				require.Equal(t, 4, w.count(t, `SELECT count(*) FROM effects`))
				require.Zero(t, w.callsOf(0))
				require.Zero(t, w.callsOf(1))
				require.Equal(t, 1, w.callsOf(2))
				require.Equal(t, 1, w.callsOf(3))
				requireNoAttemptsNoDLQ(t, w)
				st := l.Stats()
				require.Zero(t, st.Failures, "a redelivery is never a handler failure")
				require.Zero(t, st.DeadLettered)
				require.Zero(t, st.BatchFallbacks)
				require.Equal(t, uint64(2), st.Processed)
				require.Equal(t, uint64(2), st.Duplicates)
				tries := w.trace.rollbacks.Load() - rb
				t.Logf("slow=%d: %d rolled-back tries, stats %+v", slow, tries, st)
				if slow == 1 {
					require.Equal(t, int64(2), tries, "two Conflicts, the third try took ON CONFLICT")
					require.Zero(t, st.TransientErrors)
				} else {
					require.GreaterOrEqual(t, tries, int64(3))
					// What the user sees past maxConflictTries: a
					// transient error (a WARN, TransientErrors, a backoff),
					// never an ERROR, never an attempt.
					require.Positive(t, st.TransientErrors)
					require.Contains(t, w.logText(), "transient database error, retrying")
					require.NotContains(t, w.logText(), "level=ERROR")
					t.Logf("log past maxConflictTries:\n%s", w.logText())
				}
			})
		})
	}
}

// ATTACK: the work context ends (DrainTimeout after a revoke) while the
// Conflict's rerun waits on a key another zombie holds. The rerun fails,
// is rolled back, and nothing is marked, called or written by the loop.
func TestConflictAttackDrainTimeoutMidRerun(t *testing.T) {
	t.Parallel()
	bothHandlers(t, func(t *testing.T, batchFn bool) {
		var revoked atomic.Bool
		w := newAttackWorld(t, &revoked)
		z0 := zombie(t, w, []inbox.Message{omsg(0)})
		z1 := zombie(t, w, []inbox.Message{omsg(1)})
		claim := newFakeClaim(&revoked)
		l := w.loop(t, newSvcInbox(t, inbox.Config{}), 2, batchFn)
		l.cfg.DrainTimeout = 300 * time.Millisecond
		wait := run(l, claim)
		claim.recs <- omsg(0)
		claim.recs <- omsg(1)
		w.waitLocked(t) // on ev-0
		rb := w.trace.rollbacks.Load()
		require.NoError(t, z0.Commit(context.Background()))
		// The rerun (ON CONFLICT) now waits on ev-1.
		require.Eventually(t, func() bool { return w.trace.rollbacks.Load() > rb }, 10*time.Second, 5*time.Millisecond)
		w.waitLocked(t)
		claim.revoke() // the drain timeout then cancels the work context
		require.NoError(t, wait())
		require.NoError(t, z1.Rollback(context.Background()))

		require.Equal(t, int64(-1), claim.lastMarked(), "nothing marked that did not commit")
		require.Zero(t, w.callsOf(0))
		require.Zero(t, w.callsOf(1))
		require.Zero(t, w.count(t, `SELECT count(*) FROM effects WHERE who = 'loop'`))
		require.Equal(t, 1, w.count(t, `SELECT count(*) FROM pgbox_inbox`), "only the committed zombie's key")
		requireNoAttemptsNoDLQ(t, w)
		require.Zero(t, l.Stats().Failures)
	})
}
