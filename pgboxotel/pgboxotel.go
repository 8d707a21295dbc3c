package pgboxotel

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// ScopeName is the instrumentation scope of the spans pgboxotel starts.
const ScopeName = "github.com/pgbox/pgbox/pgboxotel"

// The W3C trace-context header names, as propagation.TraceContext writes them.
const (
	TraceparentHeader = "traceparent"
	TracestateHeader  = "tracestate"
)

// Config configures a Tracer. TracerProvider is required.
type Config struct {
	// TracerProvider makes the tracer of the spans pgboxotel starts (the
	// consumer's process span, the relay's optional send span). Required:
	// pgboxotel never reaches for a global; pass otel.GetTracerProvider() to
	// use the global one deliberately.
	TracerProvider trace.TracerProvider

	// Propagator writes the trace context into outbox headers and reads it
	// back from consumed records; pass a composite one to carry baggage too.
	// The global propagator is not used: it is a no-op unless the program set
	// one. Defaults to propagation.TraceContext{}, the W3C traceparent and
	// tracestate headers, which other Kafka clients' instrumentation reads.
	Propagator propagation.TextMapPropagator

	// ConsumerGroup, when set, is recorded on process spans as
	// messaging.consumer.group.name. Defaults to "" (not recorded).
	ConsumerGroup string
}

// Tracer carries trace context across the outbox, the relay and the inbox.
// It holds no state of its own and is safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	group  string
}

// ErrNoTracerProvider is returned by New when Config.TracerProvider is nil.
var ErrNoTracerProvider = errors.New("pgboxotel: Config.TracerProvider is nil (pass your program's provider, e.g. an sdktrace.TracerProvider, or otel.GetTracerProvider() for the global one)")

// New returns a Tracer for cfg.
func New(cfg Config) (*Tracer, error) {
	if cfg.TracerProvider == nil {
		return nil, ErrNoTracerProvider
	}
	prop := cfg.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return &Tracer{tracer: cfg.TracerProvider.Tracer(ScopeName), prop: prop, group: cfg.ConsumerGroup}, nil
}

// Inject returns copies of msgs whose headers carry the trace context of ctx
// (traceparent and tracestate), replacing headers of those names; pass the
// result to outbox.Write. The caller's messages and header slices are not
// modified. When ctx carries no valid span the copies are unchanged.
//
// The headers count toward outbox.Config.MaxBytes like any other (about 55
// bytes for traceparent, plus tracestate when the trace has one). The relay
// publishes them unchanged, so the consumer's span (see Handler) becomes a
// child of the span that was current in ctx here.
func (t *Tracer) Inject(ctx context.Context, msgs ...outbox.Message) []outbox.Message {
	out := make([]outbox.Message, len(msgs))
	copy(out, msgs)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return out
	}
	for i := range out {
		t.prop.Inject(ctx, outboxCarrier{headers: &out[i].Headers})
	}
	return out
}

// Extract returns ctx carrying the remote span context found in m's headers,
// for handlers that start their own spans. Without trace headers, ctx is
// returned as it is.
func (t *Tracer) Extract(ctx context.Context, m inbox.Message) context.Context {
	return t.prop.Extract(ctx, inboxCarrier(m))
}

// Handler wraps h so that each run of it is a span of kind Consumer named
// "process <topic>", a child of the span that wrote the message (read from
// its headers by Extract), with the messaging attributes of OpenTelemetry's
// semantic conventions (topic, partition, offset, the pgbox event id as the
// message id). h gets the span's context, so anything it writes to the outbox
// with Inject continues the same trace. An error from h is recorded on the
// span and returned unchanged.
//
// Use the result wherever an inbox.HandlerFunc goes: Inbox.Process,
// ProcessBatch, or the sarama consumer-group adapter. A message the inbox
// skips as a duplicate does not run h, so it makes no span.
func (t *Tracer) Handler(h inbox.HandlerFunc) inbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		ctx, span := t.tracer.Start(t.Extract(ctx, m), "process "+m.Topic,
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(t.processAttrs(m)...))
		defer span.End()
		err := h(ctx, tx, m)
		if err != nil {
			recordError(span, err)
		}
		return err
	}
}

func (t *Tracer) processAttrs(m inbox.Message) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(m.Topic),
		semconv.MessagingDestinationPartitionID(strconv.FormatInt(int64(m.Partition), 10)),
		semconv.MessagingKafkaOffset(int(m.Offset)),
	}
	if id, ok := m.Header(outbox.EventIDHeader); ok {
		attrs = append(attrs, semconv.MessagingMessageID(string(id)))
	}
	if t.group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(t.group))
	}
	return attrs
}

// StartPublish makes Tracer an outbox.PublishHook (relay.Config.PublishHook):
// one span of kind Producer per batch the relay publishes, named
// "send <topic>" (or "send" when the batch spans topics), linked to the
// writer's span of every record that carries trace headers, ended when
// Kafka has answered, with the batch's size and the number published. The
// records' headers are not changed, so each consumer's span stays a child of
// its writer's span. A batch without any traced record gets no span: the
// relay must not start a trace of its own for every untraced batch.
func (t *Tracer) StartPublish(ctx context.Context, records []outbox.PublishRecord) (end func(published int, err error)) {
	var links []trace.Link
	seen := map[trace.SpanID]bool{}
	topic := ""
	for i := range records {
		hs := records[i].Headers
		sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), outboxCarrier{headers: &hs}))
		if sc.IsValid() && !seen[sc.SpanID()] {
			seen[sc.SpanID()] = true
			links = append(links, trace.Link{SpanContext: sc})
		}
		if i == 0 || records[i].Topic == topic {
			topic = records[i].Topic
		} else {
			topic = "*"
		}
	}
	if len(links) == 0 {
		return func(int, error) {}
	}
	name, attrs := "send", []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingBatchMessageCount(len(records)),
	}
	if topic != "*" {
		name += " " + topic
		attrs = append(attrs, semconv.MessagingDestinationName(topic))
	}
	_, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	return func(published int, err error) {
		span.SetAttributes(attribute.Int("pgbox.published_count", published))
		if err != nil {
			recordError(span, err)
		}
		span.End()
	}
}

var _ outbox.PublishHook = (*Tracer)(nil)

func recordError(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(semconv.ErrorType(err))
}
