// Package pgboxotel carries an OpenTelemetry trace across pgbox, so that one
// trace spans the business transaction that wrote an event, the relay that
// published it and the consumer that handled it:
//
//	charge card (writer's span)
//	├┄┄ send payments.v1     (relay, optional, a link: see "The relay" below)
//	└── process payments.v1  (consumer, pgboxotel.Handler)
//	    └── ... whatever the handler does, outbox events it writes included
//
// It is the only pgbox package that imports OpenTelemetry; a service that
// does not trace never links it. Nothing is registered globally: a Tracer
// uses the TracerProvider and propagator in its Config.
//
// # How the context travels
//
// The trace context rides in the event's own headers, in the W3C format
// (traceparent, tracestate) that other Kafka clients' instrumentation reads:
//
//  1. The writer calls Inject with the ctx of its span; the returned messages
//     carry the headers, and outbox.Write stores them in the row, inside the
//     business transaction. A rolled-back transaction leaves no row and no
//     trace of a publish.
//  2. The relay publishes a row's headers as Kafka record headers unchanged
//     (only pgbox's own pgbox-event-id and pgbox-created-at are added).
//  3. The consumer wraps its inbox.HandlerFunc with Handler. Each run of the
//     handler is a consumer span, a child of the writer's span, and the
//     handler's ctx carries it, so an event the handler writes with Inject
//     continues the same trace on the next hop.
//
// In code:
//
//	tr, err := pgboxotel.New(pgboxotel.Config{TracerProvider: tp}) // your provider; never a global by default
//
//	// writer, inside its span and transaction
//	err := outbox.Write(ctx, tx, tr.Inject(ctx, outbox.Message{Topic: "payments.v1", Key: key, Value: v})...)
//
//	// consumer: wherever an inbox.HandlerFunc goes
//	res, err := ib.Process(ctx, tx, msg, tr.Handler(handle))
//
// The span's ctx reaches the handler whether it runs through Inbox.Process,
// ProcessBatch or the sarama consumer-group adapter. A duplicate the inbox
// skips runs no handler and makes no span. Events written without a span in
// ctx carry no trace headers; their consumer spans are children of the span
// the consumer's ctx already has, if any, or start traces of their own.
//
// # The relay
//
// The relay imports no tracing library; it takes an optional hook,
// relay.Config.PublishHook, which a Tracer implements (StartPublish, over
// outbox.PublishHook's client-neutral types: pgboxotel does not import the
// relay, so it links no Kafka client, and a franz-go service that traces its
// consumer never links sarama):
//
//	r, err := relay.New(relay.Config{Pool: pool, Brokers: brokers, PublishHook: tr})
//
// Each batch the relay publishes is then one producer span ("send
// payments.v1"), linked to the writer's span of every traced record in it
// and ended when Kafka has answered, with the batch size and the number
// published. It is linked, not a parent: the records' headers are left
// alone, so each consumer's span stays its writer's child. A batch without
// a traced record gets no span. Without the hook the trace is writer ->
// consumer, which is what most dashboards need: the time between the two
// spans is the outbox latency.
//
// # Size
//
// The trace headers are part of the message and count toward outbox's size
// limit like any other header: traceparent is 11 + 55 bytes, tracestate as
// long as the trace's vendors make it.
package pgboxotel
