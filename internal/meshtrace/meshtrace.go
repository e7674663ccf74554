// Package meshtrace holds what the sender (package mesh) and the receiver
// (package hub) share for OpenTelemetry tracing: the W3C trace-context
// propagator over NATS headers, the instrumentation scope, and the span
// attributes (the OpenTelemetry messaging conventions plus mesh.*).
//
// Tracing is off unless a tracer provider is configured; callers check
// their tracer for nil before calling anything here, so a mesh without a
// provider pays nothing.
package meshtrace

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/internal/buildinfo"
	"github.com/natsmesh/natsmesh/verdict"
)

// ScopeName is the instrumentation scope of natsmesh's spans.
const ScopeName = "github.com/natsmesh/natsmesh"

// Tracer returns natsmesh's tracer from tp, or nil when tp is nil (tracing
// off).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(ScopeName, trace.WithInstrumentationVersion(buildinfo.Read().Version))
}

// propagator is W3C Trace Context: the traceparent and tracestate headers.
var propagator = propagation.TraceContext{}

// Header names of W3C Trace Context, as written.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Inject writes ctx's span context into h as traceparent (and tracestate).
// h does not escape (a delivery's header map stays where the caller put
// it, on the stack for the sender's legs).
func Inject(ctx context.Context, h nats.Header) {
	var p pair
	propagator.Inject(ctx, &p)
	if p.parent != "" {
		h[HeaderTraceparent] = []string{p.parent}
	}
	if p.state != "" {
		h[HeaderTracestate] = []string{p.state}
	}
}

// pair receives what the propagator writes.
type pair struct{ parent, state string }

func (p *pair) Get(string) string { return "" }
func (p *pair) Keys() []string    { return nil }
func (p *pair) Set(key, value string) {
	switch key {
	case HeaderTraceparent:
		p.parent = value
	case HeaderTracestate:
		p.state = value
	}
}

// Extract returns ctx with the remote span context of h's traceparent and
// tracestate, if valid.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return propagator.Extract(ctx, carrier(h))
}

// carrier adapts nats.Header (case-sensitive keys) to the propagator's
// Extract: it reads any case, so an outside client's "Traceparent"
// continues too.
type carrier nats.Header

func (c carrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

func (c carrier) Set(key, value string) { c[key] = []string{value} }

func (c carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// Attribute keys of the mesh (beside the messaging conventions').
const (
	KeyStream     = attribute.Key("mesh.stream")
	KeyNode       = attribute.Key("mesh.node")       // the node generation that accepted, or was tried
	KeyGeneration = attribute.Key("mesh.generation") // that node's generation number
	KeyVerdict    = attribute.Key("mesh.verdict")    // Accepted, Failed, ShuttingDown, Unavailable, Ignored
	KeyReason     = attribute.Key("mesh.reason")     // the verdict reason (wire name), if a failure
	KeyAttempt    = attribute.Key("mesh.attempt")    // 1-based attempt number
	KeyAttempts   = attribute.Key("mesh.attempts")   // attempts made
	KeyType       = attribute.Key("mesh.type")       // the delivery's type
	KeyAnswer     = attribute.Key("mesh.answer")     // "verdict" or "response"
	KeyIngress    = attribute.Key("mesh.ingress")    // true on the ingress node's span
)

// Message attributes of one delivery: messaging.system=nats, the
// destination (the address), the delivery ID, the operation.
func Message(op attribute.KeyValue, opName, to, id, stream string) []attribute.KeyValue {
	a := []attribute.KeyValue{
		semconv.MessagingSystemKey.String("nats"),
		op,
		semconv.MessagingOperationName(opName),
		semconv.MessagingDestinationName(to),
	}
	if id != "" {
		a = append(a, semconv.MessagingMessageID(id))
	}
	if stream != "" {
		a = append(a, KeyStream.String(stream))
	}
	return a
}

// Operation types.
var (
	OpSend    = semconv.MessagingOperationTypeSend
	OpReceive = semconv.MessagingOperationTypeReceive
	OpProcess = semconv.MessagingOperationTypeProcess
)

// MessageID is the messaging.message.id attribute.
func MessageID(id string) attribute.KeyValue { return semconv.MessagingMessageID(id) }

// Verdict returns the mesh.verdict and, for a failure, mesh.reason
// attributes of err.
func Verdict(err error) []attribute.KeyValue {
	if err == nil {
		return []attribute.KeyValue{KeyVerdict.String(verdict.Accepted.String())}
	}
	return []attribute.KeyValue{KeyVerdict.String(verdict.Classify(err).String()), KeyReason.String(reasonOf(err))}
}

func reasonOf(err error) string {
	if r := verdict.ReasonOf(err); r != verdict.ReasonUnknown {
		return r.String()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timeout"
	case errors.Is(err, nats.ErrNoResponders):
		return "no-responders"
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionClosed):
		return "disconnected"
	}
	return "error"
}

// End sets span's verdict attributes and status from err and ends it (a
// span sampled out is only ended).
func End(span trace.Span, err error, extra ...attribute.KeyValue) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(Verdict(err)...)
	span.SetAttributes(extra...)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
