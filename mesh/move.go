package mesh

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultMoveTimeout bounds how long LameDuckHandler's move waits for the
// answers in flight before it reconnects anyway: well inside the server's
// lame_duck_grace_period (10 s by default), after which the server starts
// closing its clients.
const DefaultMoveTimeout = 2 * time.Second

// MoveConnection moves the client's NATS connection to another server
// without losing an answer it awaits — for a server that announced lame
// duck mode (see LameDuckHandler): it will close the connection soon, and
// a link that drops fails every accepted Request awaiting its response
// (outcome unknown, DESIGN §3). It pauses new attempts (they wait in their
// lanes, in order, bounded by their own ctx), waits until no leg and no
// awaited response is in flight or ctx ends, forces a reconnect
// (nats.Conn.ForceReconnect: the server in lame duck takes no new
// connections, so another one is chosen) and resumes once the connection is
// back or ctx ended. What is still in flight when it reconnects meets the
// verdicts of a link drop. It returns ForceReconnect's error or nil; a call
// while a move is in progress returns nil at once. Safe for concurrent use.
func (c *Client) MoveConnection(ctx context.Context) error {
	gate := make(chan struct{})
	if !c.moving.CompareAndSwap(nil, &gate) {
		return nil
	}
	defer func() {
		c.moving.Store(nil)
		close(gate)
	}()
	quiet := func() bool { return c.inFlight.Load() == 0 && c.awaiting() == 0 }
	// Real clock, as below: polls for a condition, bounded by ctx.
	for !quiet() && ctx.Err() == nil && !c.closing.Load() {
		select {
		case <-ctx.Done():
		case <-c.stop:
		case <-time.After(2 * time.Millisecond):
		}
	}
	nc := c.cfg.Conn
	reconnects := nc.Stats().Reconnects
	c.log.Info("moving the NATS connection to another server", "server", nc.ConnectedUrlRedacted(), "quiet", quiet())
	if err := nc.ForceReconnect(); err != nil {
		return err
	}
	for !(nc.IsConnected() && nc.Stats().Reconnects > reconnects) && ctx.Err() == nil && !c.closing.Load() {
		select {
		case <-ctx.Done():
		case <-c.stop:
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// awaitMove holds a new attempt while MoveConnection runs, bounded by ctx
// and deadline: nil to go on, verdict.ErrClosing, the caller's
// context.Canceled, or verdict.ErrDeadlineUnsent (nothing was sent).
func (c *Client) awaitMove(ctx context.Context, deadline time.Time) error {
	gate := c.moving.Load()
	if gate == nil {
		return nil
	}
	t := time.NewTimer(time.Until(deadline)) // real clock: a deadline
	defer t.Stop()
	select {
	case <-*gate:
		return nil
	case <-c.stop:
	case <-ctx.Done():
	case <-t.C:
	}
	if err := unsentVerdict(stageMove, c.unsentFactsOf(ctx, deadline, nil), ""); err != nil {
		return err
	}
	return unsentVerdict(stageMove, unsentFacts{deadline: true}, "") // the timer fires at the deadline
}

// MoveConnection moves the node's NATS connection to another server
// without losing an answer its client awaits (Client.MoveConnection) or an
// ingress request: it first drains the node's ingress subscription (the
// other nodes of the queue group take the ingress meanwhile) and subscribes
// it again once the connection moved. The node's generation, activations
// and claims stay; on the reconnect its membership announces the moved
// connection, so senders re-send what was in transit to it. Bounded by ctx
// as Client.MoveConnection is; safe for concurrent use.
func (n *Node) MoveConnection(ctx context.Context) error {
	resume := n.pauseIngress(ctx)
	defer resume()
	return n.Client.MoveConnection(ctx)
}

// LameDuckHandler returns a nats option that moves the connection of the
// node in node (nil until it is built) when its server announces lame duck
// mode (a rolling restart or upgrade of the NATS servers), bounded by
// DefaultMoveTimeout: so that the server's closing it finds no accepted
// Request awaiting its response. Give it to nats.Connect of the node's
// connection and Store the node once NewNode returned.
func LameDuckHandler(node *atomic.Pointer[Node]) nats.Option {
	return nats.LameDuckModeHandler(func(*nats.Conn) {
		n := node.Load()
		if n == nil {
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), DefaultMoveTimeout)
			defer cancel()
			if err := n.MoveConnection(ctx); err != nil {
				n.log.Warn("moving off a server in lame duck mode failed", "err", err)
			}
		}()
	})
}
