package mesh

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// IngressQueueGroup is the queue group in which nodes serve the ingress.
const IngressQueueGroup = "natsmesh-ingress"

// DefaultIngressConcurrency bounds the ingress deliveries one node forwards
// at once; beyond it, or beyond the caller's fair share of it
// (ingress_fair.go, NodeConfig.IngressCallerShare), the ingress answers
// Ignored (verdict.ErrInboxFull).
const DefaultIngressConcurrency = 4096

// serveIngress subscribes <prefix>.in.*.* in the ingress queue group: any
// NATS client can deliver without the Go library (DESIGN §2). The node that
// takes a message resolves the owner, forwards it as a delivery (retrying
// refusals like any sender) and answers the client with the owner's verdict,
// and for Mesh-Expect-Response with the handler's response as payload.
func (n *Node) serveIngress() error {
	sub, err := n.conn.QueueSubscribe(n.prefix.IngressSubscription(), IngressQueueGroup, n.ingress)
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(-1, -1)
	n.ingressMu.Lock()
	n.ingressSub = sub
	n.ingressMu.Unlock()
	return nil
}

// pauseIngress stops the server from handing the node more ingress
// messages before its connection moves (MoveConnection), and returns the
// function that subscribes the ingress again once the move is done.
//
// Why: a message the server has already written towards the node when the
// connection closes is lost with it, and a raw ingress caller, whose own
// link held, cannot tell; it waits out its timeout and has to take the
// outcome as unknown. Draining the subscription (nats.Subscription.Drain:
// UNSUB, then a round trip, then the messages already received are handed
// to the callback) leaves nothing in transit; meanwhile the other nodes of
// the queue group take the ingress, or, with none, callers get NATS no
// responders at once, which says nothing was delivered. It waits for the
// drain at most until ctx ends; a drain still running then completes on its
// own. Forwards that the drained messages start are the client's own
// attempts: the move waits for them (Client.MoveConnection).
func (n *Node) pauseIngress(ctx context.Context) (resume func()) {
	n.ingressMu.Lock()
	sub := n.ingressSub
	if sub == nil || n.ingressShut || n.ingressPaused {
		n.ingressMu.Unlock()
		return func() {}
	}
	n.ingressPaused = true
	n.ingressMu.Unlock()
	closed := sub.StatusChanged(nats.SubscriptionClosed)
	if sub.Drain() == nil {
		select {
		case <-closed:
		case <-ctx.Done():
		}
	}
	return func() {
		n.ingressMu.Lock()
		defer n.ingressMu.Unlock()
		n.ingressPaused = false
		if n.ingressShut {
			return // stopIngress ran meanwhile: the ingress stays closed
		}
		next, err := n.conn.QueueSubscribe(n.prefix.IngressSubscription(), IngressQueueGroup, n.ingress)
		if err != nil {
			n.log.Error("the ingress could not be subscribed again after the connection moved: this node takes no ingress", "err", err)
			return
		}
		_ = next.SetPendingLimits(-1, -1)
		n.ingressSub = next
	}
}

func (n *Node) ingress(m *nats.Msg) {
	n.ingressCount.Add(1)
	if m.Reply != "" && !n.safeReply(m.Reply) {
		return
	}
	if m.Reply != "" {
		if why := n.replyRule(m.Reply); why != "" {
			// Dropped unanswered: the only place to answer is the
			// refused reply itself.
			n.badReplies.Add(1)
			if c := n.inboxReplies.Add(1); c&(c-1) == 0 {
				n.log.Warn("ingress request dropped: its reply is under an inbox that is not the caller's own (SECURITY.md, reply rules)", "reply", m.Reply, "rule", why, "refused_total", c)
			}
			return
		}
	}
	addr, stream, err := n.prefix.ParseIngress(m.Subject)
	if err != nil {
		n.answerIngress(m, m.Header.Get(hub.HeaderID), "", &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: err.Error()}, nil)
		return
	}
	caller, ok := n.callerOf(m)
	if !ok {
		n.refusedNodeOnly.Add(1)
		n.answerIngress(m, "", "", verdict.New(verdict.ReasonBadRequest, "header %s given more than once: one identity per request", HeaderRequestInfo), nil)
		return
	}
	if n.rates != nil && !n.rates.allow(caller, n.Clock().Now()) {
		n.ingressRateLimited.Add(1)
		n.callerCounts.add(caller, func(c *IngressCaller) { c.RateLimited++ })
		n.answerIngress(m, m.Header.Get(hub.HeaderID), "", verdict.New(verdict.ReasonStormBreaker, "ingress of node %s: this caller is over its rate of %g deliveries/s", n.ID(), n.rates.rate), nil)
		return
	}
	if !n.ingressPool.acquire(caller) {
		n.ingressShareRefused.Add(1)
		n.callerCounts.add(caller, func(c *IngressCaller) { c.ShareFull++ })
		n.answerIngress(m, m.Header.Get(hub.HeaderID), "", verdict.New(verdict.ReasonInboxFull, "ingress of node %s is full for this caller (its share: %d of %d slots)", n.ID(), n.ingressPool.share, n.ingressPool.total), nil)
		return
	}
	n.callerCounts.add(caller, func(c *IngressCaller) { c.Taken++ })
	slot := &ingressSlot{n: n, caller: caller, ingress: true}
	if !n.enterIngress() {
		slot.release()
		n.answerIngress(m, m.Header.Get(hub.HeaderID), "", verdict.New(verdict.ReasonHubShuttingDown, "node %s is stopping: its ingress is closed", n.cfg.Name), nil)
		return
	}
	go func() {
		defer n.ingressWG.Done()
		defer slot.release()
		n.forward(m, addr, stream, slot)
	}()
}

func (n *Node) forward(m *nats.Msg, addr subjects.Address, stream subjects.Stream, slot *ingressSlot) {
	h := m.Header
	caller := slot.caller
	d := Delivery{To: addr, Stream: stream, Payload: m.Data, caller: caller, placer: slot}
	if h != nil {
		d.ID = h.Get(hub.HeaderID)
		if _, set := h[hub.HeaderID]; set && d.ID == "" {
			// Present but empty — NATS trims whitespace, so " " or a tab
			// arrives so: refused, not replaced by a generated ID that
			// the client's re-send under the same ID would not get.
			n.answerIngress(m, "", "", hub.ValidateID(d.ID), nil)
			return
		}
		d.Type = h.Get(hub.HeaderType)
		d.From = subjects.Address(h.Get(hub.HeaderFrom))
		d.Idempotent = h.Get(hub.HeaderIdempotent) == "true"
	}
	if err := nodeOnly(d); err != nil {
		n.refusedNodeOnly.Add(1)
		n.answerIngress(m, d.ID, "", err, nil)
		return
	}
	ctx := context.Background()
	request := h != nil && h.Get(hub.HeaderExpectResponse) == "true"
	var span trace.Span // nil: tracing off
	if n.tracer != nil {
		ctx, span = n.startIngress(m, &d, request)
	}
	var r Receipt
	var err error
	var payload []byte
	if request {
		var resp Response
		resp, err = n.Client.Request(ctx, d)
		r, payload = resp.Receipt, resp.Payload
	} else {
		r, err = n.Client.Deliver(ctx, d)
	}
	if span != nil {
		endSend(span, r, err)
	}
	n.answerIngress(m, r.ID, nodeOf(r), err, payload)
}

// safeReply reports whether the node may answer on reply
// (subjects.Prefix.SafeReply); a refusal is counted
// (NodeStatus.IngressRefused) and logged at the first and every power of
// two, and the request is dropped unanswered.
func (n *Node) safeReply(reply string) bool {
	if n.prefix.SafeReply(reply) {
		return true
	}
	if c := n.badReplies.Add(1); c&(c-1) == 0 {
		n.log.Warn("request dropped: a node never answers on that reply subject (SECURITY.md)", "reply", reply, "refused_total", c)
	}
	return false
}

func nodeOf(r Receipt) string {
	if r.Node.IsZero() {
		return ""
	}
	return r.Node.String()
}

// answerIngress replies to an outside client with a verdict (and payload),
// echoing the delivery ID so the client can re-send under the same ID.
func (n *Node) answerIngress(m *nats.Msg, id, node string, err error, payload []byte) {
	if m.Reply == "" {
		if err != nil {
			// Logged at the first and every power of two: a flood of
			// fire-and-forget deliveries must not flood the log.
			if c := n.unanswered.Add(1); c&(c-1) == 0 {
				n.log.Warn("ingress delivery failed; the client asked no reply", "subject", m.Subject, "err", err, "failed_unanswered_total", c)
			}
		}
		return
	}
	r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}, Data: payload}
	if id != "" {
		r.Header.Set(hub.HeaderID, id)
	}
	verdict.Encode(r.Header, err, node)
	if perr := n.conn.PublishMsg(r); perr != nil && !errors.Is(perr, nats.ErrConnectionClosed) {
		n.log.Warn("ingress reply failed", "subject", m.Subject, "err", perr)
	}
}

// startIngress opens the ingress node's span of an outside client's message
// (SERVER: it answers the client), a child of the client's traceparent, if
// any; the delivery it forwards is its child.
func (n *Node) startIngress(m *nats.Msg, d *Delivery, request bool) (context.Context, trace.Span) {
	ctx := meshtrace.Extract(context.Background(), m.Header)
	op := "deliver"
	if request {
		op = "request"
	}
	attrs := meshtrace.Message(meshtrace.OpReceive, "ingress", string(d.To), d.ID, string(d.Stream))
	attrs = append(attrs, meshtrace.KeyIngress.Bool(true), meshtrace.KeyNode.String(n.ID().String()))
	return n.tracer.Start(ctx, "ingress "+op+" "+d.To.Kind(), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// NodeOnlyTypes are the delivery types of the sync-stream protocol
// (package syncstream, docs/protocol.md §8a): node to node only. The
// ingress refuses them, so an outside caller can neither register
// subscribers on another's stream nor feed frames to a subscriber (DESIGN
// §10).
var NodeOnlyTypes = []string{"natsmesh.subscribe", "natsmesh.unsubscribe", "natsmesh.frame", "natsmesh.frames"}

// nodeOnly refuses, as a bad request, an ingress delivery of a node-only
// type or to an internal kind (a kind beginning with "_", such as sync-
// stream subscriber addresses): nothing is sent.
func nodeOnly(d Delivery) error {
	for _, t := range NodeOnlyTypes {
		if d.Type == t {
			return verdict.New(verdict.ReasonBadRequest, "delivery type %q is node to node only: the ingress refuses it", d.Type)
		}
	}
	if k := d.To.Kind(); len(k) > 0 && k[0] == '_' {
		return verdict.New(verdict.ReasonBadRequest, "kind %q is internal: the ingress refuses deliveries to it", k)
	}
	return nil
}
