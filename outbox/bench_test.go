package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbox/pgbox/internal/slot"
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
					id, slot.Of(m.Key, id), m.Topic, m.Key, m.Value); err != nil {
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

// BenchmarkWriteSQLInterleaved: WriteSQL in a database/sql transaction
// against Write in a pgx transaction as its baseline, the same 100 messages
// per transaction, alternating chunks of writeChunk transactions on one
// connection each so that a loaded machine slows both alike; rates over
// each side's median chunk, commit included.
func BenchmarkWriteSQLInterleaved(b *testing.B) {
	const writeChunk, chunks = 10, 30
	ctx := context.Background()
	db := testdb.New(b)
	msgs := make([]outbox.Message, 100)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "payments.v1", Key: fmt.Appendf(nil, "order-%d", i), Value: make([]byte, 200),
			Headers: []outbox.Header{{Key: "trace", Value: []byte("0123456789abcdef")}}}
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	sdb := stdlib.OpenDB(*conn.Conn().Config().Copy())
	sdb.SetMaxOpenConns(1)
	defer sdb.Close()
	viaPgx := func() error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if err := outbox.Write(ctx, tx, msgs...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	viaSQL := func() error {
		tx, err := sdb.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck
		if err := outbox.WriteSQL(ctx, tx, msgs...); err != nil {
			return err
		}
		return tx.Commit()
	}
	timed := func(f func() error) time.Duration {
		t0 := time.Now()
		for range writeChunk {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	timed(viaPgx) // warm both connections and statement caches
	timed(viaSQL)
	var pgxTimes, sqlTimes []time.Duration
	for b.Loop() {
		for range chunks {
			pgxTimes = append(pgxTimes, timed(viaPgx))
			sqlTimes = append(sqlTimes, timed(viaSQL))
		}
	}
	rate := func(ts []time.Duration) float64 {
		slices.Sort(ts)
		return float64(writeChunk*len(msgs)) / ts[len(ts)/2].Seconds()
	}
	s, p := rate(sqlTimes), rate(pgxTimes)
	b.ReportMetric(s, "pgbox-msgs/s")
	b.ReportMetric(p, "baseline-msgs/s")
	b.ReportMetric(s/p, "x-baseline")
}
