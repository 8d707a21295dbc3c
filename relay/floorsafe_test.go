package relay_test

// Issue 32's cases against a running relay (the public API, kfake): rows
// written every way the database allows, the sequence going back, a late
// row on a quiet slot. Each test writes, for every key, values "1", "2", ...
// in the order its rows commit, and checks that Kafka has every one of
// them, in that order per key. None runs in parallel: the floor's rule
// waits for every writing transaction of the cluster, so a parallel test's
// long transaction would hide the holes these tests look for.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// fsRecord is one record a collector read.
type fsRecord struct {
	key, value, eventID string
	at                  time.Time
}

// collector reads a topic from its start, for as long as the test runs.
type collector struct {
	mu   sync.Mutex
	recs []fsRecord
	seen map[string]bool
}

func collect(t *testing.T, b *testBundle, topic string) *collector {
	t.Helper()
	client, err := sarama.NewClient(b.addrs, kafkatest.Config())
	require.NoError(t, err)
	consumer, err := sarama.NewConsumerFromClient(client)
	require.NoError(t, err)
	parts, err := client.Partitions(topic)
	require.NoError(t, err)
	c := &collector{seen: map[string]bool{}}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		pcs = append(pcs, pc)
		wg.Go(func() {
			for m := range pc.Messages() {
				id, _ := header(m, relay.EventIDHeader)
				c.mu.Lock()
				if !c.seen[id] { // a duplicate (at least once) keeps its first place
					c.seen[id] = true
					c.recs = append(c.recs, fsRecord{key: string(m.Key), value: string(m.Value), eventID: id, at: time.Now()})
				}
				c.mu.Unlock()
			}
		})
	}
	t.Cleanup(func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		_ = consumer.Close()
		_ = client.Close()
	})
	return c
}

func (c *collector) records() []fsRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

// byKey is each key's values in the order they arrived.
func (c *collector) byKey() map[string][]string {
	out := map[string][]string{}
	for _, r := range c.records() {
		out[r.key] = append(out[r.key], r.value)
	}
	return out
}

// arrived is when the record with this key and value arrived (zero: not yet).
func (c *collector) arrived(key, value string) time.Time {
	for _, r := range c.records() {
		if r.key == key && r.value == value {
			return r.at
		}
	}
	return time.Time{}
}

// requireOrder waits up to within for every key of want to have its values
// (each key's values in commit order), then checks that each key's values
// arrived exactly in that order, none missing.
func (c *collector) requireOrder(t *testing.T, want map[string][]string, within time.Duration) {
	t.Helper()
	n := 0
	for _, v := range want {
		n += len(v)
	}
	deadline := time.Now().Add(within)
	for {
		got := c.byKey()
		have := 0
		for k := range want {
			have += len(got[k])
		}
		if have >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := c.byKey()
	var missing, reordered []string
	for k, w := range want {
		g := got[k]
		if len(g) < len(w) {
			missing = append(missing, fmt.Sprintf("%s: got %v, want %v", k, g, w))
		} else if !slices.Equal(g, w) {
			reordered = append(reordered, fmt.Sprintf("%s: got %v, want %v", k, g, w))
		}
	}
	slices.Sort(missing)
	slices.Sort(reordered)
	require.True(t, len(missing) == 0 && len(reordered) == 0,
		"%d of %d keys incomplete after %s, %d out of order:\n%s\n%s", len(missing), len(want), within, len(reordered),
		strings.Join(missing, "\n"), strings.Join(reordered, "\n"))
}

// fsSetup is a broker with topics "events" and "filler", and a relay with
// a short poll interval (the relay of a quiet system) running until the
// test ends.
func fsSetup(t *testing.T, tweak func(*relay.Config)) (*testBundle, *running) {
	t.Helper()
	b := setup(t, kfake.SeedTopics(3, "filler"))
	cfg := b.config("fs")
	if tweak != nil {
		tweak(&cfg)
	}
	return b, start(t, cfg)
}

// filler writes one row to a fresh key of topic "filler" every 5 ms until
// the test ends or stop is called: traffic on every slot, so the floors
// keep rising past whatever ids were taken meanwhile.
func filler(t *testing.T, b *testBundle) (stop func()) {
	t.Helper()
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx := context.Background()
		for i := 0; !done.Load(); i++ {
			_ = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				return outbox.Write(ctx, tx, msg("filler", fmt.Sprintf("f-%d", i), "x"))
			})
			time.Sleep(5 * time.Millisecond)
		}
	})
	stop = func() { done.Store(true); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

// warm writes rows over many keys and waits until the relay published them
// all and its floors have settled above them.
func warm(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	for i := range 20 {
		var msgs []outbox.Message
		for j := range 50 {
			msgs = append(msgs, msg("filler", fmt.Sprintf("w-%d-%d", i, j), "x"))
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
	}
	waitFor(t, "warm-up published", func() bool { return b.outboxCount(t, "true") == 0 })
	time.Sleep(time.Second) // several claims: the floors settle past the warm-up's ids
}

// fsSlotSQL installs fs_slot(key): internal/slot's fnv1a32(key) % 256 in
// SQL, what a writer in another language computes.
const fsSlotSQL = `CREATE FUNCTION fs_slot(k bytea) RETURNS smallint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE h bigint := 2166136261;
BEGIN
    FOR i IN 0 .. length(k) - 1 LOOP
        h := ((h # get_byte(k, i)) * 16777619) % 4294967296;
    END LOOP;
    RETURN (h % 256)::smallint;
END $$`

func installSlotFn(t *testing.T, b *testBundle) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), fsSlotSQL)
	require.NoError(t, err)
	var got int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT fs_slot('k-17'::bytea)`).Scan(&got))
	require.Equal(t, slot.Of([]byte("k-17"), [16]byte{}), got, "fs_slot is internal/slot's")
}

// fsKeys are the keys a foreign writer writes "1" to.
func fsKeys(n int, prefix string) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// foreign is issue 32 case 1's shape: while filler traffic keeps the
// floors rising, write (a foreign writer, not outbox.Write) commits value
// "1" for each of keys; after it commits, outbox.Write commits "2" for
// each. Every key must get 1 then 2.
func foreign(t *testing.T, keys []string, write func(ctx context.Context, b *testBundle)) {
	t.Helper()
	ctx := context.Background()
	b, _ := fsSetup(t, nil)
	installSlotFn(t, b)
	events := collect(t, b, "events")
	warm(t, b)
	stop := filler(t, b)
	write(ctx, b)
	want := map[string][]string{}
	for _, k := range keys {
		b.write(t, msg("events", k, "2"))
		want[k] = []string{"1", "2"}
	}
	time.Sleep(500 * time.Millisecond)
	stop()
	events.requireOrder(t, want, 20*time.Second)
}

// slowReader gives lines one at a time, pause apart: COPY ... FROM STDIN
// whose rows arrive over time (a client streaming a file).
type slowReader struct {
	lines []string
	pause time.Duration
	cur   string
}

func (s *slowReader) Read(p []byte) (int, error) {
	if s.cur == "" {
		if len(s.lines) == 0 {
			return 0, io.EOF
		}
		time.Sleep(s.pause)
		s.cur, s.lines = s.lines[0], s.lines[1:]
	}
	n := copy(p, s.cur)
	s.cur = s.cur[n:]
	return n, nil
}

// Case 1: COPY ... FROM STDIN, rows spread over time (text format).
func TestFloorSafeCopyTextSpreadOverTime(t *testing.T) {
	keys := fsKeys(12, "copytext")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		var lines []string
		for _, k := range keys {
			id := outbox.NewEventID()
			lines = append(lines, fmt.Sprintf("%s\t%d\tevents\t\\\\x%x\t\\\\x%x\n", uuidText(id), slot.Of([]byte(k), id), k, "1"))
		}
		conn, err := b.db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		tag, err := conn.Conn().PgConn().CopyFrom(ctx, &slowReader{lines: lines, pause: 200 * time.Millisecond},
			`COPY pgbox_outbox (event_id, slot, topic, key, value) FROM STDIN`)
		require.NoError(t, err)
		require.EqualValues(t, len(keys), tag.RowsAffected())
	})
}

// slowSource is a pgx.CopyFromSource giving one row per pause; each row is
// larger than pgx's 64 KiB send buffer, so the server reads the rows one by
// one as they come.
type slowSource struct {
	keys  []string
	i     int
	pause time.Duration
}

func (s *slowSource) Next() bool {
	if s.i >= len(s.keys) {
		return false
	}
	if s.i > 0 {
		time.Sleep(s.pause)
	}
	s.i++
	return true
}

func (s *slowSource) Values() ([]any, error) {
	k := s.keys[s.i-1]
	id := outbox.NewEventID()
	// The value "1", padded by a header to pass pgx's send buffer.
	return []any{id, int16(slot.Of([]byte(k), id)), "events", []byte(k), []byte("1"),
		fmt.Sprintf(`[{"k":"pad","v":"%s"}]`, strings.Repeat("QUFB", 17_000))}, nil
}

func (s *slowSource) Err() error { return nil }

// Case 1: pgx CopyFrom, rows spread over time.
func TestFloorSafePgxCopyFrom(t *testing.T) {
	keys := fsKeys(12, "pgxcopy")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			n, err := tx.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"event_id", "slot", "topic", "key", "value", "headers"},
				&slowSource{keys: keys, pause: 200 * time.Millisecond})
			if err == nil && n != int64(len(keys)) {
				err = fmt.Errorf("copied %d rows", n)
			}
			return err
		}))
	})
}

// Case 1: INSERT ... SELECT whose values are slow to compute (a payload
// built by a function, 100 ms a row).
func TestFloorSafeSlowInsertSelect(t *testing.T) {
	keys := fsKeys(30, "slowsel")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		_, err := b.db.Pool.Exec(ctx, `CREATE FUNCTION fs_payload(k text) RETURNS bytea LANGUAGE plpgsql VOLATILE AS $$
			BEGIN PERFORM pg_sleep(0.1); RETURN '1'::bytea; END $$`)
		require.NoError(t, err)
		_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			SELECT gen_random_uuid(), fs_slot(convert_to(k, 'UTF8')), 'events', convert_to(k, 'UTF8'), fs_payload(k)
			  FROM unnest($1::text[]) WITH ORDINALITY AS u(k, o) ORDER BY o`, keys)
		require.NoError(t, err)
	})
}

// Case 1: a plain INSERT from another language (raw SQL, one row per
// statement, the slot computed in SQL), on a table where a BEFORE ROW
// trigger of the user's (a validation lookup, 200 ms here) widens the
// microseconds between the row's id and its transaction id.
func TestFloorSafePlainInsertOtherLanguage(t *testing.T) {
	keys := fsKeys(10, "plain")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		_, err := b.db.Pool.Exec(ctx, `CREATE FUNCTION fs_validate() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN IF NEW.topic = 'events' THEN PERFORM pg_sleep(0.2); END IF; RETURN NEW; END $$;
			CREATE TRIGGER fs_validate BEFORE INSERT ON pgbox_outbox FOR EACH ROW EXECUTE FUNCTION fs_validate()`)
		require.NoError(t, err)
		for _, k := range keys {
			_, err := b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
				VALUES (gen_random_uuid(), fs_slot(convert_to($1, 'UTF8')), 'events', convert_to($1, 'UTF8'), '1')`, k)
			require.NoError(t, err)
		}
	})
}

// Case 1: an AFTER trigger on a business table writes the event when a
// business row changes (the business row's write gives the transaction
// its id first: this shape held before migration 00120 too).
func TestFloorSafeBusinessTrigger(t *testing.T) {
	keys := fsKeys(10, "order")
	foreign(t, keys, func(ctx context.Context, b *testBundle) {
		_, err := b.db.Pool.Exec(ctx, `CREATE TABLE fs_orders (id text PRIMARY KEY, status text NOT NULL);
			CREATE FUNCTION fs_order_event() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
			    INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
			    VALUES (gen_random_uuid(), fs_slot(convert_to(NEW.id, 'UTF8')), 'events', convert_to(NEW.id, 'UTF8'),
			            convert_to(NEW.status, 'UTF8'));
			    RETURN NULL;
			END $$;
			CREATE TRIGGER fs_order_event AFTER INSERT OR UPDATE ON fs_orders FOR EACH ROW EXECUTE FUNCTION fs_order_event()`)
		require.NoError(t, err)
		_, err = b.db.Pool.Exec(ctx, `INSERT INTO fs_orders SELECT k, '1' FROM unnest($1::text[]) AS k`, keys)
		require.NoError(t, err)
	})
}

func uuidText(id outbox.EventID) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16])
}

// keyCount is each key's values so far, in commit order.
type keyCount map[string][]string

// next is key k's next message on "events", its value the key's count.
func (w keyCount) next(k string) outbox.Message {
	w[k] = append(w[k], strconv.Itoa(len(w[k])+1))
	return msg("events", k, w[k][len(w[k])-1])
}

// firstWave writes 300 rows over 40 keys named prefix-N, waits until they
// are published and the relay's floors have settled above them (~300).
func firstWave(t *testing.T, b *testBundle, events *collector, want keyCount, prefix string) {
	t.Helper()
	for range 3 {
		var msgs []outbox.Message
		for i := range 100 {
			msgs = append(msgs, want.next(fmt.Sprintf("%s-%d", prefix, i%40)))
		}
		b.write(t, msgs...)
	}
	events.requireOrder(t, want, 30*time.Second)
	time.Sleep(time.Second) // quiet: claims settle the floors above the wave
}

// quietSequence is case 2's shape: the relay publishes a first wave and
// goes quiet; reset moves the sequence back; rows written afterwards (old
// keys and new ones, values continuing each key's count) are published
// promptly, in key order, by the same relay.
func quietSequence(t *testing.T, reset string) {
	ctx := context.Background()
	b, _ := fsSetup(t, nil)
	events := collect(t, b, "events")
	want := keyCount{}
	next := want.next
	firstWave(t, b, events, want, "old")
	_, err := b.db.Pool.Exec(ctx, reset)
	require.NoError(t, err)
	// 120 rows afterwards, one transaction each, old keys and new.
	for i := range 120 {
		k := fmt.Sprintf("old-%d", i%40)
		if i%2 == 1 {
			k = fmt.Sprintf("new-%d", i%30)
		}
		b.write(t, next(k))
	}
	events.requireOrder(t, want, 10*time.Second)
}

// Case 2: TRUNCATE pgbox_outbox RESTART IDENTITY under a running relay.
func TestFloorSafeTruncateRestartIdentity(t *testing.T) {
	quietSequence(t, `TRUNCATE pgbox_outbox RESTART IDENTITY`)
}

// Case 2: ALTER SEQUENCE ... RESTART.
func TestFloorSafeAlterSequenceRestart(t *testing.T) {
	quietSequence(t, `ALTER SEQUENCE pgbox_outbox_id_seq RESTART WITH 1`)
}

// Case 2: setval lower.
func TestFloorSafeSetvalLower(t *testing.T) {
	quietSequence(t, `SELECT setval('pgbox_outbox_id_seq', 5)`)
}

// Case 5: a row committed ~1 s after taking its id, on a slot nobody
// probes while other slots keep the relay busy, is published within
// PollInterval of its commit (bound: 3 s for a 200 ms PollInterval on a
// loaded machine; issue 32 measured it unpublished 8 s after commit).
func TestFloorSafeLateRowOnQuietSlot(t *testing.T) {
	ctx := context.Background()
	// Batches never fill up, so the relay's passes after the first probe
	// only the slots the last batch had rows in (plus stale ones).
	b, _ := fsSetup(t, func(c *relay.Config) { c.BatchSize = 2000 })
	events := collect(t, b, "events")
	// Busy keys all in a few slots; the late key in a slot none of them use.
	busySlots := map[int]bool{}
	var busy []string
	for i := 0; len(busy) < 8; i++ {
		k := fmt.Sprintf("busy-%d", i)
		if s := slot.Of([]byte(k), [16]byte{}); s%8 == 0 {
			busy, busySlots[s] = append(busy, k), true
		}
	}
	late := ""
	for i := 0; late == ""; i++ {
		k := fmt.Sprintf("late-%d", i)
		if s := slot.Of([]byte(k), [16]byte{}); s%8 == 3 {
			late = k
		}
	}
	warm(t, b)
	var done atomic.Bool
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := 0; !done.Load(); i++ {
				var msgs []outbox.Message
				for j := range 20 {
					msgs = append(msgs, msg("filler", busy[(i+j+w)%len(busy)], "x"))
				}
				_ = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) })
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	defer func() { done.Store(true); wg.Wait() }()
	time.Sleep(time.Second)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx, msg("events", late, "1")))
	time.Sleep(time.Second)
	require.NoError(t, tx.Commit(ctx))
	committed := time.Now()
	deadline := committed.Add(3 * time.Second)
	for events.arrived(late, "1").IsZero() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	at := events.arrived(late, "1")
	require.False(t, at.IsZero(), "the late row on a quiet slot was not published within 3 s of its commit, with other slots busy "+
		"(backlog %d)", b.outboxCount(t, "true"))
	t.Logf("published %s after its commit", at.Sub(committed).Round(time.Millisecond))
}
