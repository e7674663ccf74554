package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// traced is an in-memory span recorder behind a tracer provider.
type traced struct {
	sr *tracetest.SpanRecorder
	tp *sdktrace.TracerProvider
}

func newTraced(t *testing.T) *traced {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &traced{sr: sr, tp: tp}
}

// trace returns the ended spans of trace id.
func (tr *traced) trace(id trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.sr.Ended() {
		if s.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// waitSpans polls until trace id holds n ended spans.
func (tr *traced) waitSpans(t *testing.T, id trace.TraceID, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	natstest.Eventually(t, 10*time.Second, func() bool { return len(tr.trace(id)) >= n }, "%d spans of trace %s", n, id)
	return tr.trace(id)
}

// one returns the single span named name among spans.
func one(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			if found != nil {
				t.Fatalf("two spans %q in %s", name, names(spans))
			}
			found = s
		}
	}
	if found == nil {
		t.Fatalf("no span %q in %s", name, names(spans))
	}
	return found
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// wantAttrs checks that span s has every attribute of want.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	got := attrs(s.Attributes())
	for k, v := range want {
		if got[k] != v {
			t.Errorf("span %q: %s = %q, want %q (all: %v)", s.Name(), k, got[k], v, got)
		}
	}
}

func wantChild(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span %q: parent %s, want %q (%s)", child.Name(), child.Parent().SpanID(), parent.Name(), parent.SpanContext().SpanID())
	}
}

// tracedNode is a standalone node traced by tp, hosting "rec" (whose
// handler records the span context it is given) and "broken" (whose
// factory fails).
func tracedNode(t *testing.T, s *server.Server, name string, tp trace.TracerProvider, opts ...Option) (*Node, *turnContexts) {
	t.Helper()
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: name, TracerProvider: tp}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	tc := &turnContexts{byID: map[string]trace.SpanContext{}, gates: map[subjects.Address]chan struct{}{}}
	if err := n.Register("rec", func(context.Context, subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			tc.mu.Lock()
			tc.byID[d.ID] = trace.SpanContextFromContext(ctx)
			tc.mu.Unlock()
			return d.Respond(append([]byte("re:"), d.Payload...))
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.Register("broken", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		select {
		case <-tc.gate(addr):
		case <-ctx.Done():
		}
		return nil, errors.New("no such thing")
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, tc
}

type turnContexts struct {
	mu    sync.Mutex
	byID  map[string]trace.SpanContext
	gates map[subjects.Address]chan struct{} // a "broken" build waits for its address's
}

func (tc *turnContexts) gate(addr subjects.Address) chan struct{} {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	g := tc.gates[addr]
	if g == nil {
		g = make(chan struct{})
		tc.gates[addr] = g
	}
	return g
}

func (tc *turnContexts) of(id string) trace.SpanContext {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.byID[id]
}

// TestTraceRequestAndDeliver: under the caller's span, a Request is a
// CLIENT span and a Deliver a PRODUCER span, each with its attempt event;
// the intake's CONSUMER span is their child; the turn (SERVER for a
// request, CONSUMER for a delivery) is the intake's child, linked to the
// sender's span, and its context is in the handler's ctx; the attributes
// follow the messaging conventions. Across many deliveries on two streams.
func TestTraceRequestAndDeliver(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	tr := newTraced(t)
	n, tc := tracedNode(t, s, "tn", tr.tp)
	app := tr.tp.Tracer("app")
	for i := range 20 {
		request := i%2 == 0
		stream := subjects.Stream(fmt.Sprintf("s%d", i%3))
		ctx, root := app.Start(context.Background(), "caller")
		id := fmt.Sprintf("tr-%d", i)
		d := Delivery{ID: id, To: "rec/a", Stream: stream, Type: "t", Payload: []byte("x")}
		if request {
			if resp, err := n.Client.Request(ctx, d); err != nil || string(resp.Payload) != "re:x" {
				t.Fatalf("request %d: %q %v", i, resp.Payload, err)
			}
		} else if _, err := n.Client.Deliver(ctx, d); err != nil {
			t.Fatalf("deliver %d: %v", i, err)
		}
		root.End()
		tid := root.SpanContext().TraceID()
		spans := tr.waitSpans(t, tid, 4)
		sendName, sendKind, turnKind := "deliver rec", trace.SpanKindProducer, trace.SpanKindConsumer
		if request {
			sendName, sendKind, turnKind = "request rec", trace.SpanKindClient, trace.SpanKindServer
		}
		caller, send, intake, turn := one(t, spans, "caller"), one(t, spans, sendName), one(t, spans, "receive rec"), one(t, spans, "process rec")
		wantChild(t, send, caller)
		wantChild(t, intake, send)
		wantChild(t, turn, intake)
		if send.SpanKind() != sendKind || intake.SpanKind() != trace.SpanKindConsumer || turn.SpanKind() != turnKind {
			t.Errorf("kinds: send %v intake %v turn %v", send.SpanKind(), intake.SpanKind(), turn.SpanKind())
		}
		if l := turn.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
			t.Errorf("turn links %v, want the sender's span", l)
		}
		if got := tc.of(id); got.SpanID() != turn.SpanContext().SpanID() {
			t.Errorf("handler ctx span %s, want the turn's %s", got.SpanID(), turn.SpanContext().SpanID())
		}
		msg := map[string]string{"messaging.system": "nats", "messaging.destination.name": "rec/a", "messaging.message.id": id, "mesh.stream": string(stream)}
		wantAttrs(t, send, msg)
		wantAttrs(t, intake, msg)
		wantAttrs(t, turn, msg)
		wantAttrs(t, send, map[string]string{"messaging.operation.type": "send", "mesh.verdict": "Accepted", "mesh.node": n.ID().String(), "mesh.attempts": "1", "mesh.type": "t"})
		wantAttrs(t, intake, map[string]string{"messaging.operation.type": "receive", "mesh.verdict": "Accepted", "mesh.attempt": "1", "mesh.node": n.ID().String()})
		wantAttrs(t, turn, map[string]string{"messaging.operation.type": "process", "mesh.verdict": "Accepted"})
		ev := send.Events()
		if len(ev) == 0 || ev[0].Name != "attempt" {
			t.Fatalf("send events %v", ev)
		}
		if a := attrs(ev[0].Attributes); a["mesh.attempt"] != "1" || a["mesh.verdict"] != "Accepted" || a["mesh.node"] != n.ID().String() {
			t.Errorf("attempt event %v", a)
		}
		if request && (len(ev) != 2 || ev[1].Name != "response") {
			t.Errorf("request events %v, want attempt then response", ev)
		}
	}
}

// TestTraceRetries: a delivery refused by its first attempts (no responder
// at a departed owner's subject) and then accepted is one sender span with
// an event per attempt, in order, with the trace context kept across the
// attempts: the intake of the accepted attempt is its child and says its
// attempt number.
func TestTraceRetries(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	tr := newTraced(t)
	n, _ := tracedNode(t, s, "tr", tr.tp)
	for fails := 1; fails <= 3; fails++ {
		res := &countingResolver{fn: func(call int, _ subjects.Address) subjects.NodeID {
			if call <= fails {
				return ghost
			}
			return n.ID()
		}}
		c := newClient(t, natstest.Connect(t, s), res, WithTracerProvider(tr.tp), WithClock(newFakeClock()))
		ctx, root := tr.tp.Tracer("app").Start(context.Background(), "caller")
		r, err := c.Deliver(ctx, Delivery{To: "rec/r", Payload: []byte("x")})
		root.End()
		if err != nil || r.Attempts != fails+1 {
			t.Fatalf("deliver: %+v %v", r, err)
		}
		spans := tr.waitSpans(t, root.SpanContext().TraceID(), 4)
		send, intake := one(t, spans, "deliver rec"), one(t, spans, "receive rec")
		wantChild(t, intake, send)
		wantAttrs(t, intake, map[string]string{"mesh.attempt": fmt.Sprint(fails + 1), "messaging.message.id": r.ID})
		wantAttrs(t, send, map[string]string{"mesh.attempts": fmt.Sprint(fails + 1), "mesh.verdict": "Accepted"})
		ev := send.Events()
		if len(ev) != fails+1 {
			t.Fatalf("%d attempt events, want %d: %v", len(ev), fails+1, ev)
		}
		for i, e := range ev {
			a := attrs(e.Attributes)
			if e.Name != "attempt" || a["mesh.attempt"] != fmt.Sprint(i+1) {
				t.Errorf("event %d: %s %v", i, e.Name, a)
			}
			if i < fails && (a["mesh.verdict"] != "ShuttingDown" && a["mesh.verdict"] != "Failed" || a["mesh.reason"] != "no-responders" || a["mesh.node"] != ghost.String()) {
				t.Errorf("refused attempt %d: %v", i+1, a)
			}
			if i == fails && (a["mesh.verdict"] != "Accepted" || a["mesh.node"] != n.ID().String()) {
				t.Errorf("accepted attempt: %v", a)
			}
		}
	}
}

// TestTraceIngress: an outside client's traceparent continues through the
// ingress (in any header case): the ingress span is its child, the
// forwarded delivery the ingress span's, then intake and turn; the
// client's answer says the verdict. A client without traceparent starts a
// trace at the ingress.
func TestTraceIngress(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	tr := newTraced(t)
	tracedNode(t, s, "ti", tr.tp)
	raw := natstest.Connect(t, s)
	for i, key := range []string{"traceparent", "Traceparent", "TRACEPARENT"} {
		tid := trace.TraceID{0x4b, 0xf9, byte(i + 1)}
		sid := trace.SpanID{0x00, 0xf0, byte(i + 1)}
		for _, request := range []bool{true, false} {
			m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("rec/in", ""), Header: nats.Header{}, Data: []byte("hi")}
			m.Header[key] = []string{fmt.Sprintf("00-%s-%s-01", tid, sid)}
			m.Header["tracestate"] = []string{"vendor=x"}
			name := "deliver rec"
			if request {
				m.Header.Set(hub.HeaderExpectResponse, "true")
				name = "request rec"
			}
			r, err := raw.RequestMsg(m, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, verr := verdict.Decode(r.Header); verr != nil {
				t.Fatal(verr)
			}
			spans := tr.waitSpans(t, tid, map[bool]int{true: 4, false: 4}[request])
			ing := one(t, spans, "ingress "+name)
			if ing.Parent().SpanID() != sid || !ing.Parent().IsRemote() {
				t.Errorf("%s: ingress parent %s, want the client's %s", key, ing.Parent().SpanID(), sid)
			}
			if ts := ing.SpanContext().TraceState().Get("vendor"); ts != "x" {
				t.Errorf("tracestate not carried: %q", ts)
			}
			send, intake, turn := one(t, spans, name), one(t, spans, "receive rec"), one(t, spans, "process rec")
			wantChild(t, send, ing)
			wantChild(t, intake, send)
			wantChild(t, turn, intake)
			wantAttrs(t, ing, map[string]string{"mesh.ingress": "true", "mesh.verdict": "Accepted", "messaging.destination.name": "rec/in"})
			tr.sr.Reset()
		}
	}
	// No traceparent: the trace starts at the ingress.
	m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("rec/in", ""), Header: nats.Header{}, Data: []byte("hi")}
	if _, err := raw.RequestMsg(m, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool {
		for _, s := range tr.sr.Ended() {
			if s.Name() == "ingress deliver rec" {
				return !s.Parent().IsValid()
			}
		}
		return false
	}, "a root ingress span")
}

// TestTraceLateVerdict: a delivery accepted while its hub builds, then
// failed late (the factory fails), gets its late verdict in its trace: the
// hub's late answer carries the trace context, and the sender records a
// "late verdict" span, a child of the intake span, with the verdict.
func TestTraceLateVerdict(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	tr := newTraced(t)
	late := make(chan LateVerdict, 8)
	n, tc := tracedNode(t, s, "tl", tr.tp, WithLateVerdicts(func(l LateVerdict) { late <- l }))
	for i := range 3 {
		addr := subjects.Address(fmt.Sprintf("broken/%d", i))
		ctx, root := tr.tp.Tracer("app").Start(context.Background(), "caller")
		r, err := n.Client.Deliver(ctx, Delivery{To: addr})
		root.End()
		if err != nil {
			t.Fatal(err) // accepted while its build waits for the gate
		}
		close(tc.gate(addr))
		select {
		case l := <-late:
			if l.ID != r.ID || !errors.Is(l.Err, verdict.ErrActivationFailed) {
				t.Fatalf("late verdict %+v", l)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no late verdict")
		}
		spans := tr.waitSpans(t, root.SpanContext().TraceID(), 4)
		lv, intake := one(t, spans, "late verdict"), one(t, spans, "receive broken")
		wantChild(t, lv, intake)
		wantAttrs(t, lv, map[string]string{"mesh.verdict": "Unavailable", "mesh.reason": "activation-failed", "messaging.message.id": r.ID, "mesh.node": n.ID().String()})
	}
}
