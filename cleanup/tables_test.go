package cleanup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func (b *testBundle) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), q, args...)
	require.NoError(t, err)
}

func (b *testBundle) strings(t *testing.T, q string) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), q)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func (b *testBundle) outboxRow(t *testing.T, topic string, parked *time.Time) {
	t.Helper()
	b.exec(t, `INSERT INTO pgbox_outbox (event_id, slot, topic, value, created_at, parked_at)
		VALUES (gen_random_uuid(), 0, $1, 'v', $2, $3)`, topic, time.Now().Add(-365*24*time.Hour), parked)
}

func (b *testBundle) deadRow(t *testing.T, topic string, offset int, deadAt time.Time) {
	t.Helper()
	b.exec(t, `INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", attempts, error, dlq_topic, dead_at)
		VALUES ('svc', $1, 0, $2, 3, 'boom', $1 || '.dlq', $3)`, topic, offset, deadAt)
}

func (b *testBundle) attemptRow(t *testing.T, offset int, updated time.Time) {
	t.Helper()
	b.exec(t, `INSERT INTO pgbox_consumer_attempts (consumer, topic, partition, "offset", attempts, last_error, first_at, updated_at)
		VALUES ('svc', 't', 0, $1, 1, 'boom', $2, $2)`, offset, updated)
}

func TestPrunesTablesLeftBehind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	day := 24 * time.Hour
	b.topic(t, "short", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)}) // window 26h
	b.topic(t, "long", map[string]string{"retention.ms": ms(7 * day), "segment.ms": ms(day)})          // window 9d
	b.topic(t, "compacted", map[string]string{"cleanup.policy": "compact"})
	b.topic(t, "dead-only", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.insertKey(t, "short", "k", now, nil)
	b.insertKey(t, "long", "k", now, nil)
	b.insertKey(t, "compacted", "k", now, nil)

	// Parked outbox rows: by parked_at; unparked rows are the relay's.
	b.outboxRow(t, "p-old", ptr(now.Add(-8*day)))
	b.outboxRow(t, "p-new", ptr(now.Add(-6*day)))
	b.outboxRow(t, "unparked", nil)

	// Dead letters: the later of 2 days and the topic's own window.
	b.deadRow(t, "short", 1, now.Add(-50*time.Hour))     // past both: deleted
	b.deadRow(t, "short", 2, now.Add(-47*time.Hour))     // within 2 days: kept
	b.deadRow(t, "long", 1, now.Add(-50*time.Hour))      // within the topic's 9 days: kept
	b.deadRow(t, "long", 2, now.Add(-10*day))            // deleted
	b.deadRow(t, "compacted", 1, now.Add(-100*day))      // topic skipped: kept
	b.deadRow(t, "dead-only", 1, now.Add(-50*time.Hour)) // no inbox keys left: still pruned
	b.deadRow(t, "dead-only", 2, now.Add(-time.Hour))    // kept

	// Attempts: by updated_at.
	b.attemptRow(t, 1, now.Add(-8*day))
	b.attemptRow(t, 2, now.Add(-6*day))

	cfg := Config{
		Now:    func() time.Time { return now },
		Tables: Tables{Parked: 7 * day, DeadLetters: 2 * day},
	}
	dry, err := b.cleaner(t, Config{Now: cfg.Now, Tables: cfg.Tables, DryRun: true}).RunOnce(context.Background())
	require.NoError(t, err)
	wouldDelete := map[string]int64{}
	for _, tr := range dry.Tables {
		wouldDelete[tr.Name] = tr.WouldDelete
		require.Zero(t, tr.Deleted)
	}
	require.Equal(t, map[string]int64{"pgbox_outbox (parked)": 1, "pgbox_consumer_dead": 3, "pgbox_consumer_attempts": 1}, wouldDelete)

	rep, err := b.cleaner(t, cfg).RunOnce(context.Background())
	require.NoError(t, err)
	deleted := map[string]int64{}
	for _, tr := range rep.Tables {
		deleted[tr.Name] = tr.Deleted
	}
	require.Equal(t, wouldDelete, deleted)
	require.Equal(t, int64(5), rep.Deleted)
	_, ok := rep.Topic("dead-only")
	require.True(t, ok, "topics with dead letters only are described too")

	require.Equal(t, []string{"p-new", "unparked"}, b.strings(t, `SELECT topic FROM pgbox_outbox ORDER BY topic`))
	require.Equal(t, []string{"compacted/1", "dead-only/2", "long/1", "short/2"},
		b.strings(t, `SELECT topic || '/' || "offset" FROM pgbox_consumer_dead ORDER BY 1`))
	require.Equal(t, []string{"2"}, b.strings(t, `SELECT "offset"::text FROM pgbox_consumer_attempts`))
}

// By default parked outbox rows (unpublished events) are kept, and Forever
// keeps the others too.
func TestTablesDefaultsAndForever(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := fixedNow()
	b.topic(t, "short", map[string]string{"retention.ms": ms(time.Hour), "segment.ms": ms(time.Hour)})
	b.outboxRow(t, "parked", ptr(now.Add(-1000*24*time.Hour)))
	b.deadRow(t, "short", 1, now.Add(-1000*24*time.Hour))
	b.attemptRow(t, 1, now.Add(-1000*24*time.Hour))

	rep, err := b.cleaner(t, Config{Now: func() time.Time { return now },
		Tables: Tables{DeadLetters: Forever, Attempts: Forever}}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, rep.Deleted)
	require.Empty(t, rep.Tables)
	require.Empty(t, rep.Topics, "dead-letter topics are not described when dead letters are kept forever")

	rep, err = b.cleaner(t, Config{Now: func() time.Time { return now }}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(2), rep.Deleted, "defaults: dead letters after 30 days, attempts after 7, parked rows never")
	require.Equal(t, []string{"parked"}, b.strings(t, `SELECT topic FROM pgbox_outbox`))

	_, err = New(Config{Pool: b.db.Pool, Admin: b.admin, Tables: Tables{Parked: -2 * time.Hour}})
	require.ErrorContains(t, err, "Tables.Parked -2h0m0s is negative")
}
