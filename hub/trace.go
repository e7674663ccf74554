package hub

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/internal/meshtrace"
)

// intakeSpan is a delivery's intake span until its synchronous reply.
type intakeSpan struct {
	span   trace.Span
	remote trace.SpanContext // the sender's delivery span (traceparent), if any
}

// startIntake opens the intake span of delivery message m (its acceptance
// or refusal, up to the reply), a child of the sender's span in m's
// traceparent. Only with a tracer.
func (h *Host) startIntake(m *nats.Msg) {
	ctx := meshtrace.Extract(context.Background(), m.Header)
	_, span := h.tracer.Start(ctx, "receive", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"), meshtrace.OpReceive, meshtrace.KeyNode.String(h.nodeID),
			meshtrace.KeyGeneration.String(strconv.FormatUint(h.cfg.Node.Generation, 10))))
	h.intakes.Store(m, &intakeSpan{span: span, remote: trace.SpanContextFromContext(ctx)})
}

// tagIntake names m's intake span after its parsed delivery e and gives e
// the span contexts its turn and answers continue from.
func (h *Host) tagIntake(m *nats.Msg, e *entry) {
	v, ok := h.intakes.Load(m)
	if !ok {
		return
	}
	is := v.(*intakeSpan)
	is.span.SetName("receive " + e.To.Kind())
	is.span.SetAttributes(meshtrace.Message(meshtrace.OpReceive, "receive", string(e.To), e.ID, string(e.Stream))...)
	is.span.SetAttributes(meshtrace.KeyAttempt.Int(e.Attempt))
	e.trace, e.remote = is.span.SpanContext(), is.remote
}

// endIntake ends m's intake span with the verdict of its reply.
func (h *Host) endIntake(m *nats.Msg, err error) {
	if v, ok := h.intakes.LoadAndDelete(m); ok {
		meshtrace.End(v.(*intakeSpan).span, err)
	}
}

// startTurn opens the span of d's handler turn: a child of its intake span,
// linked to the sender's delivery span; CONSUMER for a delivery, SERVER for
// a request. The handler's ctx carries it, and d's answers carry its
// context.
func (h *Host) startTurn(d *Delivery) (context.Context, trace.Span) {
	kind := trace.SpanKindConsumer
	if d.expectResponse {
		kind = trace.SpanKindServer
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind),
		trace.WithAttributes(meshtrace.Message(meshtrace.OpProcess, "process", string(d.To), d.ID, string(d.Stream))...),
		trace.WithAttributes(meshtrace.KeyNode.String(h.nodeID), meshtrace.KeyAttempt.Int(d.Attempt))}
	if d.remote.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: d.remote}))
	}
	ctx := h.ctx
	if d.trace.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, d.trace)
	}
	ctx, span := h.tracer.Start(ctx, "process "+d.To.Kind(), opts...)
	d.trace = span.SpanContext()
	return ctx, span
}

// startBatchTurn opens the span of a Batcher's turn over ds, linked to
// each delivery's intake span.
func (h *Host) startBatchTurn(ds []*Delivery) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(ds))
	for _, d := range ds {
		if d.trace.IsValid() {
			links = append(links, trace.Link{SpanContext: d.trace})
		}
	}
	ctx, span := h.tracer.Start(h.ctx, "process batch "+ds[0].To.Kind(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("messaging.system", "nats"), meshtrace.OpProcess, attribute.String("messaging.destination.name", string(ds[0].To)),
			attribute.Int("messaging.batch.message_count", len(ds)), meshtrace.KeyNode.String(h.nodeID)))
	for _, d := range ds {
		d.trace = span.SpanContext()
	}
	return ctx, span
}

// injectTrace puts sc into an answer's headers (no-op for an invalid sc:
// tracing off, or a sender without trace context).
func injectTrace(hdr nats.Header, sc trace.SpanContext) {
	if sc.IsValid() {
		meshtrace.Inject(trace.ContextWithSpanContext(context.Background(), sc), hdr)
	}
}
