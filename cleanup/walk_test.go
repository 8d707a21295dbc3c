package cleanup

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testutil"
)

// Tests of where the walks start (walk.go, issue 32): each is an attack on
// the remembered position. A position only narrows what a walk reads, so
// none of them may make the cleaner delete a key the rule keeps; each also
// checks that the keys a position could hide are pruned all the same.

// starts records where each exact-rule walk of a Cleaner started.
type starts struct {
	mu   sync.Mutex
	from map[int32][]int64
}

func recordStarts(c *Cleaner) *starts {
	s := &starts{from: map[int32][]int64{}}
	c.hookExactFrom = func(_ string, part int32, from int64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.from[part] = append(s.from[part], from)
	}
	return s
}

func (s *starts) last(part int32) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.from[part]
	if len(f) == 0 {
		return 0
	}
	return f[len(f)-1]
}

const firstEntry = math.MinInt64

// walkSetup gives a bundle with a one-partition topic t holding n records
// (compact,delete: the exact rule only), the time now and 48h before it.
func walkSetup(t *testing.T, n int) (b *testBundle, now, old time.Time) {
	t.Helper()
	b = setup(t)
	b.topic(t, "t", map[string]string{"cleanup.policy": "compact,delete"})
	b.produce(t, "t", n, time.Now())
	now = time.Now()
	return b, now, now.Add(-48 * time.Hour)
}

func (b *testBundle) dropTo(t *testing.T, offset int64) {
	t.Helper()
	require.NoError(t, b.sadmin.DeleteRecords("t", map[int32]int64{0: offset}))
}

// insertRange inserts keys name-<offset> at offsets [from, to) of partition
// 0 of topic t, positions known, received at received.
func (b *testBundle) insertRange(t *testing.T, name string, from, to int64, received time.Time) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(),
		`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
		 SELECT 'svc', 't/' || $1 || '-' || g, 't', 0, g, $4, $4 FROM generate_series($2::bigint, $3::bigint - 1) g`,
		name, from, to, received)
	require.NoError(t, err)
}

// Under a held snapshot the second pass starts where the first left off,
// not at the partition's first index entry, whose deleted keys the snapshot
// keeps; it deletes what the rule lets go all the same.
func TestExactWalkStartsWhereItLeftOff(t *testing.T) {
	t.Parallel()
	b, _, old := walkSetup(t, 60)
	ctx := context.Background()
	b.db.HoldSnapshot(t, "walk-test")
	b.insertRange(t, "a", 0, 30, old)
	b.dropTo(t, 30)
	c := b.cleaner(t, Config{Buffer: time.Hour, BatchSize: 7})
	s := recordStarts(c)
	rep, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 30, rep.Deleted)
	require.EqualValues(t, firstEntry, s.last(0), "the first pass walks from the first entry")

	b.insertRange(t, "b", 30, 50, old)
	b.dropTo(t, 50)
	rep, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 20, rep.Deleted)
	require.EqualValues(t, 30, s.last(0), "the second starts at the first pass's log start: it left nothing behind")
	require.Zero(t, b.count(t))
}

// A key younger than the buffer below the log start is left behind; the
// next walk starts no later than it, and takes it once it is old enough.
// Keys of unknown position there are the time rule's and pin nothing.
func TestExactWalkReturnsForYoungKey(t *testing.T) {
	t.Parallel()
	b, now, old := walkSetup(t, 40)
	ctx := context.Background()
	b.insertRange(t, "a", 0, 20, old)
	b.insertRange(t, "young", 13, 14, now) // a second consumer's copy, seen just now
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_inbox SET position_at = NULL WHERE key = 't/a-3'`)
	require.NoError(t, err)
	b.dropTo(t, 20)
	at := now
	c := b.cleaner(t, Config{Buffer: time.Hour, BatchSize: 4, Now: func() time.Time { return at }})
	s := recordStarts(c)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a-3", "young-13"}, b.keys(t, "t"), "too young, and position unknown (no time rule here)")

	b.insertRange(t, "b", 20, 30, old)
	b.dropTo(t, 30)
	at = now.Add(2 * time.Hour)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 13, s.last(0), "the walk returns to the key it left behind")
	require.Equal(t, []string{"a-3"}, b.keys(t, "t"), "the young key, old enough now, went")
}

// A key written behind the position after the pass went past it (a copy
// Kafka delivered before its log start moved, committed late; a second
// consumer's insert of an old offset) is never deleted while the rule keeps
// it, and the walk from the first entry, at least every fullWalkEvery, prunes
// it once the rule lets it go.
func TestExactWalkLateKeyBehind(t *testing.T) {
	t.Parallel()
	b, now, old := walkSetup(t, 20)
	ctx := context.Background()
	b.insertRange(t, "a", 0, 10, old)
	b.dropTo(t, 10)
	at := now
	c := b.cleaner(t, Config{Buffer: 30 * time.Hour, Now: func() time.Time { return at }})
	s := recordStarts(c)
	_, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, b.count(t))

	b.insertRange(t, "late", 5, 6, old)
	b.insertRange(t, "young", 6, 7, now)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, s.last(0))
	require.Equal(t, []string{"late-5", "young-6"}, b.keys(t, "t"), "behind the position: kept this pass")

	at = now.Add(fullWalkEvery)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, firstEntry, s.last(0), "the position expired: a walk from the first entry")
	require.Equal(t, []string{"young-6"}, b.keys(t, "t"), "the late key went; the young one is still within the buffer")

	// A cleaner of another process (or a restarted one) remembers nothing.
	other := b.cleaner(t, Config{Buffer: 30 * time.Hour, Now: func() time.Time { return now.Add(31 * time.Hour) }})
	s2 := recordStarts(other)
	_, err = other.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, firstEntry, s2.last(0))
	require.Zero(t, b.count(t))
}

// A key a writer holds locked is skipped; the position stays at or before
// the batch that skipped it, and the next pass takes it.
func TestExactWalkLockedKey(t *testing.T) {
	t.Parallel()
	b, _, old := walkSetup(t, 30)
	ctx := context.Background()
	b.insertRange(t, "a", 0, 25, old)
	b.dropTo(t, 25)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE pgbox_inbox SET result = 'x' WHERE key = 't/a-12'`)
	require.NoError(t, err)

	c := b.cleaner(t, Config{Buffer: time.Hour, BatchSize: 10})
	s := recordStarts(c)
	rep, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 24, rep.Deleted)
	require.NoError(t, tx.Commit(ctx))

	rep, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, s.last(0), int64(12))
	require.EqualValues(t, 1, rep.Deleted)
	require.Zero(t, b.count(t))
}

// More kept keys on one offset than a batch holds (many consumers of one
// topic, all too young): the walk goes past them, and comes back.
func TestExactWalkFullBatchOnOneOffset(t *testing.T) {
	t.Parallel()
	b, now, old := walkSetup(t, 20)
	ctx := context.Background()
	b.insertRange(t, "a", 0, 10, old)
	for i := range 5 {
		b.insertRange(t, fmt.Sprint("young", i), 4, 5, now)
	}
	b.dropTo(t, 10)
	at := now
	c := b.cleaner(t, Config{Buffer: time.Hour, BatchSize: 2, Now: func() time.Time { return at }})
	_, err := c.RunOnce(ctx)
	require.NoError(t, err)
	var young, stale int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE key LIKE 't/young%'),
		count(*) FILTER (WHERE key NOT LIKE 't/young%' AND key <> 't/a-4') FROM pgbox_inbox`).Scan(&young, &stale))
	require.Equal(t, 5, young, "the young keys on offset 4 are kept")
	require.Zero(t, stale, "every old key went (but a-4, which may share a batch with young ones)")
	at = now.Add(2 * time.Hour)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, b.count(t))
}

// A topic deleted and recreated restarts its offsets: when the new
// incarnation's log start has already passed the old position by the next
// pass, the changed topic id makes the walk start from the first entry. A
// log start that goes back does the same.
func TestExactWalkTopicRecreated(t *testing.T) {
	t.Parallel()
	b, _, old := walkSetup(t, 3)
	ctx := context.Background()
	b.insertRange(t, "a", 0, 2, old)
	b.dropTo(t, 2)
	c := b.cleaner(t, Config{Buffer: time.Hour})
	s := recordStarts(c)
	_, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, b.count(t))

	require.NoError(t, b.sadmin.DeleteTopic("t"))
	testutil.Eventually(t, 10*time.Second, "the topic recreated", func() bool {
		return b.sadmin.CreateTopic("t", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false) == nil
	})
	b.produce(t, "t", 6, time.Now())
	b.insertRange(t, "new", 0, 5, old) // the new incarnation's keys
	b.dropTo(t, 5)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, firstEntry, s.last(0))
	require.Zero(t, b.count(t), "offsets 0 and 1 of the new topic are behind the old position, and went")

	m, from := c.exactFrom("t", "id", 0, 5, time.Now())
	require.EqualValues(t, firstEntry, from)
	m.from, m.logStart = 5, 5
	c.remember(walkKey{"t", 0}, m)
	_, from = c.exactFrom("t", "id", 0, 5, time.Now())
	require.EqualValues(t, 5, from)
	_, from = c.exactFrom("t", "id", 0, 4, time.Now())
	require.EqualValues(t, firstEntry, from, "the log start went back")
	_, from = c.exactFrom("t", "id", 0, 5, time.Now().Add(-time.Hour))
	require.EqualValues(t, firstEntry, from, "the clock went back")
}

// Writers insert keys, some at positions behind the log start and the
// position (late copies), young and old, while two cleaners take turns on
// the lease under a held snapshot: no key the rule keeps is ever deleted,
// and after the positions expire every key the rule lets go is gone.
func TestExactWalkConcurrentWriters(t *testing.T) {
	t.Parallel()
	b, now, old := walkSetup(t, 400)
	ctx := context.Background()
	const buffer = time.Hour
	b.db.HoldSnapshot(t, "walk-test")
	// Keys that must stay: received within the buffer (before a far clock).
	b.insertRange(t, "keep", 0, 300, now)
	var clock sync.Mutex
	at := now
	nowf := func() time.Time { clock.Lock(); defer clock.Unlock(); return at }
	cleaners := []*Cleaner{
		b.cleaner(t, Config{Buffer: buffer, BatchSize: 16, Pause: NoPause, Now: nowf}),
		b.cleaner(t, Config{Buffer: buffer, BatchSize: 16, Pause: NoPause, Now: nowf}),
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, len(cleaners))
	for _, c := range cleaners {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := c.RunOnce(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for round := range 20 {
		start := int64(10 * (round + 1))
		b.dropTo(t, start)
		for i := range 10 {
			off := rand.Int64N(start + 10)
			b.insertRange(t, fmt.Sprintf("old%d.%d", round, i), off, off+1, old)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var kept int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_inbox WHERE key LIKE 't/keep-%'`).Scan(&kept))
	require.Equal(t, 300, kept, "no key within the buffer was deleted")

	// Past fullWalkEvery (and the buffer), both cleaners' walks start from
	// the first entry: every key behind the log start goes.
	clock.Lock()
	at = now.Add(fullWalkEvery + buffer)
	clock.Unlock()
	for _, c := range cleaners {
		_, err := c.RunOnce(ctx)
		require.NoError(t, err)
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT "offset" FROM pgbox_inbox WHERE "offset" < 200`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Empty(t, left, "every key behind the log start went")
}

// The time rule's walk starts at its last cutoff: a key of unknown position
// received before it (only a transaction open for longer than the window
// writes one) waits for the walk from the first entry. A forced window
// applied after an unforced pass walks from the first entry: the unforced
// pass left the keys of known position.
func TestTimeWalkStartsAtLastCutoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Now()
	b.topic(t, "t", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.bulkKeys(t, "t", 30, now.Add(-100*time.Hour))
	at := now
	c := b.cleaner(t, Config{Buffer: time.Hour, BatchSize: 7, Now: func() time.Time { return at }})
	rep, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 30, rep.Deleted)

	b.insertKey(t, "t", "late", now.Add(-50*time.Hour), nil)
	b.insertKey(t, "t", "fresh", now.Add(-2*time.Hour), nil)
	at = now.Add(2 * time.Hour)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"late"}, b.keys(t, "t"), "the fresh key went; the late one is behind the last cutoff")
	at = now.Add(fullWalkEvery)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, b.keys(t, "t"), "the walk from the first entry took it")

	// Keys of known position are the exact rule's (Kafka's log start is 0
	// here, so it takes none); a forced window takes them, from the first
	// entry, although the last walk ended past them.
	b.insertAt(t, "t", "known", 0, 5, now.Add(-50*time.Hour))
	forced := b.cleaner(t, Config{Buffer: time.Hour, Now: func() time.Time { return at }})
	_, err = forced.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"known"}, b.keys(t, "t"))
	forced.cfg.Topics = map[string]Topic{"t": {Window: 4 * time.Hour}} // longer than Kafka's 3h: forced
	_, err = forced.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, b.keys(t, "t"))
}
