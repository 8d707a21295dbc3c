package inspect_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// parkRows inserts n parked rows of topic, parked age ago with errText.
func parkRows(t *testing.T, db *testdb.DB, topic string, n int, age time.Duration, errText string) {
	t.Helper()
	exec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		SELECT gen_random_uuid(), 1, $1, 'k', 'v', 5, $4, now() - $3::interval FROM generate_series(1, $2)`,
		topic, n, age.String(), errText)
}

func parkedIDs(t *testing.T, db *testdb.DB, f inspect.ParkedFilter) []int64 {
	t.Helper()
	rows, err := inspect.ListParked(context.Background(), db.Pool, f)
	require.NoError(t, err)
	ids := []int64{}
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestParkedListFilters(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	parkRows(t, db, "orders", 2, 2*time.Hour, "UNKNOWN_TOPIC_OR_PARTITION") // ids 1, 2
	parkRows(t, db, "payments", 1, time.Minute, "MESSAGE_TOO_LARGE")        // id 3
	outboxRows(t, db, "orders", 1, 1, 0)                                    // id 4, not parked

	require.Equal(t, []int64{1, 2, 3}, parkedIDs(t, db, inspect.ParkedFilter{}))
	require.Equal(t, []int64{1, 2}, parkedIDs(t, db, inspect.ParkedFilter{Topic: "orders"}))
	require.Equal(t, []int64{}, parkedIDs(t, db, inspect.ParkedFilter{Topic: "no-such-topic"}))
	require.Equal(t, []int64{3}, parkedIDs(t, db, inspect.ParkedFilter{ErrorContains: "TOO_LARGE"}))
	require.Equal(t, []int64{1, 2}, parkedIDs(t, db, inspect.ParkedFilter{OlderThan: time.Hour}))
	require.Equal(t, []int64{2, 3}, parkedIDs(t, db, inspect.ParkedFilter{IDs: []int64{2, 3, 4}}))
	require.Equal(t, []int64{1}, parkedIDs(t, db, inspect.ParkedFilter{Limit: 1}))
	n, err := inspect.CountParked(ctx, db.Pool, inspect.ParkedFilter{Topic: "orders"})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)

	rows, err := inspect.ListParked(ctx, db.Pool, inspect.ParkedFilter{IDs: []int64{3}})
	require.NoError(t, err)
	require.Equal(t, "payments", rows[0].Topic)
	require.Equal(t, []byte("k"), rows[0].Key)
	require.Equal(t, 5, rows[0].Attempts)
	require.Equal(t, "MESSAGE_TOO_LARGE", rows[0].LastError)

	for _, f := range []inspect.ParkedFilter{{OlderThan: -time.Second}, {Limit: -1}, {BatchSize: -1}, {IDs: []int64{0}}} {
		_, err := inspect.ListParked(ctx, db.Pool, f)
		require.Error(t, err, "%+v", f)
		_, err = inspect.RetryParked(ctx, db.Pool, f)
		require.Error(t, err, "%+v", f)
	}
}

func TestRetryParked(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	parkRows(t, db, "orders", 5, time.Hour, "UNKNOWN_TOPIC_OR_PARTITION") // ids 1-5
	parkRows(t, db, "payments", 1, time.Hour, "MESSAGE_TOO_LARGE")        // id 6

	// Batches of 2 across 5 rows: every batch is walked.
	n, err := inspect.RetryParked(ctx, db.Pool, inspect.ParkedFilter{Topic: "orders", BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	var parked, attempts int
	var lastErr string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE parked_at IS NOT NULL), sum(attempts), max(last_error)
		FROM pgbox_outbox WHERE topic = 'orders'`).Scan(&parked, &attempts, &lastErr))
	require.Zero(t, parked)
	require.Zero(t, attempts)
	require.Equal(t, "UNKNOWN_TOPIC_OR_PARTITION", lastErr, "the last error is kept for the operator")
	require.Equal(t, []int64{6}, parkedIDs(t, db, inspect.ParkedFilter{}))

	// Twice = once: nothing is parked any more.
	n, err = inspect.RetryParked(ctx, db.Pool, inspect.ParkedFilter{Topic: "orders"})
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestDiscardSparesRowUnparkedMeanwhile: a discard that waits on a row a
// concurrent retry is unparking does not delete it once the retry commits
// (the statement re-checks parked_at on the row itself).
func TestDiscardSparesRowUnparkedMeanwhile(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	parkRows(t, db, "orders", 3, time.Hour, "boom") // ids 1-3

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	n, err := inspect.RetryParked(ctx, tx, inspect.ParkedFilter{IDs: []int64{2}})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	done := make(chan int64, 1)
	go func() {
		n, err := inspect.DiscardParked(ctx, db.Pool, inspect.ParkedFilter{Topic: "orders"})
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	// The discard waits on row 2's lock until the retry commits.
	require.Eventually(t, func() bool {
		var waiting bool
		_ = db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM pgbox_outbox%')`).Scan(&waiting)
		return waiting
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, int64(2), <-done)

	var left []int64
	rows, err := db.Pool.Query(ctx, `SELECT id FROM pgbox_outbox ORDER BY id`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{2}, left, "the row unparked meanwhile stays, to be published")

	// Twice = once.
	n, err = inspect.DiscardParked(ctx, db.Pool, inspect.ParkedFilter{Topic: "orders"})
	require.NoError(t, err)
	require.Zero(t, n)
}

// deadRow inserts a dead letter of a stored record and returns its id.
func deadRow(t *testing.T, db *testdb.DB, consumer, topic string, offset int64, age time.Duration, stored bool) int64 {
	t.Helper()
	hs, err := json.Marshal([]outbox.Header{{Key: "trace", Value: []byte("t1")}, {Key: inbox.ReplayHeader, Value: []byte("old")}})
	require.NoError(t, err)
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `INSERT INTO pgbox_consumer_dead
		(consumer, topic, partition, "offset", key, attempts, error, dlq_topic, dead_at, record_stored, record_key, record_value, record_headers)
		VALUES ($1, $2, 0, $3::bigint, $2 || '/0/' || $3::bigint::text, 3, 'poison', $2 || '.dlq', now() - $4::interval, $5, 'k1', 'v1', $6)
		RETURNING id`, consumer, topic, offset, age.String(), stored, string(hs)).Scan(&id))
	return id
}

func TestListDead(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	a := deadRow(t, db, "svc", "orders", 1, 2*time.Hour, true)
	b := deadRow(t, db, "svc", "payments", 2, time.Minute, true)
	c := deadRow(t, db, "audit", "orders", 3, time.Minute, false)

	ids := func(f inspect.DeadFilter) []int64 {
		t.Helper()
		rows, err := inspect.ListDead(ctx, db.Pool, f)
		require.NoError(t, err)
		out := []int64{}
		for _, r := range rows {
			out = append(out, r.ID)
		}
		return out
	}
	require.Equal(t, []int64{a, b, c}, ids(inspect.DeadFilter{}))
	require.Equal(t, []int64{a, b}, ids(inspect.DeadFilter{Consumer: "svc"}))
	require.Equal(t, []int64{a, c}, ids(inspect.DeadFilter{Topic: "orders"}))
	require.Equal(t, []int64{a}, ids(inspect.DeadFilter{OlderThan: time.Hour}))
	require.Equal(t, []int64{}, ids(inspect.DeadFilter{Topic: "nope"}))
	require.Equal(t, []int64{a}, ids(inspect.DeadFilter{Limit: 1}))
	rows, err := inspect.ListDead(ctx, db.Pool, inspect.DeadFilter{IDs: []int64{c}})
	require.NoError(t, err)
	require.False(t, rows[0].Replayable)
	require.Equal(t, "poison", rows[0].Error)
	_, err = inspect.ListDead(ctx, db.Pool, inspect.DeadFilter{OlderThan: -time.Minute})
	require.ErrorContains(t, err, "OlderThan")
}

func outboxMessages(t *testing.T, db *testdb.DB) []outbox.Message {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT topic, key, value, headers FROM pgbox_outbox ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Message, error) {
		var m outbox.Message
		var hs []byte
		if err := r.Scan(&m.Topic, &m.Key, &m.Value, &hs); err != nil {
			return m, err
		}
		return m, json.Unmarshal(hs, &m.Headers)
	})
	require.NoError(t, err)
	return out
}

func TestReplayDead(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	a := deadRow(t, db, "svc", "orders", 1, time.Hour, true)
	old := deadRow(t, db, "svc", "orders", 2, time.Hour, false)

	res, err := inspect.ReplayDead(ctx, db.Pool, []int64{a}, inspect.ReplayConfig{})
	require.NoError(t, err)
	tag := func(id int64, n string) string { return strconv.FormatInt(id, 10) + n }
	require.Equal(t, []inspect.Replay{{ID: a, Topic: "orders", ReplayOf: tag(a, "")}}, res)
	msgs := outboxMessages(t, db)
	require.Len(t, msgs, 1)
	require.Equal(t, outbox.Message{Topic: "orders", Key: []byte("k1"), Value: []byte("v1"), Headers: []outbox.Header{
		{Key: "trace", Value: []byte("t1")}, {Key: inbox.ReplayHeader, Value: []byte(tag(a, ""))},
	}}, msgs[0], "the record's headers kept, an earlier replay header replaced")
	dl, err := inspect.ListDead(ctx, db.Pool, inspect.DeadFilter{IDs: []int64{a}})
	require.NoError(t, err)
	require.Equal(t, 1, dl[0].Replays)
	require.NotNil(t, dl[0].ReplayedAt)
	require.Equal(t, "orders", dl[0].ReplayedTo)

	// Twice = once.
	res, err = inspect.ReplayDead(ctx, db.Pool, []int64{a}, inspect.ReplayConfig{})
	require.NoError(t, err)
	require.Equal(t, []inspect.Replay{{ID: a, Skipped: true}}, res)
	require.Len(t, outboxMessages(t, db), 1)

	// Again: a new replay, a new id, to the chosen topic.
	res, err = inspect.ReplayDead(ctx, db.Pool, []int64{a}, inspect.ReplayConfig{Again: true, ToTopic: "orders.retry"})
	require.NoError(t, err)
	require.Equal(t, []inspect.Replay{{ID: a, Topic: "orders.retry", ReplayOf: tag(a, ".2")}}, res)
	require.Len(t, outboxMessages(t, db), 2)

	// Bad input: the error names the id or topic; nothing written, all or nothing.
	_, err = inspect.ReplayDead(ctx, db.Pool, []int64{a, 999}, inspect.ReplayConfig{Again: true})
	require.ErrorIs(t, err, inspect.ErrDeadNotFound)
	require.ErrorContains(t, err, "999")
	_, err = inspect.ReplayDead(ctx, db.Pool, []int64{a, old}, inspect.ReplayConfig{Again: true})
	require.ErrorIs(t, err, inspect.ErrNotReplayable)
	_, err = inspect.ReplayDead(ctx, db.Pool, []int64{a}, inspect.ReplayConfig{ToTopic: "bad topic"})
	require.ErrorContains(t, err, `"bad topic"`)
	_, err = inspect.ReplayDead(ctx, db.Pool, nil, inspect.ReplayConfig{})
	require.Error(t, err)
	require.Len(t, outboxMessages(t, db), 2)
}

// TestReplayDeadConcurrent: two replays of one dead letter at once write
// one replay (they serialize on the row).
func TestReplayDeadConcurrent(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	a := deadRow(t, db, "svc", "orders", 1, time.Hour, true)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := inspect.ReplayDead(ctx, db.Pool, []int64{a}, inspect.ReplayConfig{})
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	require.Len(t, outboxMessages(t, db), 1)
}

// Every operator function refuses a nil database and negative filter values
// with an error naming the field, before touching anything.
func TestOpsValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	badParked := inspect.ParkedFilter{OlderThan: -time.Second, Limit: -1, BatchSize: -1, IDs: []int64{0}}
	for name, call := range map[string]func() error{
		"ListParked":    func() error { _, err := inspect.ListParked(ctx, nil, badParked); return err },
		"CountParked":   func() error { _, err := inspect.CountParked(ctx, nil, badParked); return err },
		"RetryParked":   func() error { _, err := inspect.RetryParked(ctx, nil, badParked); return err },
		"DiscardParked": func() error { _, err := inspect.DiscardParked(ctx, nil, badParked); return err },
	} {
		err := call()
		for _, want := range []string{"nil database", "OlderThan -1s", "Limit -1", "BatchSize -1", "id 0 is not a row id"} {
			require.ErrorContains(t, err, want, name)
		}
	}
	_, err := inspect.ListDead(ctx, nil, inspect.DeadFilter{OlderThan: -time.Second, Limit: -1})
	for _, want := range []string{"nil database", "OlderThan -1s", "Limit -1"} {
		require.ErrorContains(t, err, want)
	}
	_, err = inspect.ReplayDead(ctx, nil, []int64{1}, inspect.ReplayConfig{})
	require.ErrorContains(t, err, "nil database")
	db := testdb.New(t)
	_, err = inspect.ReplayDead(ctx, db.Pool, nil, inspect.ReplayConfig{})
	require.ErrorContains(t, err, "no dead letter ids")
	_, err = inspect.ReplayDead(ctx, db.Pool, []int64{-3}, inspect.ReplayConfig{})
	require.ErrorContains(t, err, "id -3 is not a row id")
}
