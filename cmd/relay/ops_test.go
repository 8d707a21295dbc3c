package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// writeKeyed commits one outbox row per value, all with key, in one
// transaction; each carries the business event id "event-id: <topic>-<value>".
func writeKeyed(t *testing.T, db *testdb.DB, topic, key string, values ...string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, v := range values {
			if err := outbox.Write(ctx, tx, outbox.Message{Topic: topic, Key: []byte(key), Value: []byte(v),
				Headers: []outbox.Header{{Key: "event-id", Value: []byte(topic + "-" + v)}}}); err != nil {
				return err
			}
		}
		return nil
	}))
}

func parkedCount(t *testing.T, db *testdb.DB, topic string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgbox_outbox WHERE topic = $1 AND parked_at IS NOT NULL`, topic).Scan(&n))
	return n
}

// consumer is an in-process consumer group running the inbox adapter over
// topic "orders": its handler records each value in effects, and fails on
// "poison" until fixed is set.
type consumer struct {
	h    *inboxsarama.Handler
	stop func()
}

func startConsumer(t *testing.T, db *testdb.DB, brokers []string, fixed *atomic.Bool) *consumer {
	t.Helper()
	// Keyed by the business event id, which a replay carries unchanged: only
	// the replay suffix tells the replay from the dead-lettered original.
	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	require.NoError(t, err)
	h, err := inboxsarama.NewHandler(db.Pool, ib, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if string(m.Value) == "poison" && !fixed.Load() {
			return fmt.Errorf("cannot pay %q", m.Value)
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (value) VALUES ($1)`, string(m.Value))
		return err
	}, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{MaxAttempts: 2, RetryBackoff: inbox.NoRetryBackoff}})
	require.NoError(t, err)
	group, err := sarama.NewConsumerGroup(brokers, "payments-svc", kafkatest.Config())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := group.Consume(ctx, []string{"orders"}, h); err != nil && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	var once sync.Once
	c := &consumer{h: h, stop: func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			require.NoError(t, group.Close())
		})
	}}
	t.Cleanup(c.stop)
	return c
}

func effects(t *testing.T, db *testdb.DB) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT value, count(*)::int FROM effects GROUP BY 1`)
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var v string
		var n int
		require.NoError(t, rows.Scan(&v, &n))
		out[v] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// TestOperatorCommandsWhileRunning: with a relay (the binary) and a consumer
// group (the inbox adapter) running, the binary's operator commands list,
// retry and discard parked rows and list and replay dead letters.
func TestOperatorCommandsWhileRunning(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	exec := func(sql string) {
		_, err := db.Pool.Exec(context.Background(), sql)
		require.NoError(t, err)
	}
	exec(`CREATE TABLE effects (id bigserial PRIMARY KEY, value text NOT NULL)`)
	c := kafkatest.New(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
	brokers := c.ListenAddrs()
	p := startRelay(t, runEnv(db, c, "PGBOX_MAX_ATTEMPTS=2", "PGBOX_MAX_BACKOFF=300ms", "PGBOX_UNKNOWN_TOPIC_WINDOW=0s"), "run")
	t.Cleanup(func() { p.stop(t) })
	env := []string{"DATABASE_URL=" + db.URL}
	ops := func(args ...string) result { t.Helper(); return runRelay(t, time.Minute, env, args...) }

	// Parked rows: a topic that does not exist yet (its first row is parked
	// and holds the key's later four), and one we give up on.
	writeKeyed(t, db, "late.v1", "acct-1", "v0", "v1", "v2", "v3", "v4")
	writeKeyed(t, db, "junk.v1", "x", "junk")
	waitFor(t, "rows parked", 60*time.Second, func() bool { return parkedCount(t, db, "late.v1") == 1 && parkedCount(t, db, "junk.v1") == 1 })

	r := ops("parked", "list", "--json", "--topic", "late.v1")
	require.Equal(t, 0, r.Code, r.Stderr)
	var parked []inspect.ParkedMessage
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &parked))
	require.Len(t, parked, 1)
	require.Contains(t, parked[0].LastError, "does not exist")
	require.EqualValues(t, 4, parked[0].Held)

	r = ops("parked", "discard", "--topic", "junk.v1")
	require.Equal(t, 2, r.Code, "discard without --yes deletes nothing and exits 2")
	require.Contains(t, r.Stdout, "would discard 1 parked row(s)")
	require.Equal(t, 1, strings.Count(r.Stderr, "--yes"), r.Stderr)
	require.Equal(t, 1, parkedCount(t, db, "junk.v1"))
	r = ops("parked", "discard", "--topic", "junk.v1", "--yes")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "discarded 1 parked row(s)\n", r.Stdout)
	r = ops("parked", "discard", "--topic", "junk.v1", "--yes", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.JSONEq(t, `{"discarded": 0}`, r.Stdout)

	kafkatest.CreateTopic(t, brokers, "late.v1", 3, nil)
	r = ops("parked", "retry", "--topic", "late.v1", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.JSONEq(t, `{"retried": 1}`, r.Stdout)
	require.Len(t, eventIDs(t, c, "late.v1", 5), 5, "the retried row, then the four it held")
	r = ops("parked", "retry", "--topic", "late.v1", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.JSONEq(t, `{"retried": 0}`, r.Stdout, "twice = once")
	recs := kafkatest.ReadAll(t, brokers, "late.v1", 5, 60*time.Second)
	var got []string
	for _, m := range recs {
		got = append(got, string(m.Value))
	}
	require.Equal(t, []string{"v0", "v1", "v2", "v3", "v4"}, got, "published again, in order, on one partition")
	waitFor(t, "outbox drained", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })

	// Dead letters: a poison value the handler cannot take until it is fixed.
	var fixed atomic.Bool
	cons := startConsumer(t, db, brokers, &fixed)
	writeKeyed(t, db, "orders", "acct-2", "a", "poison", "b")
	waitFor(t, "poison dead-lettered, the rest processed", 90*time.Second, func() bool {
		e := effects(t, db)
		return cons.h.Stats().DeadLettered == 1 && e["a"] == 1 && e["b"] == 1
	})
	r = ops("dead", "list", "--json", "--consumer", "payments-svc", "--topic", "orders")
	require.Equal(t, 0, r.Code, r.Stderr)
	var dead []inspect.DeadLetter
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &dead))
	require.Len(t, dead, 1)
	require.True(t, dead[0].Replayable)
	require.Contains(t, dead[0].Error, `cannot pay "poison"`)
	id := fmt.Sprint(dead[0].ID)

	fixed.Store(true)
	r = ops("dead", "replay", id)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "replayed to orders")
	waitFor(t, "replay processed", 60*time.Second, func() bool { return effects(t, db)["poison"] == 1 })

	r = ops("dead", "replay", id, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"skipped": true`, "a second replay is a no-op")

	// Bad input: exit 2 for usage, 1 for an unknown id; the error printed once.
	r = ops("dead", "replay", "999999")
	require.Equal(t, 1, r.Code)
	require.Equal(t, 1, strings.Count(r.Stderr, "999999"), r.Stderr)
	require.Contains(t, r.Stderr, "no such dead letter")
	r = ops("dead", "replay", "abc")
	require.Equal(t, 2, r.Code)
	require.Contains(t, r.Stderr, `"abc"`)
	r = ops("dead", "list", "--older-than", "banana")
	require.Equal(t, 2, r.Code)
	require.Contains(t, r.Stderr, "--older-than")

	// Rewind the group over everything: the original poison (its key was
	// recorded when dead-lettered) and the replay (its own key) are duplicates.
	waitFor(t, "offsets committed past the replay", 30*time.Second, func() bool {
		st := cons.h.Stats()
		return st.Processed >= 3
	})
	cons.stop()
	admin, err := sarama.NewClusterAdmin(brokers, kafkatest.Config())
	require.NoError(t, err)
	require.NoError(t, admin.DeleteConsumerGroup("payments-svc"))
	require.NoError(t, admin.Close())
	cons = startConsumer(t, db, brokers, &fixed)
	waitFor(t, "rewind read every record", 90*time.Second, func() bool { return cons.h.Stats().Duplicates >= 4 })
	require.Equal(t, map[string]int{"a": 1, "b": 1, "poison": 1}, effects(t, db), "exactly once, replay and rewind included")
	require.Zero(t, cons.h.Stats().Processed)
}
