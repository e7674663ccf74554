package hub

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/internal/meshtrace"
)

// traceContexts are a traced delivery's span contexts: answer, the one its
// answers continue (its intake span, then its turn's); remote, the sender's
// delivery span (invalid if the sender sent no traceparent).
type traceContexts struct {
	answer, remote trace.SpanContext
}

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
	_, span := h.tracer.Start(ctx, "receive", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("messaging.system", "nats"), meshtrace.OpReceive, meshtrace.KeyNode.String(h.nodeID),
			meshtrace.KeyGeneration.String(strconv.FormatUint(h.cfg.Node.Generation, 10)))
	}
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
	if is.span.IsRecording() {
		is.span.SetName("receive " + e.To.Kind())
		is.span.SetAttributes(meshtrace.Message(meshtrace.OpReceive, "receive", string(e.To), e.ID, string(e.Stream))...)
		is.span.SetAttributes(meshtrace.KeyAttempt.Int(e.Attempt))
	}
	e.tr = &traceContexts{answer: is.span.SpanContext(), remote: is.remote}
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
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind)}
	ctx := h.ctx
	if d.tr == nil {
		d.tr = &traceContexts{} // its intake ran before tracing was known
	}
	if d.tr.remote.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: d.tr.remote}))
	}
	if d.tr.answer.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, d.tr.answer)
	}
	ctx, span := h.tracer.Start(ctx, "process "+d.To.Kind(), opts...)
	if span.IsRecording() {
		span.SetAttributes(meshtrace.Message(meshtrace.OpProcess, "process", string(d.To), d.ID, string(d.Stream))...)
		span.SetAttributes(meshtrace.KeyNode.String(h.nodeID), meshtrace.KeyAttempt.Int(d.Attempt))
	}
	d.tr.answer = span.SpanContext()
	return ctx, span
}

// startBatchTurn opens the span of a Batcher's turn over ds, linked to
// each delivery's intake span.
func (h *Host) startBatchTurn(ds []*Delivery) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(ds))
	for _, d := range ds {
		if d.tr != nil && d.tr.answer.IsValid() {
			links = append(links, trace.Link{SpanContext: d.tr.answer})
		}
	}
	ctx, span := h.tracer.Start(h.ctx, "process batch "+ds[0].To.Kind(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("messaging.system", "nats"), meshtrace.OpProcess, attribute.String("messaging.destination.name", string(ds[0].To)),
			attribute.Int("messaging.batch.message_count", len(ds)), meshtrace.KeyNode.String(h.nodeID)))
	for _, d := range ds {
		d.tr = &traceContexts{answer: span.SpanContext()}
	}
	return ctx, span
}

// injectTrace puts tr's answer span context into an answer's headers
// (nothing when tracing is off).
func injectTrace(hdr nats.Header, tr *traceContexts) {
	if tr != nil && tr.answer.IsValid() {
		meshtrace.Inject(trace.ContextWithSpanContext(context.Background(), tr.answer), hdr)
	}
}
