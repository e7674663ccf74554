package mesh

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Prompt failure (DESIGN §4): legs in flight and awaited responses are
// indexed by the owner generation they went to, so that when membership
// declares that generation gone every one of them fails at once with the
// departed verdict instead of waiting out its timeout.

// legRef is one leg in flight; FailNode sets cause and cancels it.
type legRef struct {
	cancel context.CancelFunc
	cause  atomic.Pointer[error]
}

// nodeLegs are the legs in flight to one node generation.
type nodeLegs struct {
	mu   sync.Mutex
	legs map[*legRef]struct{}
	gone error // set once the generation departed: later legs fail at once
}

func (c *Client) trackLeg(node subjects.NodeID, ref *legRef) *nodeLegs {
	v, ok := c.legsByNode.Load(node)
	if !ok {
		v, _ = c.legsByNode.LoadOrStore(node, &nodeLegs{legs: map[*legRef]struct{}{}})
	}
	nl := v.(*nodeLegs)
	nl.mu.Lock()
	if nl.gone != nil {
		err := nl.gone
		ref.cause.Store(&err)
		ref.cancel()
	} else {
		nl.legs[ref] = struct{}{}
	}
	nl.mu.Unlock()
	return nl
}

func (nl *nodeLegs) remove(ref *legRef) {
	nl.mu.Lock()
	delete(nl.legs, ref)
	nl.mu.Unlock()
}

func departedError(node subjects.NodeID, how string) error {
	return &verdict.Error{Reason: verdict.ReasonDeparted, Message: fmt.Sprintf("owner %s departed %s", node, how), Node: node.String()}
}

// FailNode fails at once everything in flight to node: each leg with the
// departed verdict (ShuttingDown, resendable: Deliver re-resolves and sends
// again) and each Request awaiting a response from it (the departed
// verdict, not re-sent: its handler may have run — the caller must reconcile
// that execution uncertainty). Legs sent to node afterwards fail at once
// too. how describes the departure for the error text. Safe for concurrent
// use; calling it twice for one node is harmless.
func (c *Client) FailNode(node subjects.NodeID, how string) {
	err := departedError(node, "("+how+")")
	v, _ := c.legsByNode.LoadOrStore(node, &nodeLegs{legs: map[*legRef]struct{}{}})
	nl := v.(*nodeLegs)
	nl.mu.Lock()
	if nl.gone == nil {
		nl.gone = err
	}
	legs := nl.legs
	nl.legs = map[*legRef]struct{}{}
	nl.mu.Unlock()
	for ref := range legs {
		ref.cause.Store(&err)
		ref.cancel()
	}
	c.failPending(node, err)
}

// departed reports whether FailNode was called for node.
func (c *Client) departed(node subjects.NodeID) bool {
	v, ok := c.legsByNode.Load(node)
	if !ok {
		return false
	}
	nl := v.(*nodeLegs)
	nl.mu.Lock()
	defer nl.mu.Unlock()
	return nl.gone != nil
}

func (c *Client) failPending(node subjects.NodeID, err error) {
	c.pendingMu.Lock()
	var fail []*pendingRequest
	for id, p := range c.pending {
		if p.node == node {
			fail = append(fail, p)
			delete(c.pending, id)
		}
	}
	c.pendingMu.Unlock()
	for _, p := range fail {
		p.ch <- answer{err: err}
	}
}

// failAllLegs fails every leg in flight, to any node, with err (which must be
// resendable): the legs are re-sent, the lanes keep their order.
func (c *Client) failAllLegs(err error) {
	c.legsByNode.Range(func(_, v any) bool {
		nl := v.(*nodeLegs)
		nl.mu.Lock()
		legs := nl.legs
		nl.legs = map[*legRef]struct{}{}
		nl.mu.Unlock()
		for ref := range legs {
			ref.cause.Store(&err)
			ref.cancel()
		}
		return true
	})
}

// FailInFlight fails every leg in flight to node with err, which must be
// resendable (the leg is re-sent with the same delivery ID; the receiver
// dedupes), without marking node departed: its connection moved (its server
// shut down, lame duck) and what was in transit may be lost. Awaited
// responses are left alone. Safe for concurrent use.
func (c *Client) FailInFlight(node subjects.NodeID, err error) {
	v, ok := c.legsByNode.Load(node)
	if !ok {
		return
	}
	nl := v.(*nodeLegs)
	nl.mu.Lock()
	legs := nl.legs
	nl.legs = map[*legRef]struct{}{}
	nl.mu.Unlock()
	for ref := range legs {
		ref.cause.Store(&err)
		ref.cancel()
	}
}
