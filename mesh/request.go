package mesh

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Response is a handler's answer to a Request.
type Response struct {
	Receipt
	Payload []byte
}

type answer struct {
	payload []byte
	err     error
}

// pendingRequest is a Request awaiting its response; node is set once a
// node accepted it, so the owner's departure fails it at once.
type pendingRequest struct {
	ch    chan answer
	node  subjects.NodeID
	early []*nats.Msg // answers that overtook the acceptance (answers.go)
}

// Request delivers d, then waits for the handler's response, correlated by
// delivery ID; the handler answers with hub.Delivery.Respond (or by returning:
// an empty response, or its error as verdict.ErrHandler).
//
// Acceptance and response are two separate facts. The delivery part behaves
// as Deliver (retries only before acceptance). Once accepted, the request is
// never re-sent: if the response does not come by ctx's deadline (or the
// request timeout when ctx has none) Request fails with
// context.DeadlineExceeded — a timeout, Failed, not resendable — and the
// handler may or may not have run: the caller must reconcile that execution
// uncertainty (for instance by making the operation idempotent under the
// delivery ID it chose). A late verdict for the delivery (its hub's build
// failed, or it was deactivated before handling) fails the request with that
// verdict.
func (c *Client) Request(ctx context.Context, d Delivery) (Response, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.requestTimeout)
		defer cancel()
	}
	if err := c.validate(&d); err != nil {
		return Response{Receipt: Receipt{ID: d.ID}}, err
	}
	p := &pendingRequest{ch: make(chan answer, 1)}
	ch := p.ch
	c.pendingMu.Lock()
	if c.closing.Load() {
		c.pendingMu.Unlock()
		return Response{Receipt: Receipt{ID: d.ID}}, verdict.ErrClosing
	}
	c.pending[d.ID] = p
	c.pendingMu.Unlock()
	defer func() {
		c.pendingMu.Lock()
		delete(c.pending, d.ID)
		c.pendingMu.Unlock()
	}()
	r, err := c.deliver(ctx, &d, true)
	if err != nil {
		return Response{Receipt: r}, err
	}
	c.pendingMu.Lock()
	p.node = r.Node
	early := p.early
	p.early = nil
	c.pendingMu.Unlock()
	for _, m := range early {
		c.dispatchAnswer(m)
	}
	if c.departed(r.Node) {
		c.failPending(r.Node, departedError(r.Node, "before its response"))
	}
	select {
	case a := <-ch:
		if a.err != nil {
			return Response{Receipt: r}, fmt.Errorf("mesh: request %s to %s: %w", d.ID, d.To, a.err)
		}
		return Response{Receipt: r, Payload: a.payload}, nil
	case <-ctx.Done():
		return Response{Receipt: r}, fmt.Errorf("mesh: request %s to %s accepted by %s, no response: %w", d.ID, d.To, r.Node, ctx.Err())
	}
}

// dispatchAnswer receives late verdicts and responses on the answer subject.
func (c *Client) dispatchAnswer(m *nats.Msg) {
	id := m.Header.Get(hub.HeaderID)
	_, err := verdict.Decode(m.Header)
	kind := m.Header.Get(hub.HeaderAnswer)
	c.pendingMu.Lock()
	p, ok := c.pending[id]
	if ok && p.node.IsZero() {
		// Not accepted yet as far as this client knows: hold the answer
		// until the acceptance names the generation it must come from.
		if len(p.early) < maxEarlyAnswers {
			p.early = append(p.early, m)
			c.pendingMu.Unlock()
			return
		}
		c.pendingMu.Unlock()
		c.forgedAnswer(m, id)
		return
	}
	if ok && !c.genuine(m, id, p.node) {
		c.pendingMu.Unlock()
		c.forgedAnswer(m, id)
		return
	}
	if ok {
		delete(c.pending, id)
	}
	c.pendingMu.Unlock()
	if ok {
		p.ch <- answer{payload: m.Data, err: err}
		return
	}
	if kind == hub.AnswerVerdict && err != nil {
		node, _ := subjects.ParseNodeID(m.Header.Get(verdict.HeaderNode))
		if !c.genuine(m, id, node) {
			c.forgedAnswer(m, id)
			return
		}
		if f := c.opts.onLate; f != nil {
			f(LateVerdict{ID: id, Err: err})
		} else {
			c.log.Warn("late verdict for a delivery", "id", id, "err", err)
		}
	}
}
