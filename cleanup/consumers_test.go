package cleanup

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Attacks on reading a topic's keys by age one consumer at a time
// (migration 00130 dropped the per-topic age index): the time rule, a
// forced window, a dry run's count and a topic's oldest key must see every
// consumer's keys, in small batches whose keyset crosses consumers, with
// ties in age across consumers and between batches, and leave alone what
// is not theirs (another topic's keys, keys of known position, young ones).

// consumerKey inserts one key of consumer with chosen times; position
// known or not.
func (b *testBundle) consumerKey(t *testing.T, consumer, topic, key string, offset int64, received time.Time, known bool) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(),
		`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
		 VALUES ($1, $3 || '/' || $2, $3, 0, $4, $5, CASE WHEN $6 THEN $5::timestamptz END)`,
		consumer, key, topic, offset, received, known)
	require.NoError(t, err)
}

// left returns consumer/key of topic's keys, sorted.
func (b *testBundle) left(t *testing.T, topic string) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(),
		`SELECT consumer || ':' || substr(key, length(topic) + 2) FROM pgbox_inbox WHERE topic = $1 ORDER BY 1`, topic)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// seedConsumers gives topic "a" keys of four consumers, interleaved in age,
// with ties across consumers, some of known position, and a second topic
// "z" whose keys are all old. now is the cleaner's clock; keys are old
// (30h, past a 1h+1h+1h window) or young (1h).
func seedConsumers(t *testing.T, b *testBundle, now time.Time) {
	old := now.Add(-30 * time.Hour)
	var off int64
	for i, c := range []string{"c1", "c2", "c3", "c4"} {
		for j := range 5 {
			off++
			// Ages interleave across consumers, and every consumer has a key at
			// exactly old (a tie across consumers).
			at := old.Add(time.Duration(j*4+i) * time.Minute)
			if j == 0 {
				at = old
			}
			b.consumerKey(t, c, "a", c+"-old-"+string(rune('0'+j)), off, at, false)
		}
		b.consumerKey(t, c, "a", c+"-young", 100+int64(i), now.Add(-time.Hour), false)
		// Known position, old: the time rule leaves it to the exact rule
		// (unless the window is forced).
		b.consumerKey(t, c, "a", c+"-known", 200+int64(i), old, true)
		b.consumerKey(t, c, "z", c+"-other-topic", int64(i), old, false)
	}
	// A consumer with keys of "z" only.
	b.consumerKey(t, "c0", "z", "c0-only-z", 9, old, false)
}

func TestTimeRuleEveryConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	for _, tp := range []string{"a", "z"} {
		b.topic(t, tp, map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	}
	seedConsumers(t, b, now)

	// A dry run counts what the pass then deletes.
	dry, err := b.cleaner(t, Config{DryRun: true, Buffer: time.Hour, BatchSize: 3, Now: func() time.Time { return now }}).RunOnce(context.Background())
	require.NoError(t, err)
	da, _ := dry.Topic("a")
	require.Equal(t, int64(20), da.TimeWouldDelete, "every consumer's old keys of unknown position")

	// Batches of 3 over 20 keys of four consumers: the keyset crosses
	// consumers and lands on ties.
	rep, err := b.cleaner(t, Config{Buffer: time.Hour, BatchSize: 3, Now: func() time.Time { return now }}).RunOnce(context.Background())
	require.NoError(t, err)
	a, _ := rep.Topic("a")
	require.Equal(t, int64(20), a.TimeDeleted)
	require.Equal(t, []string{
		"c1:c1-known", "c1:c1-young", "c2:c2-known", "c2:c2-young",
		"c3:c3-known", "c3:c3-young", "c4:c4-known", "c4:c4-young",
	}, b.left(t, "a"), "old keys of unknown position gone, of every consumer; known and young ones kept")
	requireSameTime(t, now.Add(-30*time.Hour), a.Oldest, "the oldest key left: the known ones, of any consumer")
	z, _ := rep.Topic("z")
	require.Equal(t, int64(5), z.TimeDeleted, "another topic's keys, a consumer of that topic only included")
	require.Empty(t, b.left(t, "z"))
}

func TestForcedWindowEveryConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	// Kept forever by Kafka: only the forced window prunes, every key past it.
	b.topic(t, "a", map[string]string{"retention.ms": "-1"})
	b.topic(t, "z", map[string]string{"retention.ms": "-1"})
	seedConsumers(t, b, now)

	rep, err := b.cleaner(t, Config{BatchSize: 2, Now: func() time.Time { return now },
		Topics: map[string]Topic{"a": {Window: 2 * time.Hour}}}).RunOnce(context.Background())
	require.NoError(t, err)
	a, _ := rep.Topic("a")
	require.True(t, a.Forced)
	require.Equal(t, int64(24), a.TimeDeleted, "old keys of every consumer, known positions included")
	require.Equal(t, []string{"c1:c1-young", "c2:c2-young", "c3:c3-young", "c4:c4-young"}, b.left(t, "a"))
	requireSameTime(t, now.Add(-time.Hour), a.Oldest)
	require.Len(t, b.left(t, "z"), 5, "not forced, kept forever")
}

// The oldest key of a topic is the oldest of any consumer, whichever
// consumer sorts first.
func TestOldestKeyAcrossConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	b.topic(t, "a", map[string]string{"retention.ms": "-1"})
	b.consumerKey(t, "a-first", "a", "k1", 1, now.Add(-time.Hour), true)
	b.consumerKey(t, "m-middle", "a", "k2", 2, now.Add(-5*time.Hour), true)
	b.consumerKey(t, "m-middle", "b", "k3", 3, now.Add(-9*time.Hour), true) // another topic
	b.consumerKey(t, "z-last", "a", "k4", 4, now.Add(-3*time.Hour), true)
	rep, err := b.cleaner(t, Config{Now: func() time.Time { return now }}).RunOnce(context.Background())
	require.NoError(t, err)
	a, _ := rep.Topic("a")
	requireSameTime(t, now.Add(-5*time.Hour), a.Oldest)
	require.Equal(t, 5*time.Hour, a.OldestAge)
}
