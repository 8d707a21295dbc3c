package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// The seeded table sizes of BenchmarkPages; the target is every
// page within 100 ms at 1,000,000 backlog rows with 1,000 parked rows at
// their head and 10,000,000 inbox keys (seeding those takes minutes, so the
// defaults are small). CONSOLE_BENCH_DB names a migrated database (its
// search_path the schema) to seed once and keep: a run that finds its
// outbox seeded reads it as it is, so two builds (`relay status` too) are
// measured against one seed.
const (
	benchOutboxEnv = "CONSOLE_BENCH_OUTBOX"
	benchInboxEnv  = "CONSOLE_BENCH_INBOX"
	benchParkedEnv = "CONSOLE_BENCH_PARKED"
	benchDBEnv     = "CONSOLE_BENCH_DB"
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

// benchDB is the benchmark's database: CONSOLE_BENCH_DB's, or a fresh
// schema; seeded says CONSOLE_BENCH_DB's was seeded before.
func benchDB(b *testing.B) (pool *pgxpool.Pool, seeded bool) {
	u := os.Getenv(benchDBEnv)
	if u == "" {
		return testdb.New(b).Pool, false
	}
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pgbox_outbox)`).Scan(&seeded); err != nil {
		b.Fatalf("%s: %v (a database after `relay migrate up`)", benchDBEnv, err)
	}
	return pool, seeded
}

// benchSeed fills the outbox (parked rows first, so they are older than
// the backlog and at the head of every slot, then unpublished rows over
// three topics, all slots) and the inbox (two consumers, three topics, a
// day of keys), plus dead letters and one key with a story to tell.
func benchSeed(b *testing.B, pool *pgxpool.Pool, parkedRows, outboxRows, inboxKeys int) {
	ctx := context.Background()
	start := time.Now()
	for _, q := range []struct {
		sql string
		n   int
	}{
		{`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, created_at, parked_at)
			SELECT gen_random_uuid(), g % 256, 'topic-' || (g % 3), convert_to('p' || g, 'UTF8'), 'v', 5, 'MESSAGE_TOO_LARGE',
				now() - interval '2 hours', now() - interval '2 hours' + g * interval '1 millisecond'
			FROM generate_series(1, $1) g`, parkedRows},
		{`INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, created_at)
			SELECT gen_random_uuid(), g % 256, 'topic-' || (g % 3), convert_to('k' || g, 'UTF8'), 'v', now() - (g % 3600) * interval '1 second'
			FROM generate_series(1, $1) g`, outboxRows},
		{`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at)
			SELECT 'svc-' || (g % 2), 'key-' || g, 'topic-' || (g % 3), 0, g, now() - (g % 86400) * interval '1 second'
			FROM generate_series(1, $1) g`, inboxKeys},
		{`INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value)
			SELECT 'svc-0', 'topic-0', 0, g, 'd' || g, 3, 'poison', 'topic-0.dlq', true, convert_to('d' || g, 'UTF8'), 'v'
			FROM generate_series(1, $1) g`, 200},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.n); err != nil {
			b.Fatal(err)
		}
	}
	tx, err := pool.Begin(ctx)
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
	for _, q := range []string{
		`UPDATE pgbox_outbox SET parked_at = now(), last_error = 'boom'
			WHERE id = (SELECT max(id) FROM pgbox_outbox WHERE key = 'story-key')`,
		`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset") VALUES ('svc-0', 'story-key', 'topic-0', 0, 1)`,
		`INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value)
			VALUES ('svc-1', 'topic-0', 0, 9, 'story-key', 3, 'poison', 'topic-0.dlq', true, 'story-key', 'v')`,
		`VACUUM ANALYZE pgbox_outbox`, `VACUUM ANALYZE pgbox_inbox`, `VACUUM ANALYZE pgbox_consumer_dead`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d parked rows, %d outbox rows and %d inbox keys in %v", parkedRows, outboxRows, inboxKeys, time.Since(start).Round(time.Millisecond))
}

// benchStory reads the seeded story key's parked row: its id and event id.
func benchStory(b *testing.B, pool *pgxpool.Pool) (parkedID int64, eventID string) {
	err := pool.QueryRow(context.Background(), `SELECT id, event_id::text FROM pgbox_outbox
		WHERE key = 'story-key' AND parked_at IS NOT NULL ORDER BY id DESC LIMIT 1`).Scan(&parkedID, &eventID)
	if err != nil {
		b.Fatal(err)
	}
	return parkedID, eventID
}

// BenchmarkPages measures each console page's handler (authentication,
// every query, rendering) against seeded tables; page-ms is one page's
// time. The baseline is one primary-key probe of the outbox through the
// same pool: the cheapest round trip a page could make.
func BenchmarkPages(b *testing.B) {
	pool, seeded := benchDB(b)
	if !seeded {
		benchSeed(b, pool, benchSize(b, benchParkedEnv, 1000), benchSize(b, benchOutboxEnv, 100_000), benchSize(b, benchInboxEnv, 200_000))
	}
	parked, event := benchStory(b, pool)
	h, err := console.New(console.Config{DB: pool})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("baseline", func(b *testing.B) {
		ctx := context.Background()
		for b.Loop() {
			var one int
			_ = pool.QueryRow(ctx, `SELECT 1 FROM pgbox_outbox WHERE id = $1`, parked).Scan(&one)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "page-ms")
	})
	for _, p := range []struct{ name, path string }{
		{"overview", "/"},
		{"parked", "/parked"},
		{"parked-by-key", "/parked?key=story-key"},
		{"parked-row", "/parked/row?id=" + strconv.FormatInt(parked, 10)},
		{"parked-confirm", "/parked/confirm?action=retry&topic=topic-0"},
		{"dead", "/dead"},
		{"dead-by-key", "/dead?key=story-key"},
		{"dead-by-consumer-error", "/dead?consumer=svc-1&error=poison"},
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
