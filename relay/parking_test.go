package relay_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
)

// valuesOf returns the values of key's records in topic order.
func valuesOf(got []*sarama.ConsumerMessage, key string) []string {
	var vs []string
	for _, m := range got {
		if string(m.Key) == key {
			vs = append(vs, string(m.Value))
		}
	}
	return vs
}

func parkedRow(t *testing.T, b *testBundle, key string) inspect.ParkedMessage {
	t.Helper()
	list, err := inspect.ListParked(context.Background(), b.db.Pool, inspect.ParkedFilter{Topic: "late"})
	require.NoError(t, err)
	for _, p := range list {
		if string(p.Key) == key {
			return p
		}
	}
	t.Fatalf("no parked row of key %s", key)
	return inspect.ParkedMessage{}
}

// The reproduction: the first write of a key goes to a topic that
// does not exist yet and is parked (after the unknown-topic window); the
// topic is then created and the key written again. The second write must
// not land before the first: it is held behind the parked row (other keys,
// of that topic and others, go on), `parked retry` publishes the first and
// then the second, in order, and `parked discard` releases the rows a
// discarded row held.
func TestParkedRowHoldsItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config("a")
	cfg.UnknownTopicWindow = 300 * time.Millisecond
	a := start(t, cfg)

	b.write(t, msg("late", "k", "first"), msg("late", "gone", "discarded"))
	testutil.Eventually(t, 30*time.Second, "rows of the missing topic parked", func() bool {
		return b.outboxCount(t, "topic = 'late' AND parked_at IS NOT NULL") == 2
	})
	require.Equal(t, 2, b.outboxCount(t, "topic = 'late' AND failing_since IS NOT NULL AND last_error ILIKE '%topic%'"))

	kafkatest.CreateTopic(t, b.addrs, "late", 1, nil)
	b.write(t, msg("late", "k", "second"), msg("late", "gone", "after-1"))
	b.write(t, msg("late", "gone", "after-2"))
	b.write(t, msg("late", "other", "not held"), msg(b.topic, "k", "other topic, same key"))

	// Other keys go on, in the late topic and in others; k and gone wait.
	got := readTopic(t, b, "late", 1)
	require.Equal(t, []string{"not held"}, valuesOf(got, "other"))
	require.Equal(t, []string{"other topic, same key"}, valuesOf(readTopic(t, b, b.topic, 1), "k"))
	testutil.Eventually(t, 10*time.Second, "the unheld rows deleted", func() bool { return b.outboxCount(t, "true") == 5 })
	require.Equal(t, 3, b.outboxCount(t, "topic = 'late' AND parked_at IS NULL"), "held rows stay unparked, untried")
	require.Equal(t, 3, b.outboxCount(t, "topic = 'late' AND parked_at IS NULL AND attempts = 0"))
	require.EqualValues(t, 1, parkedRow(t, b, "k").Held)
	require.EqualValues(t, 2, parkedRow(t, b, "gone").Held)
	snap, err := inspect.Read(ctx, b.db.Pool, inspect.Config{})
	require.NoError(t, err)
	held := map[string]int64{}
	for _, p := range snap.Parked {
		held[p.EventID] = p.Held
	}
	require.Contains(t, held, parkedRow(t, b, "k").EventID)
	require.EqualValues(t, 1, held[parkedRow(t, b, "k").EventID])

	// Retry: the first write goes out, then the second.
	n, err := inspect.RetryParked(ctx, b.db.Pool, inspect.ParkedFilter{IDs: []int64{parkedRow(t, b, "k").ID}})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	got = readTopic(t, b, "late", 3)
	require.Equal(t, []string{"first", "second"}, valuesOf(got, "k"), "commit order per key")

	// Discard: the rows it held go on, in order.
	n, err = inspect.DiscardParked(ctx, b.db.Pool, inspect.ParkedFilter{Topic: "late"})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	got = readTopic(t, b, "late", 5)
	require.Equal(t, []string{"after-1", "after-2"}, valuesOf(got, "gone"))
	testutil.Eventually(t, 10*time.Second, "outbox emptied", func() bool { return b.outboxCount(t, "true") == 0 })
	testutil.Eventually(t, 10*time.Second, "parked counted", func() bool { return a.r.Stats().Parked == 2 })
}

// A topic that does not exist is retried for the unknown-topic window, not
// parked after MaxAttempts quick failures: a topic created within the
// window gets the row, and the key's order is kept meanwhile.
func TestUnknownTopicRetriedForTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("a")
	cfg.MaxAttempts = 2
	cfg.UnknownTopicWindow = time.Hour
	start(t, cfg)

	b.write(t, msg("soon", "k", "first"))
	b.write(t, msg("soon", "k", "second"))
	testutil.Eventually(t, 30*time.Second, "failed more than MaxAttempts times", func() bool {
		return b.outboxCount(t, "topic = 'soon' AND key = 'k' AND attempts > 3") == 1
	})
	require.Zero(t, b.outboxCount(t, "parked_at IS NOT NULL"), "not parked within the window")
	require.Equal(t, 1, b.outboxCount(t, "value = 'second' AND attempts = 0"), "the key's later row waits, untried")

	kafkatest.CreateTopic(t, b.addrs, "soon", 1, nil)
	require.Equal(t, []string{"first", "second"}, valuesOf(readTopic(t, b, "soon", 2), "k"))
}

// Parking does not flood the log: a row that keeps failing is logged once
// when it starts failing and once when it is parked, with the true reason
// (here: its topic never appeared within the unknown-topic window, not
// "max_attempts"); its attempts in between are only counted.
func TestParkingLogsOnceARowWithTheReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var buf testutil.SyncBuffer
	cfg := b.config("a")
	cfg.UnknownTopicWindow = time.Second
	cfg.MaxBackoff = 100 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	start(t, cfg)

	const rows = 20
	var msgs []outbox.Message
	for i := range rows {
		msgs = append(msgs, msg("missing", keyed(i), "v"))
	}
	b.write(t, msgs...)
	testutil.Eventually(t, 30*time.Second, "rows parked", func() bool {
		return b.outboxCount(t, "parked_at IS NOT NULL") == rows
	})
	require.Greater(t, b.outboxCount(t, "attempts > 1"), 0, "rows were tried several times")
	testutil.Eventually(t, 10*time.Second, "parking logged", func() bool {
		return strings.Count(buf.String(), "row parked") == rows
	})
	logs := buf.String()
	require.Equal(t, rows, strings.Count(logs, "level=WARN msg=\"topic does not exist"), "one line per row when it starts failing:\n%s", logs)
	require.Equal(t, rows, strings.Count(logs, "unknown-topic window (1s)"), "the reason of each parking")
	require.NotContains(t, logs, "max_attempts)")
}
