package pgboxotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/pgboxotel"
)

func mustTracer(t *testing.T, cfg pgboxotel.Config) *pgboxotel.Tracer {
	t.Helper()
	tr, err := pgboxotel.New(cfg)
	require.NoError(t, err)
	return tr
}

func TestNewNeedsTracerProvider(t *testing.T) {
	t.Parallel()
	_, err := pgboxotel.New(pgboxotel.Config{})
	require.ErrorIs(t, err, pgboxotel.ErrNoTracerProvider)
	require.ErrorContains(t, err, "Config.TracerProvider")
}

func header(hs []outbox.Header, key string) (string, int) {
	var v string
	n := 0
	for _, h := range hs {
		if h.Key == key {
			v, n = string(h.Value), n+1
		}
	}
	return v, n
}

func TestInject(t *testing.T) {
	t.Parallel()
	tp, _ := recorder(t)
	tr := mustTracer(t, pgboxotel.Config{TracerProvider: tp})

	// Spare capacity in the caller's header slice: Inject must not write
	// into it, nor change the caller's messages.
	hs := make([]outbox.Header, 2, 8)
	hs[0] = outbox.Header{Key: "traceparent", Value: []byte("00-stale")}
	hs[1] = outbox.Header{Key: "content-type", Value: []byte("json")}
	in := []outbox.Message{{Topic: "a", Headers: hs}, {Topic: "b"}}

	t.Run("no span", func(t *testing.T) {
		out := tr.Inject(context.Background(), in...)
		require.Equal(t, in, out)
	})

	ctx, span := tp.Tracer("test").Start(context.Background(), "write")
	defer span.End()
	ts, err := trace.ParseTraceState("vendor=x")
	require.NoError(t, err)
	ctx = trace.ContextWithSpanContext(ctx, span.SpanContext().WithTraceState(ts))
	out := tr.Inject(ctx, in...)
	require.Len(t, out, 2)
	want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
	for i, m := range out {
		v, n := header(m.Headers, pgboxotel.TraceparentHeader)
		require.Equal(t, 1, n, "message %d: one traceparent, the stale one replaced", i)
		require.Equal(t, want, v)
		v, _ = header(m.Headers, pgboxotel.TracestateHeader)
		require.Equal(t, "vendor=x", v)
	}
	ct, _ := header(out[0].Headers, "content-type")
	require.Equal(t, "json", ct, "other headers are kept")

	require.Len(t, in[0].Headers, 2)
	require.Equal(t, "00-stale", string(hs[0].Value))
	require.Equal(t, outbox.Header{}, hs[:3][2], "nothing written past the caller's length")
	require.Nil(t, in[1].Headers)
}

// A propagator of the caller's choice replaces the default W3C one.
func TestInjectCustomPropagator(t *testing.T) {
	t.Parallel()
	tp, _ := recorder(t)
	tr := mustTracer(t, pgboxotel.Config{TracerProvider: tp,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})})
	m, err := baggage.NewMember("tenant", "acme")
	require.NoError(t, err)
	b, err := baggage.New(m)
	require.NoError(t, err)
	ctx, span := tp.Tracer("test").Start(baggage.ContextWithBaggage(context.Background(), b), "write")
	defer span.End()
	out := tr.Inject(ctx, outbox.Message{Topic: "a"})
	v, _ := header(out[0].Headers, "baggage")
	require.Equal(t, "tenant=acme", v)

	got := tr.Extract(context.Background(), toInbox(out[0], 0))
	require.Equal(t, "acme", baggage.FromContext(got).Member("tenant").Value())
	require.Equal(t, span.SpanContext().TraceID(), trace.SpanContextFromContext(got).TraceID())
}

// toInbox is the record the relay publishes for m, as the consumer sees it.
func toInbox(m outbox.Message, offset int64) inbox.Message {
	return inbox.Message{Topic: m.Topic, Partition: 1, Offset: offset, Key: m.Key, Value: m.Value, Headers: m.Headers}
}

func TestHandler(t *testing.T) {
	t.Parallel()
	tp, rec := recorder(t)
	tr := mustTracer(t, pgboxotel.Config{TracerProvider: tp})
	ctx, writer := tp.Tracer("test").Start(context.Background(), "write")
	writer.End()
	msg := toInbox(tr.Inject(ctx, outbox.Message{Topic: "payments.v1"})[0], 42)

	boom := errors.New("ledger closed")
	var inHandler trace.SpanContext
	h := tr.Handler(func(ctx context.Context, _ pgx.Tx, m inbox.Message) error {
		inHandler = trace.SpanContextFromContext(ctx)
		return boom
	})
	err := h(context.Background(), nil, msg)
	require.ErrorIs(t, err, boom, "the handler's error is returned unchanged")

	s := findSpan(t, rec, inHandler.SpanID())
	require.Equal(t, writer.SpanContext().TraceID(), s.SpanContext().TraceID())
	require.Equal(t, writer.SpanContext().SpanID(), s.Parent().SpanID())
	require.Equal(t, codes.Error, s.Status().Code)
	require.Equal(t, "ledger closed", s.Status().Description)
	require.Len(t, s.Events(), 1, "the error is recorded as an exception event")
	a := attrMap(s)
	require.Equal(t, "42", a["messaging.kafka.offset"])
	require.Equal(t, "1", a["messaging.destination.partition.id"])
	require.Equal(t, "process", a["messaging.operation.type"])
	require.Equal(t, "kafka", a["messaging.system"])

	// Repeated traceparent headers: the last one wins, as for every header.
	ctx2, other := tp.Tracer("test").Start(context.Background(), "other")
	other.End()
	later := tr.Inject(ctx2, outbox.Message{Topic: "payments.v1"})[0].Headers[0]
	msg.Headers = append(msg.Headers, later)
	require.Equal(t, other.SpanContext().TraceID(), trace.SpanContextFromContext(tr.Extract(context.Background(), msg)).TraceID())
}

// One producer span per published batch, linked to each traced writer's
// span (once per writer), not a parent of anything; none for an untraced
// batch; the outcome recorded.
func TestStartPublish(t *testing.T) {
	t.Parallel()
	tp, rec := recorder(t)
	tr := mustTracer(t, pgboxotel.Config{TracerProvider: tp})
	var hook outbox.PublishHook = tr
	writer := func(name string) (outbox.Message, trace.SpanContext) {
		ctx, span := tp.Tracer("test").Start(context.Background(), name)
		span.End()
		return tr.Inject(ctx, outbox.Message{Topic: "payments.v1"})[0], span.SpanContext()
	}
	a, aSpan := writer("write a")
	b, bSpan := writer("write b")
	rec1 := func(m outbox.Message, id string) outbox.PublishRecord {
		return outbox.PublishRecord{Topic: m.Topic, EventID: id, Headers: m.Headers}
	}
	batch := []outbox.PublishRecord{rec1(a, "1"), rec1(b, "2"), rec1(a, "3"), {Topic: "payments.v1", EventID: "4"}}
	headersBefore := append([]outbox.Header(nil), batch[0].Headers...)
	hook.StartPublish(context.Background(), batch)(4, nil)
	require.Equal(t, headersBefore, batch[0].Headers, "the records' headers are not changed")
	hook.StartPublish(context.Background(), []outbox.PublishRecord{rec1(a, "5"), {Topic: "refunds.v1"}})(1, errors.New("1 of 2 records failed"))
	hook.StartPublish(context.Background(), []outbox.PublishRecord{{Topic: "payments.v1", EventID: "6"}})(1, nil) // untraced: no span

	var sends []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			sends = append(sends, s)
		}
	}
	require.Len(t, sends, 2, "one span per traced batch, none for the untraced one")
	first := sends[0]
	require.Equal(t, "send payments.v1", first.Name())
	require.False(t, first.Parent().IsValid(), "linked, not a child: the consumer stays the writer's child")
	var linked []trace.SpanContext
	for _, l := range first.Links() {
		linked = append(linked, l.SpanContext)
	}
	require.Len(t, linked, 2)
	require.Equal(t, aSpan.SpanID(), linked[0].SpanID())
	require.Equal(t, bSpan.SpanID(), linked[1].SpanID())
	attrs := attrMap(first)
	require.Equal(t, "4", attrs["messaging.batch.message_count"])
	require.Equal(t, "4", attrs["pgbox.published_count"])
	require.Equal(t, "payments.v1", attrs["messaging.destination.name"])
	require.Equal(t, "Unset", first.Status().Code.String())

	second := sends[1]
	require.Equal(t, "send", second.Name(), "a batch over several topics")
	require.Equal(t, "Error", second.Status().Code.String())
	require.NotContains(t, attrMap(second), "messaging.destination.name")
}
