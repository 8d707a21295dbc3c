package pgboxotel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxotel"
)

// A payment service writes an event inside its traced transaction; a ledger
// service handles it. The relay and Kafka between them are left out here:
// the record the ledger receives is the committed row, headers unchanged, as
// the relay publishes it (TestOneTraceWriterToHandler runs the real relay,
// broker and consumer group).
func Example() {
	ctx := context.Background()
	db, drop := testdb.Example(ctx)
	defer drop()

	// The program's own tracer provider (here one that keeps spans in memory).
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(ctx) }()
	tr, err := pgboxotel.New(pgboxotel.Config{TracerProvider: tp, ConsumerGroup: "ledger-svc"})
	if err != nil {
		log.Fatal(err)
	}

	// Payment service: Inject puts the span's context into the event's headers.
	writeCtx, charge := tp.Tracer("payments-svc").Start(ctx, "charge card")
	err = pgx.BeginFunc(writeCtx, db.Pool, func(tx pgx.Tx) error {
		// ... business writes ...
		return outbox.Write(writeCtx, tx, tr.Inject(writeCtx,
			outbox.Message{Topic: "payments.v1", Key: []byte("order-1"), Value: []byte(`{"amount":100}`)})...)
	})
	if err != nil {
		log.Fatal(err)
	}
	charge.End()

	// The committed row, as the relay reads and publishes it.
	var stored []byte
	record := inbox.Message{Topic: "payments.v1", Partition: 0, Offset: 0}
	err = db.Pool.QueryRow(ctx, `SELECT key, value, headers FROM pgbox_outbox`).Scan(&record.Key, &record.Value, &stored)
	if err != nil {
		log.Fatal(err)
	}
	var headers []outbox.Header
	if err := json.Unmarshal(stored, &headers); err != nil {
		log.Fatal(err)
	}
	for _, h := range headers {
		fmt.Printf("header %s stored with the event\n", h.Key)
		record.Headers = append(record.Headers, h)
	}

	// Ledger service: Handler makes each run a span in the writer's trace.
	ib, err := inbox.New(inbox.Config{Consumer: "ledger-svc"})
	if err != nil {
		log.Fatal(err)
	}
	handle := tr.Handler(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		// ... ledger writes in tx; ctx carries the span ...
		fmt.Println("handler in the writer's trace:", trace.SpanContextFromContext(ctx).TraceID() == charge.SpanContext().TraceID())
		return nil
	})
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ib.Process(ctx, tx, record, handle)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	for _, s := range spans.Ended() {
		fmt.Printf("span %q, child of %q: %v\n", s.Name(), "charge card", s.Parent().SpanID() == charge.SpanContext().SpanID())
	}
	// Output:
	// header traceparent stored with the event
	// handler in the writer's trace: true
	// span "charge card", child of "charge card": false
	// span "process payments.v1", child of "charge card": true
}
