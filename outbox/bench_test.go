package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// BenchmarkWrite: 100 messages of 200 B per transaction. The baseline inserts
// the same rows with one INSERT statement per message in the same
// transaction; database_sql is WriteSQL in a database/sql transaction (pgx's
// stdlib driver).
func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	db := testdb.New(b)
	sdb := stdlib.OpenDBFromPool(db.Pool)
	b.Cleanup(func() { _ = sdb.Close() })
	msgs := make([]outbox.Message, 100)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "payments.v1", Key: fmt.Appendf(nil, "order-%d", i), Value: make([]byte, 200),
			Headers: []outbox.Header{{Key: "trace", Value: []byte("0123456789abcdef")}}}
	}
	b.Run("pgbox", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := outbox.Write(ctx, tx, msgs...); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(msgs))/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("database_sql", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := outbox.WriteSQL(ctx, tx, msgs...); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(msgs))/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("baseline", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, m := range msgs {
				id := outbox.NewEventID()
				if _, err := tx.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, headers)
					VALUES ($1, $2, $3, $4, $5, '[{"k":"trace","v":"MDEyMzQ1Njc4OWFiY2RlZg=="}]')`,
					id, outbox.SlotOf(m.Key, id), m.Topic, m.Key, m.Value); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(msgs))/time.Since(start).Seconds(), "msgs/s")
	})
}
