package mesh

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// WithTracerProvider traces the client's deliveries with tp (OpenTelemetry;
// docs/protocol.md §8c): a span per Deliver (PRODUCER) or Request (CLIENT),
// one event per attempt, the W3C trace context in every leg's headers, and
// a span per late verdict. nil, the default, turns tracing off at no cost.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) error {
		o.tracer = meshtrace.Tracer(tp)
		return nil
	}
}

// startSend starts the sender's span of a delivery; ctx's span, if any, is
// its parent.
func (c *Client) startSend(ctx context.Context, d *Delivery, request bool) (context.Context, trace.Span) {
	kind, op := trace.SpanKindProducer, "deliver"
	if request {
		kind, op = trace.SpanKindClient, "request"
	}
	ctx, span := c.opts.tracer.Start(ctx, op+" "+d.To.Kind(), trace.WithSpanKind(kind))
	if span.IsRecording() { // a span sampled out costs no attributes
		span.SetAttributes(meshtrace.Message(meshtrace.OpSend, op, string(d.To), d.ID, string(d.Stream))...)
		if d.Type != "" {
			span.SetAttributes(meshtrace.KeyType.String(d.Type))
		}
	}
	return ctx, span
}

// endSend records a delivery's final outcome on its span and ends it.
func endSend(span trace.Span, r Receipt, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	extra := []attribute.KeyValue{meshtrace.MessageID(r.ID), meshtrace.KeyAttempts.Int(r.Attempts)}
	extra = append(extra, nodeAttrs(r.Node)...)
	meshtrace.End(span, err, extra...)
}

func nodeAttrs(n subjects.NodeID) []attribute.KeyValue {
	if n.IsZero() {
		return nil
	}
	return []attribute.KeyValue{meshtrace.KeyNode.String(n.String()), meshtrace.KeyGeneration.String(strconv.FormatUint(n.Generation, 10))}
}

// traceAttempt adds one attempt's event to the delivery's span in ctx.
func traceAttempt(ctx context.Context, attempt int, node subjects.NodeID, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := append([]attribute.KeyValue{meshtrace.KeyAttempt.Int(attempt)}, nodeAttrs(node)...)
	attrs = append(attrs, meshtrace.Verdict(err)...)
	span.AddEvent("attempt", trace.WithAttributes(attrs...))
}

func (c *Client) deliverTraced(ctx context.Context, d *Delivery) (Receipt, error) {
	ctx, span := c.startSend(ctx, d, false)
	r, err := c.deliver(ctx, d, nil)
	endSend(span, r, err)
	return r, err
}

func (c *Client) requestTraced(ctx context.Context, d *Delivery) (Response, error) {
	ctx, span := c.startSend(ctx, d, true)
	resp, err := c.requestCounted(ctx, d)
	if !resp.Node.IsZero() && span.IsRecording() {
		// Accepted: the response, or the late verdict that replaced it.
		kind := hub.AnswerResponse
		if err != nil {
			kind = "outcome"
		}
		attrs := append([]attribute.KeyValue{meshtrace.KeyAnswer.String(kind)}, meshtrace.Verdict(err)...)
		span.AddEvent(kind, trace.WithAttributes(attrs...))
	}
	endSend(span, resp.Receipt, err)
	return resp, err
}

// traceLate records a late verdict of a Deliver (whose span has ended) as a
// span of its own, a child of the hub span that sent it (the answer's
// trace context), in the delivery's trace.
func (c *Client) traceLate(m *nats.Msg, id string, err error) {
	ctx := meshtrace.Extract(context.Background(), m.Header)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	node, _ := subjects.ParseNodeID(m.Header.Get(verdict.HeaderNode))
	_, span := c.opts.tracer.Start(ctx, "late verdict", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(meshtrace.MessageID(id), meshtrace.KeyAnswer.String(hub.AnswerVerdict)))
	meshtrace.End(span, err, nodeAttrs(node)...)
}
