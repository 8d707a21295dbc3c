package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// The seeded table sizes of BenchmarkPages; the target is every
// page within 100 ms at 5,000,000 outbox rows and 10,000,000 inbox keys
// (seeding those takes minutes, so the defaults are small).
const (
	benchOutboxEnv = "CONSOLE_BENCH_OUTBOX"
	benchInboxEnv  = "CONSOLE_BENCH_INBOX"
)

func benchSize(b *testing.B, env string, def int) int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want a row count", env, v)
	}
	return n
}

// benchSeed fills the outbox (unpublished rows over three topics, all
// slots) and the inbox (two consumers, three topics, a day of keys), plus
// parked rows, dead letters and one key with a story to tell.
func benchSeed(b *testing.B, db *testdb.DB, outboxRows, inboxKeys int) (parkedID int64, eventID string) {
	ctx := context.Background()
	start := time.Now()
	for _, q := range []struct {
		sql string
		n   int
	}{
		{`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, created_at)
			SELECT gen_random_uuid(), g % 256, 'topic-' || (g % 3), convert_to('k' || g, 'UTF8'), 'v', now() - (g % 3600) * interval '1 second'
			FROM generate_series(1, $1) g`, outboxRows},
		{`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at)
			SELECT 'svc-' || (g % 2), 'key-' || g, 'topic-' || (g % 3), 0, g, now() - (g % 86400) * interval '1 second'
			FROM generate_series(1, $1) g`, inboxKeys},
		{`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
			SELECT gen_random_uuid(), g % 256, 'topic-' || (g % 3), convert_to('p' || g, 'UTF8'), 'v', 5, 'MESSAGE_TOO_LARGE', now()
			FROM generate_series(1, $1) g`, 200},
		{`INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value)
			SELECT 'svc-0', 'topic-0', 0, g, 'd' || g, 3, 'poison', 'topic-0.dlq', true, convert_to('d' || g, 'UTF8'), 'v'
			FROM generate_series(1, $1) g`, 200},
	} {
		if _, err := db.Pool.Exec(ctx, q.sql, q.n); err != nil {
			b.Fatal(err)
		}
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for range 3 {
		if err := outbox.Write(ctx, tx, outbox.Message{Topic: "topic-0", Key: []byte("story-key"), Value: []byte(`{"a": 1}`)}); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	err = db.Pool.QueryRow(ctx, `UPDATE pgbox_outbox SET parked_at = now(), last_error = 'boom'
		WHERE id = (SELECT max(id) FROM pgbox_outbox WHERE key = 'story-key') RETURNING id, event_id::text`).Scan(&parkedID, &eventID)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset") VALUES ('svc-0', 'story-key', 'topic-0', 0, 1)`,
		`INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value)
			VALUES ('svc-1', 'topic-0', 0, 9, 'story-key', 3, 'poison', 'topic-0.dlq', true, 'story-key', 'v')`,
		`VACUUM ANALYZE pgbox_outbox`, `VACUUM ANALYZE pgbox_inbox`, `VACUUM ANALYZE pgbox_consumer_dead`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d outbox rows and %d inbox keys in %v", outboxRows, inboxKeys, time.Since(start).Round(time.Millisecond))
	return parkedID, eventID
}

// BenchmarkPages measures each console page's handler (authentication,
// every query, rendering) against seeded tables; page-ms is one page's
// time. The baseline is one primary-key probe of the outbox through the
// same pool: the cheapest round trip a page could make.
func BenchmarkPages(b *testing.B) {
	db := testdb.New(b)
	parked, event := benchSeed(b, db, benchSize(b, benchOutboxEnv, 100_000), benchSize(b, benchInboxEnv, 200_000))
	h, err := console.New(console.Config{DB: db.Pool})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("baseline", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			var one int
			_ = db.Pool.QueryRow(ctx, `SELECT 1 FROM pgbox_outbox WHERE id = $1`, parked).Scan(&one)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "page-ms")
	})
	for _, p := range []struct{ name, path string }{
		{"overview", "/"},
		{"parked", "/parked"},
		{"parked-by-key", "/parked?key=story-key"},
		{"parked-row", "/parked/row?id=" + strconv.FormatInt(parked, 10)},
		{"dead", "/dead"},
		{"dead-by-key", "/dead?key=story-key"},
		{"story-by-key", "/story?topic=topic-0&key=story-key"},
		{"story-by-event", "/story?event=" + event},
		{"cleanup", "/cleanup"},
		{"audit", "/audit"},
	} {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", p.path, nil))
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", p.path, rec.Code, rec.Body.String())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "page-ms")
		})
	}
}
