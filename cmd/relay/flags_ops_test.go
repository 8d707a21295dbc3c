package main

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// The operator commands' settings (parked, dead), each observed through
// what the command lists or changes.
func init() {
	for name, c := range map[string]flagCheck{
		"topic":          {check: checkOpsTopic},
		"older-than":     {check: checkOpsOlderThan, bad: "-1s"},
		"limit":          {check: checkOpsLimit, bad: "0"},
		"error-contains": {check: checkOpsErrorContains},
		"yes":            {check: checkOpsYes, bad: "maybe"},
		"consumer":       {check: checkOpsConsumer},
		"to-topic":       {check: checkOpsToTopic},
		"again":          {check: checkOpsAgain, bad: "maybe"},
	} {
		flagChecks[name] = c
	}
}

func opsExec(t *testing.T, db *testdb.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// park adds a parked outbox row of topic, parked age ago with errText.
func park(t *testing.T, db *testdb.DB, topic string, age time.Duration, errText string) {
	t.Helper()
	opsExec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		VALUES (gen_random_uuid(), 1, $1, 'k', 'v', 5, $3, now() - $2::interval)`, topic, age.String(), errText)
}

// dead adds a replayable dead letter and returns its id.
func dead(t *testing.T, db *testdb.DB, consumer, topic string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `INSERT INTO pgbox_consumer_dead
		(consumer, topic, partition, "offset", key, attempts, error, dlq_topic, dead_at, record_stored, record_key, record_value, record_headers)
		VALUES ($1, $2, 0, 1, $2 || '/0/1', 3, 'poison', $2 || '.dlq', now(), true, 'k1', 'v1', '[]')
		RETURNING id`, consumer, topic).Scan(&id))
	return id
}

// listed runs `<what> list --json` with the setting at v and returns the
// topics (parked) or consumers (dead) of the rows it lists.
func listed(t *testing.T, set setFn, v string, db *testdb.DB, what, field string) []string {
	t.Helper()
	r := runWith(t, set, v, []string{"DATABASE_URL=" + db.URL}, what, "list", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &rows), r.Stdout)
	var out []string
	for _, row := range rows {
		out = append(out, row[field].(string))
	}
	return out
}

func outboxTopics(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT topic FROM pgbox_outbox WHERE parked_at IS NULL ORDER BY id`)
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

func checkOpsTopic(t *testing.T, set setFn) {
	db := testdb.New(t)
	park(t, db, "t-a", time.Hour, "e")
	park(t, db, "t-b", time.Hour, "e")
	require.Equal(t, []string{"t-b"}, listed(t, set, "t-b", db, "parked", "topic"))
	dead(t, db, "svc", "t-a")
	dead(t, db, "svc", "t-b")
	require.Equal(t, []string{"t-a"}, listed(t, set, "t-a", db, "dead", "topic"))
}

func checkOpsOlderThan(t *testing.T, set setFn) {
	db := testdb.New(t)
	park(t, db, "old", 2*time.Hour, "e")
	park(t, db, "new", time.Minute, "e")
	require.Equal(t, []string{"old"}, listed(t, set, "1h", db, "parked", "topic"))
	require.Len(t, listed(t, set, "0s", db, "parked", "topic"), 2, "0: any age")
}

func checkOpsLimit(t *testing.T, set setFn) {
	db := testdb.New(t)
	for range 3 {
		park(t, db, "t", time.Hour, "e")
	}
	require.Len(t, listed(t, set, "2", db, "parked", "topic"), 2)
}

func checkOpsErrorContains(t *testing.T, set setFn) {
	db := testdb.New(t)
	park(t, db, "boom", time.Hour, "kafka: boom-1")
	park(t, db, "other", time.Hour, "unknown topic")
	require.Equal(t, []string{"boom"}, listed(t, set, "boom", db, "parked", "topic"))
}

func checkOpsYes(t *testing.T, set setFn) {
	db := testdb.New(t)
	park(t, db, "junk", time.Hour, "e")
	env := []string{"DATABASE_URL=" + db.URL}
	r := runWith(t, set, "false", env, "parked", "discard")
	require.Equal(t, 2, r.Code, "without confirmation discard deletes nothing: %s", r.Stderr)
	require.Len(t, listed(t, set, "false", db, "parked", "topic"), 1)
	r = runWith(t, set, "true", env, "parked", "discard")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "discarded 1 parked row(s)")
}

func checkOpsConsumer(t *testing.T, set setFn) {
	db := testdb.New(t)
	dead(t, db, "svc-a", "t")
	dead(t, db, "svc-b", "t")
	require.Equal(t, []string{"svc-b"}, listed(t, set, "svc-b", db, "dead", "consumer"))
}

func checkOpsToTopic(t *testing.T, set setFn) {
	db := testdb.New(t)
	id := dead(t, db, "svc", "orders")
	r := runWith(t, set, "orders.retry", []string{"DATABASE_URL=" + db.URL}, "dead", "replay", strconv.FormatInt(id, 10))
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, []string{"orders.retry"}, outboxTopics(t, db))
}

func checkOpsAgain(t *testing.T, set setFn) {
	db := testdb.New(t)
	id := dead(t, db, "svc", "orders")
	env := []string{"DATABASE_URL=" + db.URL}
	for _, v := range []string{"false", "false"} {
		r := runWith(t, set, v, env, "dead", "replay", strconv.FormatInt(id, 10))
		require.Equal(t, 0, r.Code, r.Stderr)
	}
	require.Len(t, outboxTopics(t, db), 1, "a replayed dead letter is not replayed again")
	r := runWith(t, set, "true", env, "dead", "replay", strconv.FormatInt(id, 10))
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Len(t, outboxTopics(t, db), 2, "--again replays it once more")
}
