package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

type storedRow struct {
	EventID outbox.EventID
	Slot    int16
	Topic   string
	Key     []byte
	Value   []byte
	Headers []outbox.Header
}

func readRows(t *testing.T, db *testdb.DB) []storedRow {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT event_id, slot, topic, key, value, headers FROM pgbox_outbox ORDER BY id`)
	require.NoError(t, err)
	var out []storedRow
	for rows.Next() {
		var r storedRow
		var h []byte
		require.NoError(t, rows.Scan(&r.EventID, &r.Slot, &r.Topic, &r.Key, &r.Value, &h))
		if h != nil {
			require.NoError(t, json.Unmarshal(h, &r.Headers))
		}
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestWriteStoresMessagesAsGiven(t *testing.T) {
	t.Parallel()
	forKinds(t, testWriteStoresMessagesAsGiven)
}

func testWriteStoresMessagesAsGiven(t *testing.T, db *testdb.DB, k txKind) {
	ctx := context.Background()

	msgs := []outbox.Message{
		{Topic: "payments.v1", Key: []byte("order-1"), Value: []byte(`{"amount":10}`),
			Headers: []outbox.Header{{Key: "trace", Value: []byte("abc")}, {Key: "bin", Value: []byte{0, 0xff}}, {Key: "nil"}, {Key: "", Value: []byte("empty key")}}},
		{Topic: "payments.v1", Key: []byte("order-2"), Value: nil},           // tombstone
		{Topic: "audit_log-2", Key: nil, Value: []byte("no key")},            // no key
		{Topic: "payments.v1", Key: []byte{}, Value: []byte{}},               // empty, not nil
		{Topic: "payments.v1", Key: []byte("order-1"), Value: []byte("2nd")}, // same key → same slot
	}
	tx := begin(t, db, k)
	require.NoError(t, tx.write(ctx, nil, msgs...))
	require.NoError(t, tx.commit(ctx))

	got := readRows(t, db)
	require.Len(t, got, len(msgs))
	seen := map[outbox.EventID]bool{}
	for i, r := range got {
		m := msgs[i]
		require.Equal(t, m.Topic, r.Topic, "row %d", i)
		require.Equal(t, m.Key == nil, r.Key == nil, "row %d key nil-ness", i)
		require.Equal(t, string(m.Key), string(r.Key), "row %d", i)
		require.Equal(t, m.Value == nil, r.Value == nil, "row %d value nil-ness", i)
		require.Equal(t, string(m.Value), string(r.Value), "row %d", i)
		require.Equal(t, len(m.Headers), len(r.Headers), "row %d", i)
		for j := range m.Headers {
			require.Equal(t, m.Headers[j].Key, r.Headers[j].Key)
			require.Equal(t, m.Headers[j].Value, r.Headers[j].Value)
		}
		require.Equal(t, byte(7), r.EventID[6]>>4, "UUID version 7")
		require.Equal(t, byte(2), r.EventID[8]>>6, "RFC 9562 variant")
		require.WithinDuration(t, time.Now(), r.EventID.Time(), time.Minute)
		require.False(t, seen[r.EventID], "event ids unique")
		seen[r.EventID] = true
		require.EqualValues(t, slot.Of(m.Key, r.EventID), r.Slot)
	}
	require.Equal(t, got[0].Slot, got[4].Slot, "one key, one slot")
	require.Less(t, got[0].EventID.String(), got[4].EventID.String(), "event ids are time-ordered")
}

func TestRolledBackWriteLeavesNothing(t *testing.T) {
	t.Parallel()
	forKinds(t, func(t *testing.T, db *testdb.DB, k txKind) {
		ctx := context.Background()
		tx := begin(t, db, k)
		require.NoError(t, tx.write(ctx, nil, outbox.Message{Topic: "t", Key: []byte("k"), Value: []byte("v")}))
		require.Equal(t, 1, tx.rows(t))
		require.NoError(t, tx.rollback(ctx))
		require.Empty(t, readRows(t, db))
	})
}

func TestEventIDsIncrease(t *testing.T) {
	t.Parallel()
	prev := outbox.NewEventID()
	for range 20000 { // more than the 4096 counter values of one millisecond
		id := outbox.NewEventID()
		require.Less(t, prev.String(), id.String())
		prev = id
	}
	require.Len(t, prev.String(), 36)
}

// Every bad input: a clear error naming the message, nothing written, and the
// caller's transaction still usable for what comes next.
func TestWriteRejectsBadInput(t *testing.T) {
	t.Parallel()
	forKinds(t, testWriteRejectsBadInput)
}

func testWriteRejectsBadInput(t *testing.T, db *testdb.DB, k txKind) {
	ctx := context.Background()
	ok := outbox.Message{Topic: "ok", Key: []byte("k"), Value: []byte("v")}
	small, err := outbox.NewWriter(outbox.Config{MaxBytes: 300})
	require.NoError(t, err)

	cases := []struct {
		name   string
		writer *outbox.Writer
		msg    outbox.Message
		want   string
	}{
		{"empty topic", nil, outbox.Message{Key: []byte("k1")}, "empty topic"},
		{"dot", nil, outbox.Message{Topic: ".", Key: []byte("k1")}, `topic "." is not allowed`},
		{"dotdot", nil, outbox.Message{Topic: "..", Key: []byte("k1")}, `topic ".." is not allowed`},
		{"space", nil, outbox.Message{Topic: "pay ments", Key: []byte("k1")}, "character ' ' at byte 3"},
		{"slash", nil, outbox.Message{Topic: "a/b", Key: []byte("k1")}, "only [a-zA-Z0-9._-]"},
		{"unicode", nil, outbox.Message{Topic: "zahlungsströme", Key: []byte("k1")}, "only [a-zA-Z0-9._-]"},
		{"too long", nil, outbox.Message{Topic: strings.Repeat("a", 250), Key: []byte("k1")}, "250 characters long, Kafka allows at most 249"},
		{"value too large", nil, outbox.Message{Topic: "t", Key: []byte("k1"), Value: make([]byte, outbox.MaxBytesDefault)}, "exceeds the limit of 1048588 bytes"},
		{"headers too large", small, outbox.Message{Topic: "t", Key: []byte("k1"), Value: []byte("v"),
			Headers: []outbox.Header{{Key: "h", Value: make([]byte, 100)}}}, "record size 315 bytes (outbox.RecordSize: key, value, headers, pgbox's own headers and Kafka's record overhead) exceeds the limit of 300"},
		{"bad utf8 header key", nil, outbox.Message{Topic: "t", Key: []byte("k1"), Headers: []outbox.Header{{Key: "\xff"}}}, "not valid UTF-8"},
		{"event id header", nil, outbox.Message{Topic: "t", Key: []byte("k1"), Headers: []outbox.Header{{Key: "trace"}, {Key: "pgbox-event-id", Value: []byte("mine")}}},
			`header 1 is named "pgbox-event-id", which the relay sets on every record (it would replace yours): rename your header, or drop it when forwarding a consumed record (outbox.WithoutReserved)`},
		{"created-at header", nil, outbox.Message{Topic: "t", Key: []byte("k1"), Headers: []outbox.Header{{Key: outbox.CreatedAtHeader}}}, `header 0 is named "pgbox-created-at"`},
	}
	tx := begin(t, db, k)
	for _, tc := range cases {
		w := tc.writer
		if w == nil {
			w, err = outbox.NewWriter(outbox.Config{})
			require.NoError(t, err)
		}
		// The bad message second: the good one before it must not be written either.
		err := tx.write(ctx, w, ok, tc.msg)
		require.ErrorIs(t, err, outbox.ErrInvalidMessage, tc.name)
		require.ErrorContains(t, err, "message 1 (topic "+quote(tc.msg.Topic)+`, key "k1")`, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	// The transaction is still usable, and nothing from the bad calls is in it.
	require.NoError(t, tx.write(ctx, nil, ok))
	require.Equal(t, 1, tx.rows(t))
	require.NoError(t, tx.commit(ctx))

	require.ErrorIs(t, outbox.Write(ctx, nil, ok), outbox.ErrNilTx)
	var nilTx pgx.Tx
	require.ErrorIs(t, outbox.Write(ctx, nilTx, ok), outbox.ErrNilTx)
	require.ErrorIs(t, outbox.WriteSQL(ctx, nil, ok), outbox.ErrNilTx)

	_, err = outbox.NewWriter(outbox.Config{MaxBytes: -1})
	require.ErrorContains(t, err, "Config.MaxBytes is -1")
	_, err = outbox.NewWriter(outbox.Config{Channel: strings.Repeat("c", 64)})
	require.ErrorContains(t, err, "63-byte")
	_, err = outbox.NewWriter(outbox.Config{Channel: "  "})
	require.ErrorContains(t, err, "Config.Channel is blank")
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestValidateTopicAcceptsKafkaNames(t *testing.T) {
	t.Parallel()
	for _, topic := range []string{"a", "payments.v1", "A-b_C.9", strings.Repeat("x", 249), "...", ".a"} {
		require.NoError(t, outbox.ValidateTopic(topic), topic)
	}
}

// With Notify, a listener hears about the rows when the writer commits, once
// per transaction however many messages it wrote, but only while a live
// relay instance is sleeping: with every relay awake (or none, or only a dead
// one asleep) Write sends nothing, so writers do not serialize on NOTIFY.
func TestWriteNotifiesOnlyWhileARelaySleeps(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := testdb.New(t)
	channel := "pgbox_" + db.Schema
	w, err := outbox.NewWriter(outbox.Config{Notify: true, Channel: channel})
	require.NoError(t, err)

	listener, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer listener.Close(ctx)
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)
	write := func() {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		for range 3 { // the same keys each time: equal payloads fold into one notification
			require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "t", Key: []byte("a"), Value: []byte("v")}, outbox.Message{Topic: "t", Key: []byte("b")}))
		}
		require.NoError(t, tx.Commit(ctx))
	}
	silent := func(why string) {
		t.Helper()
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancelShort()
		_, err := listener.WaitForNotification(short)
		require.True(t, errors.Is(err, context.DeadlineExceeded) || pgconnTimeout(err), "%s: no notification, got %v", why, err)
	}
	exec := func(sql string) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}

	write()
	silent("no relay instance")
	exec(`INSERT INTO pgbox_relay_instances (instance, expires_at) VALUES ('awake', now() + interval '1 minute')`)
	exec(`INSERT INTO pgbox_relay_instances (instance, expires_at, sleeping) VALUES ('dead', now() - interval '1 second', true)`)
	write()
	silent("relays awake, the sleeping one dead")

	exec(`UPDATE pgbox_relay_instances SET sleeping = true WHERE instance = 'awake'`)
	write()
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, channel, n.Channel)
	// The payload names the writer's schema (a relay.Fleet wakes that
	// target only) and the slots written, sorted.
	var want string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT string_agg(slot::text, ',' ORDER BY slot) FROM (SELECT DISTINCT slot FROM pgbox_outbox) s`).Scan(&want))
	require.Equal(t, db.Schema+":"+want, n.Payload)
	silent("one notification per transaction")
	var rows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&rows))
	require.Equal(t, 3*3*2, rows, "every Write inserted, notified or not")
}

func pgconnTimeout(err error) bool { return err != nil && strings.Contains(err.Error(), "timeout") }

// A consumed record that a pgbox relay published carries the relay's headers;
// code forwarding it (a dead letter, a replay) drops them with
// WithoutReserved, and the new record gets its own.
func TestWithoutReservedDropsTheRelaysHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	consumed := []outbox.Header{{Key: "trace", Value: []byte("t")}, {Key: outbox.EventIDHeader, Value: []byte("old")},
		{Key: outbox.CreatedAtHeader, Value: []byte("then")}, {Key: "Pgbox-Event-Id", Value: []byte("not ours: other case")}}
	m := outbox.Message{Topic: "events.dlq", Key: []byte("k"), Headers: consumed}
	require.ErrorIs(t, outbox.Write(ctx, db.Pool, m), outbox.ErrInvalidMessage)

	m.Headers = outbox.WithoutReserved(consumed)
	require.Equal(t, []outbox.Header{consumed[0], consumed[3]}, m.Headers)
	require.Len(t, consumed, 4, "the input is not changed")
	require.NoError(t, outbox.Write(ctx, db.Pool, m))
	require.True(t, outbox.Reserved("pgbox-event-id"))
	require.False(t, outbox.Reserved("pgbox-replay-of"))
}
