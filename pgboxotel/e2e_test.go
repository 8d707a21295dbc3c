package pgboxotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxotel"
	"github.com/pgbox/pgbox/relay"
)

// recorder is an SDK tracer provider whose ended spans are kept in memory.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

// startRelay runs a real relay over db's outbox, publishing to addrs, until
// the test ends.
func startRelay(t *testing.T, db *testdb.DB, addrs []string, hook outbox.PublishHook) {
	t.Helper()
	kcfg := relay.NewKafkaConfig()
	kcfg.Version = kafkatest.Version
	kcfg.Metadata.Retry.Backoff = 50 * time.Millisecond
	kcfg.Producer.Retry.Backoff = 50 * time.Millisecond
	r, err := relay.New(relay.Config{Pool: db.Pool, Brokers: addrs, Kafka: kcfg, Lanes: 2, NoListen: true,
		PollInterval: 50 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second, PublishHook: hook})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

type handled struct {
	span trace.SpanContext
	m    inbox.Message
}

// TestOneTraceWriterToHandler follows one event through the real parts: a
// writer's span, outbox.Write in its transaction, a relay publishing to the
// broker, a consumer group with pgbox's inbox adapter, the handler. The
// handler's ctx is in the writer's trace and its process span is a child of
// the writer's span. An event written without a trace starts no trace: its
// handler's span is a root.
func TestOneTraceWriterToHandler(t *testing.T) {
	t.Parallel()
	const topic, group = "payments.v1", "ledger-svc"
	tp, rec := recorder(t)
	tr := mustTracer(t, pgboxotel.Config{TracerProvider: tp, ConsumerGroup: group})
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, topic))
	addrs := c.ListenAddrs()

	// The writer: a business transaction inside its own span.
	ctx, writer := tp.Tracer("payments-svc").Start(context.Background(), "charge card")
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, tr.Inject(ctx, outbox.Message{Topic: topic, Key: []byte("order-1"), Value: []byte("charged"),
			Headers: []outbox.Header{{Key: "content-type", Value: []byte("text/plain")}}})...)
	})
	require.NoError(t, err)
	writer.End()
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(context.Background(), tx, outbox.Message{Topic: topic, Key: []byte("order-2"), Value: []byte("untraced")})
	}))

	startRelay(t, db, addrs, tr)
	got := make(chan handled, 4)
	stop := consume(t, db.Pool, addrs, group, []string{topic}, tr.Handler(func(ctx context.Context, _ pgx.Tx, m inbox.Message) error {
		got <- handled{span: trace.SpanContextFromContext(ctx), m: m}
		return nil
	}))
	byValue := map[string]handled{}
	for len(byValue) < 2 {
		select {
		case h := <-got:
			byValue[string(h.m.Value)] = h
		case <-time.After(60 * time.Second):
			t.Fatalf("handled only %d of 2 events", len(byValue))
		}
	}
	stop()

	// The relay published the row's headers unchanged, the trace's included.
	traced := byValue["charged"]
	tp1, ok := traced.m.Header(pgboxotel.TraceparentHeader)
	require.True(t, ok, "the record has no traceparent header: %v", traced.m.Headers)
	require.Equal(t, fmt.Sprintf("00-%s-%s-01", writer.SpanContext().TraceID(), writer.SpanContext().SpanID()), string(tp1))
	ct, _ := traced.m.Header("content-type")
	require.Equal(t, "text/plain", string(ct))

	// One trace: the handler's ctx is in the writer's trace, and its span's
	// parent is the writer's span.
	require.Equal(t, writer.SpanContext().TraceID(), traced.span.TraceID())
	process := findSpan(t, rec, traced.span.SpanID())
	require.Equal(t, "process "+topic, process.Name())
	require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	require.Equal(t, writer.SpanContext().SpanID(), process.Parent().SpanID())
	require.True(t, process.Parent().IsRemote())
	attrs := attrMap(process)
	require.Equal(t, topic, attrs["messaging.destination.name"])
	require.Equal(t, group, attrs["messaging.consumer.group.name"])
	eventID, _ := traced.m.Header(relay.EventIDHeader)
	require.Equal(t, string(eventID), attrs["messaging.message.id"])
	require.Equal(t, fmt.Sprint(traced.m.Offset), attrs["messaging.kafka.offset"])

	// The relay's publish: a producer span linked to the writer's span. A
	// batch held back unsent (its lease may have lapsed on a loaded
	// machine: published_count 0) is claimed and sent again, with a span
	// of its own; one span published the batch.
	var send sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer && attrMap(s)["pgbox.published_count"] != "0" {
			require.Nil(t, send, "one batch published, one publish span")
			send = s
		}
	}
	require.NotNil(t, send, "the relay's publish span (relay.Config.PublishHook)")
	require.Equal(t, "send "+topic, send.Name())
	require.Len(t, send.Links(), 1)
	require.Equal(t, writer.SpanContext().SpanID(), send.Links()[0].SpanContext.SpanID())

	// The untraced event: a handler span of its own trace, no parent.
	untraced := byValue["untraced"]
	_, ok = untraced.m.Header(pgboxotel.TraceparentHeader)
	require.False(t, ok)
	require.NotEqual(t, writer.SpanContext().TraceID(), untraced.span.TraceID())
	require.False(t, findSpan(t, rec, untraced.span.SpanID()).Parent().IsValid())
}

func findSpan(t *testing.T, rec *tracetest.SpanRecorder, id trace.SpanID) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range rec.Ended() {
		if s.SpanContext().SpanID() == id {
			return s
		}
	}
	t.Fatalf("no ended span %s", id)
	return nil
}

func attrMap(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, a := range s.Attributes() {
		m[string(a.Key)] = a.Value.String()
	}
	return m
}
