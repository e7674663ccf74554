package hub

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Claims off the subscription goroutine (DESIGN §5). The first delivery for
// a cold address starts its claim on a goroutine of its own and parks; later
// deliveries for that address park behind it (bounded per address and
// node-wide); deliveries for active addresses never wait behind a claim.
// Claims of many addresses run at once, up to ClaimConcurrency. A parked
// delivery is not answered until its claim ends: Accepted once it is in the
// inbox of the new activation, or refused with the claim's failure — one
// verdict each.
//
// Past either bound the intake refuses Ignored (verdict.ErrInboxFull), as
// for a full inbox (DESIGN §3): the node is overloaded with cold
// activations, and an immediate re-send would feed the overload it reports;
// nothing was accepted, so the caller may try again later at its own pace.

// claimOp is a cold address whose claim is in flight. done is closed once
// it ended; refusal is then why no activation was built (nil: built).
type claimOp struct {
	addr    subjects.Address
	factory Factory
	parked  []parkedDelivery
	done    chan struct{}
	refusal error
	act     *activation // the activation built on the claim (refusal nil), even if it is gone again
}

func newClaimOp(addr subjects.Address, f Factory) *claimOp {
	return &claimOp{addr: addr, factory: f, done: make(chan struct{})}
}

// parkedDelivery is a delivery waiting for its address's claim.
type parkedDelivery struct {
	m *nats.Msg
	e *entry
}

// park parks e on its address's claim, starting the claim if none is in
// flight. It returns parked == false with a nil error if the address became
// active meanwhile (dispatch it again), or a refusal.
func (h *Host) park(m *nats.Msg, e *entry) (parked bool, err error) {
	addr := e.To
	h.kindsMu.RLock()
	f, ok := h.kinds[addr.Kind()]
	h.kindsMu.RUnlock()
	if !ok {
		return false, verdict.New(verdict.ReasonUnknownKind, "node %s hosts no hub of kind %q", h.nodeID, addr.Kind())
	}
	pc, pipelined := h.cfg.Claims.(PipelinedClaims)
	h.mu.Lock()
	op, start, err := h.parkLocked(m, e, f, pipelined)
	h.mu.Unlock()
	if start {
		h.startClaim(pc, op) // after the host's lock: the claim may settle at once
	}
	return op != nil, err
}

// parkLocked is park under the host's lock: it returns the claim e was
// parked on (nil: not parked), whether that claim is new and still to be
// started through the pipeline, or the refusal.
func (h *Host) parkLocked(m *nats.Msg, e *entry, f Factory, pipelined bool) (op *claimOp, start bool, err error) {
	addr := e.To
	switch {
	case h.draining || h.ctx.Err() != nil:
		return nil, false, verdict.New(verdict.ReasonHubShuttingDown, "node %s is draining", h.nodeID)
	case h.activations[addr] != nil:
		return nil, false, nil
	case h.parked >= h.cfg.ParkBacklog:
		h.parkRefused.Add(1)
		return nil, false, verdict.New(verdict.ReasonInboxFull, "node %s has %d deliveries parked on claims in flight (the limit)", h.nodeID, h.parked)
	}
	op = h.claiming[addr]
	if op == nil {
		op = newClaimOp(addr, f)
		h.claiming[addr] = op
		h.wg.Add(1)
		if pipelined {
			start = true
		} else {
			go h.runClaim(op)
		}
	} else if len(op.parked) >= h.cfg.ParkPerAddress {
		h.parkRefused.Add(1)
		return nil, false, verdict.New(verdict.ReasonInboxFull, "%d deliveries for %s are parked on its claim (the limit)", len(op.parked), addr)
	}
	op.parked = append(op.parked, parkedDelivery{m: m, e: e})
	h.parked++
	return op, start, nil
}

// runClaim claims op's address on its own goroutine (a Claims that is not
// pipelined), then finishes it (finishClaim).
func (h *Host) runClaim(op *claimOp) {
	var g Grant
	var err error
	select {
	case h.claimSem <- struct{}{}:
		ctx, cancel := context.WithTimeout(h.ctx, ClaimTimeout+TakeoverWait)
		g, err = h.cfg.Claims.Claim(ctx, op.addr)
		cancel()
		<-h.claimSem
	case <-h.ctx.Done():
		err = h.ctx.Err()
	}
	h.finishClaim(op, g, err, false)
}

// startClaim starts op's claim through pc's pipeline when one of the
// ClaimConcurrency slots is free, or queues it for the next slot a claim
// frees (releaseClaimSlot): claims start in the order their addresses
// arrived, and no goroutine waits for a slot.
func (h *Host) startClaim(pc PipelinedClaims, op *claimOp) {
	h.claimQMu.Lock()
	select {
	case h.claimSem <- struct{}{}:
		h.claimQMu.Unlock()
		h.tryClaim(pc, op)
	default:
		h.claimQ = append(h.claimQ, op)
		h.claimQMu.Unlock()
	}
}

// tryClaim runs op's claim, holding a slot: its plain case through the
// pipeline, and the whole claim (Claims.Claim, on a goroutine, with what is
// left of the claim's time) when the plain case did not settle it. It
// frees the slot, then finishes the claim.
func (h *Host) tryClaim(pc PipelinedClaims, op *claimOp) {
	ctx, cancel := context.WithTimeout(h.ctx, ClaimTimeout+TakeoverWait)
	pc.TryClaim(ctx, op.addr, func(g Grant, ok bool) {
		if !ok {
			go func() {
				g, err := pc.Claim(ctx, op.addr)
				cancel()
				h.releaseClaimSlot(pc)
				h.finishClaim(op, g, err, false)
			}()
			return
		}
		cancel()
		h.releaseClaimSlot(pc)
		h.finishClaim(op, g, nil, true)
	})
}

// releaseClaimSlot hands the slot of a claim that ended to the longest
// queued claim, or frees it. Once the host is closing, a queued claim is
// not started: it ends refused (resendable, nothing was claimed) and the
// slot goes on to the next.
func (h *Host) releaseClaimSlot(pc PipelinedClaims) {
	for {
		h.claimQMu.Lock()
		if len(h.claimQ) == 0 {
			<-h.claimSem
			h.claimQMu.Unlock()
			return
		}
		next := h.claimQ[0]
		h.claimQ[0] = nil
		h.claimQ = h.claimQ[1:]
		h.claimQMu.Unlock()
		if err := h.ctx.Err(); err != nil {
			h.finishClaim(next, Grant{}, err, true)
			continue
		}
		h.tryClaim(pc, next)
		return
	}
}

// finishClaim ends op's claim, whose outcome is g and err: it activates
// the address and enqueues the parked deliveries in arrival order (under
// the host's lock, so nothing arriving later overtakes them), or refuses
// them all with the claim's failure. On the pipeline's goroutine
// (pipelined) it never blocks on the network: a claim made while the host
// began draining is released on a goroutine of its own; elsewhere before
// it returns.
func (h *Host) finishClaim(op *claimOp, g Grant, err error, pipelined bool) {
	defer h.wg.Done()
	addr := op.addr
	var refusal error
	switch {
	case err != nil:
		refusal = claimFailed(addr, err)
	case g.Owner != h.cfg.Node:
		refusal = &verdict.Error{Reason: verdict.ReasonNotOwner, Message: "address " + string(addr) + " is owned by " + g.Owner.String(), Node: g.Owner.String()}
	case g.Token.IsZero() || g.Token.Addr != addr:
		refusal = claimFailed(addr, fmt.Errorf("the claim returned no token for %s", addr))
		g.Token = ClaimToken{}
	}
	type outcome struct {
		p        parkedDelivery
		accepted bool
		dup      *record // already accepted under its ID
		again    bool    // the activation went away: dispatch afresh
		err      error
	}
	h.mu.Lock()
	delete(h.claiming, addr)
	parked := op.parked
	op.parked = nil
	h.parked -= len(parked)
	var a *activation
	release := false
	if refusal == nil {
		a, refusal = h.newActivationLocked(addr, op.factory, g.Token)
		release = refusal != nil // claimed, then found the host draining
	}
	op.refusal, op.act = refusal, a
	out := make([]outcome, 0, len(parked))
	for _, p := range parked {
		o := outcome{p: p}
		switch {
		case refusal != nil:
			o.err = refusal
		case h.dedupe.lookup(p.e.key) != nil:
			o.dup = h.dedupe.lookup(p.e.key) // a copy parked twice: accepted once
		default:
			p.e.rec = h.dedupe.add(p.e.key, p.e.expectResponse, p.e.answerTo)
			eerr := a.enqueue(p.e, true)
			if eerr != nil {
				h.dedupe.forget(p.e.rec)
				p.e.rec = nil
			}
			switch {
			case eerr == errActivationGone:
				o.again = true
			case eerr != nil:
				o.err = eerr
			default:
				o.accepted = true
			}
		}
		out = append(out, o)
	}
	h.mu.Unlock()
	close(op.done)
	switch {
	case release && pipelined:
		h.wg.Add(1) // within finishClaim's own count: Close still waits for it
		go func() {
			defer h.wg.Done()
			h.cfg.Claims.Release(g.Token)
		}()
	case release:
		h.cfg.Claims.Release(g.Token)
	}
	for _, o := range out {
		switch {
		case o.again:
			h.dispatch(o.p.m, o.p.e)
		case o.err != nil:
			h.refuse(o.p.m, o.err)
		case o.dup != nil:
			h.duplicate(o.p.m, o.p.e, o.dup)
		default:
			h.answerAccepted(o.p.m, o.p.e)
		}
	}
}

// claimFailed is the resendable refusal of a claim that could not be made.
// The claim's own timeout is not kept in the error chain: it is not a leg
// timeout (nothing was accepted), and the predicates read a timeout
// anywhere in the chain as one.
//
// A resendable verdict of the claim's own (the address's owner departed
// and its fencing delay has yet to run) is the refusal as it is: the
// directory is not what failed.
func claimFailed(addr subjects.Address, err error) error {
	var ve *verdict.Error
	if errors.As(err, &ve) && ve.Reason != verdict.ReasonUnknown && verdict.IsResendable(ve) {
		return ve
	}
	return &verdict.Error{Reason: verdict.ReasonDirectoryDown, Message: "claim " + string(addr) + ": " + err.Error()}
}
