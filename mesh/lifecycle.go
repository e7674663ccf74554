package mesh

import (
	"context"
	"fmt"
	"time"

	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// Start joins the membership (if configured), subscribes the node's
// delivery subject, then (unless disabled) the ingress and the control
// service. On error everything started is stopped.
func (n *Node) Start() error {
	if n.cfg.Membership != nil {
		ctx, cancel := context.WithTimeout(n.ctx, DefaultStartTimeout)
		defer cancel()
		inc, err := n.join(ctx, subjects.NodeID{})
		if err != nil {
			return err
		}
		n.mu.Lock()
		n.inc = inc
		n.mu.Unlock()
		n.installKinds()
		if err := n.startReminders(ctx); err != nil {
			n.Close()
			return fmt.Errorf("mesh: reminders: %w", err)
		}
		n.wg.Add(1)
		go n.fencing()
	} else if err := n.current().host.Start(); err != nil {
		return err
	}
	n.mu.Lock()
	n.running = true
	n.mu.Unlock()
	if !n.cfg.DisableIngress {
		if err := n.serveIngress(); err != nil {
			n.Close()
			return fmt.Errorf("mesh: ingress: %w", err)
		}
	}
	if !n.cfg.DisableControl {
		if err := n.serveControl(n.current()); err != nil {
			n.Close()
			return fmt.Errorf("mesh: control service: %w", err)
		}
	}
	return n.conn.Flush()
}

// Drain stops taking ingress requests and new outgoing deliveries, marks the
// node draining in the registry (no new placements), refuses new deliveries
// ShuttingDown so senders re-resolve elsewhere, settles the accepted ones
// (handled, or failed late with ShuttingDown once ctx ends), releases its
// claims, leaves the membership, and closes the client. It does not close
// the NATS connection, which the caller owns.
//
// Drain is bounded by ctx: it returns by ctx's deadline whatever NATS does
// (unreachable, reconnecting, a registry without a leader), with ctx's error
// if ctx ended before everything settled; what is left then (deactivating,
// leaving the registry) finishes in the background, each step bounded. Safe
// to call more than once.
func (n *Node) Drain(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- n.drain(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("mesh: drain cut short by its deadline: %w", ctx.Err())
	}
}

func (n *Node) drain(ctx context.Context) error {
	n.draining.Store(true)
	n.stopIngress()
	n.stopReminders() // fires under way go back to the other nodes
	n.Client.stopNew()
	inc := n.current()
	if inc != nil && inc.members != nil {
		if err := inc.members.SetDraining(ctx); err != nil {
			n.log.Warn("could not mark the node draining in the registry", "err", err)
		}
	}
	var err error
	if inc != nil {
		err = inc.host.Drain(ctx) // releases each claim as it deactivates
	}
	n.ingressWG.Wait()
	n.cancel()
	n.wg.Wait()
	leave := func(m *membership.Membership) {
		// Every answer of what this node accepted was published while
		// it settled; let them reach their senders before the
		// departure does (a sender fails awaited answers at once when
		// the owner leaves, and the two travel different paths).
		_ = n.conn.FlushTimeout(answersGrace)
		select {
		case <-ctx.Done():
		case <-time.After(answersGrace): // real clock: bounds the caller's shutdown, beside a network flush
		}
		lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
		defer lcancel()
		if lerr := m.Leave(lctx); lerr != nil {
			n.log.Warn("leave membership", "err", lerr)
		}
	}
	if cur := n.current(); cur != inc && cur != nil {
		// A rejoin finished as the drain began (fencing rejoins no
		// more once it has): drain that generation too, and leave with
		// it, so nothing of this node stays registered.
		if cur.members != nil {
			if err := cur.members.SetDraining(ctx); err != nil {
				n.log.Warn("could not mark the node draining in the registry", "err", err)
			}
		}
		if derr := cur.host.Drain(ctx); err == nil {
			err = derr
		}
		cur.close(leave)
		cur.retire()
	}
	if inc != nil {
		inc.close(leave)
		inc.retire()
	}
	n.Client.Close()
	n.stopServing() // the control service reports "draining" until here
	return err
}

// leaveTimeout bounds deleting the registry entry at the end of a drain.
const leaveTimeout = 2 * time.Second

// answersGrace is how long a drain waits between its last answers and its
// leave (within the drain's deadline).
const answersGrace = 200 * time.Millisecond

// Close stops the node at once: queued deliveries fail late with
// ShuttingDown; the registration is left to expire. Safe to call more than
// once.
func (n *Node) Close() error {
	n.draining.Store(true)
	n.stopServing()
	n.stopReminders()
	n.cancel()
	n.wg.Wait()
	if inc := n.current(); inc != nil {
		inc.close(nil)
		inc.retire()
	}
	n.Client.Close()
	n.ingressWG.Wait()
	return nil
}

// stopIngress stops taking ingress messages. A message the subscription
// handed over before (its callback may still be running: Unsubscribe does
// not wait for it) is refused ShuttingDown from now on instead of being
// forwarded, so ingressWG, waited on only after stopIngress, is never added
// to from zero while it is waited on, and no forward begins once Drain or
// Close returned.
func (n *Node) stopIngress() {
	n.ingressMu.Lock()
	n.ingressShut = true
	sub := n.ingressSub
	n.ingressMu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// enterIngress registers one forward with ingressWG and reports true, or
// reports false once the ingress stopped (stopIngress): the caller then
// refuses the message. It never blocks for long.
func (n *Node) enterIngress() bool {
	if h := n.ingressHook; h != nil {
		h()
	}
	n.ingressMu.Lock()
	defer n.ingressMu.Unlock()
	if n.ingressShut {
		return false
	}
	n.ingressWG.Add(1)
	return true
}

func (n *Node) stopServing() {
	n.stopIngress()
	n.svcMu.Lock()
	n.svcStopped = true // no session serves one from now on
	n.svcMu.Unlock()
	if inc := n.current(); inc != nil {
		inc.stopControl()
	}
}
