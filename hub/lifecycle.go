package hub

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// activate returns the activation of addr, creating it (and starting its
// build) if absent. With Claims set it claims addr first, through the same
// claim operation the intake parks deliveries on (park.go): one claim per
// address is in flight on a host at a time, and the activation it builds is
// the only holder of its token.
func (h *Host) activate(addr subjects.Address) (*activation, error) {
	h.kindsMu.RLock()
	f, ok := h.kinds[addr.Kind()]
	h.kindsMu.RUnlock()
	if !ok {
		return nil, verdict.New(verdict.ReasonUnknownKind, "node %s hosts no hub of kind %q", h.nodeID, addr.Kind())
	}
	if h.cfg.Claims == nil {
		h.mu.Lock()
		a, err := h.newActivationLocked(addr, f, ClaimToken{})
		h.mu.Unlock()
		return a, err
	}
	for {
		h.mu.Lock()
		if h.draining || h.ctx.Err() != nil {
			h.mu.Unlock()
			return nil, verdict.New(verdict.ReasonHubShuttingDown, "node %s is draining", h.nodeID)
		}
		if a := h.activations[addr]; a != nil {
			h.mu.Unlock()
			return a, nil
		}
		op := h.claiming[addr]
		if op == nil {
			op = newClaimOp(addr, f)
			h.claiming[addr] = op
			h.wg.Add(1)
			h.mu.Unlock()
			pc, pipelined := h.cfg.Claims.(PipelinedClaims)
			if !pipelined {
				h.runClaim(op)
			} else {
				h.startClaim(pc, op)
			}
		} else {
			h.mu.Unlock()
		}
		select {
		case <-op.done: // ended (runClaim returns once it has)
		default:
			select {
			case <-op.done:
			case <-h.ctx.Done():
				return nil, verdict.New(verdict.ReasonHubShuttingDown, "node %s is closing", h.nodeID)
			}
		}
		if op.refusal != nil {
			return nil, op.refusal
		}
		if op.act != nil {
			// Claimed and activated: that activation, even if its
			// build failed already (a lookup would claim and build
			// again, at once, for as long as builds fail fast).
			return op.act, nil
		}
	}
}

// newActivationLocked returns addr's activation, creating it and starting
// its build if absent, or refuses while draining. tok is the claim the
// activation holds (zero without Claims); an activation already there takes
// tok over, since it is now the address's current claim on this node.
// Called with h.mu held.
func (h *Host) newActivationLocked(addr subjects.Address, f Factory, tok ClaimToken) (*activation, error) {
	if h.draining || h.ctx.Err() != nil {
		return nil, verdict.New(verdict.ReasonHubShuttingDown, "node %s is draining", h.nodeID)
	}
	if a := h.activations[addr]; a != nil {
		if !tok.IsZero() {
			a.mu.Lock()
			a.claim = tok
			a.mu.Unlock()
		}
		return a, nil
	}
	a := &activation{host: h, addr: addr, state: stateBuilding, building: true, claim: tok}
	if prev := h.retiring[addr]; prev != nil {
		// The address's previous activation here was stood down under a
		// turn that may still run: this one builds after it finished.
		a.prev = prev
		delete(h.retiring, addr)
	}
	h.activations[addr] = a
	h.queueIdleLocked(a, h.cfg.Clock.Now())
	h.wg.Add(1)
	go a.build(f)
	return a, nil
}

// Activate activates addr on this node explicitly (DESIGN §5, local
// activation) and pins it until release is called: it is never
// idle-collected meanwhile. It does not wait for the hub's build, and never
// builds twice: if the build it started failed before it took its hold, it
// returns that failure (verdict.ErrActivationFailed, not resendable);
// one that fails later leaves the release of an activation that is gone.
// It blocks on the address's claim (with Claims), bounded by ctx. Errors
// are verdict errors (unknown kind, not the owner, shutting down,
// activation failed) or ctx's. release is safe to call more than once.
// Safe for concurrent use.
func (h *Host) Activate(ctx context.Context, addr subjects.Address) (release func(), err error) {
	if err := addr.Validate(); err != nil {
		return nil, &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: err.Error()}
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		a, err := h.activate(addr)
		if err != nil {
			return nil, err
		}
		a.mu.Lock()
		switch a.state {
		case stateFailed:
			err := a.failure
			a.mu.Unlock()
			return nil, err
		case stateClosed:
			a.mu.Unlock()
			h.mu.RLock()
			closing := h.activations[addr] == a
			h.mu.RUnlock()
			if closing {
				// Deactivate closed it and waits for its turn in
				// progress before it takes it out of the map: wait for
				// that, so that the new activation never runs beside
				// the old one's last turn.
				a.waitRemoved(ctx)
			}
			continue // collected or stood down meanwhile: activate it anew
		}
		a.holds++
		a.mu.Unlock()
		var once sync.Once
		return func() {
			once.Do(func() {
				a.mu.Lock()
				a.holds--
				now := h.cfg.Clock.Now()
				a.lastActive = now
				free := a.holds == 0
				a.mu.Unlock()
				if free {
					h.mu.Lock()
					h.queueIdleLocked(a, now)
					h.mu.Unlock()
				}
			})
		}, nil
	}
}

// serving reports whether a turn may handle a delivery now: nil, or the
// fence's error once it is known the node will not serve again. While the
// fence only pauses (AwaitServing), it blocks.
func (h *Host) serving() error {
	f := h.cfg.Fence
	if h.cfg.TurnFence != nil {
		f = h.cfg.TurnFence
	}
	if f == nil {
		return nil
	}
	err := f()
	if err == nil {
		return nil
	}
	if w := h.cfg.AwaitServing; w != nil {
		if werr := w(h.ctx); werr == nil {
			return nil
		}
	}
	return err
}

// Deactivate removes addr's activation at once, if any: what it still had
// queued fails late with ShuttingDown, the hub's Deactivate runs, and the
// claim is released. It blocks until a handler in progress returns and the
// hub's Deactivate returned (a build in progress deactivates the hub when
// it returns).
func (h *Host) Deactivate(addr subjects.Address) {
	h.mu.Lock()
	a := h.activations[addr]
	h.mu.Unlock()
	if a == nil {
		return
	}
	// Closed but still the address's activation until its turn in progress
	// returns: a delivery arriving meanwhile is refused resendable
	// (dispatch) instead of building a second activation whose turns would
	// run beside that one.
	a.close(verdict.New(verdict.ReasonNotOwner, "activation %s on %s stood down before handling", addr, h.nodeID))
	a.waitIdle()
	h.mu.Lock()
	if h.activations[addr] == a {
		delete(h.activations, addr)
	}
	h.mu.Unlock()
	a.markRemoved()
	a.deactivate()
	a.waitDeactivated() // the last turn may have started it: it has returned too
}

// StandDown removes the activation that holds the claim t, if one still
// does: this node lost that claim (the directory's verifier found it taken
// or fenced). An activation of the same address holding a newer claim is
// left alone. What the activation had queued fails late with a resendable
// not-the-owner verdict; it starts no further turn. StandDown does not wait
// for a turn in progress: that turn deactivates the hub and releases the
// claim when it returns, and the address's next activation on this node
// (a delivery may build one at once) builds only after that, so the two
// never run turns at the same time. Safe for concurrent use.
func (h *Host) StandDown(t ClaimToken) {
	h.mu.Lock()
	a := h.activations[t.Addr]
	if a == nil || a.claimToken().ID != t.ID {
		h.mu.Unlock()
		return
	}
	delete(h.activations, t.Addr)
	h.retiring[t.Addr] = a
	h.mu.Unlock()
	a.retire("its claim was lost")
}

// janitor collects idle activations every quarter of the idle timeout.
func (h *Host) janitor() {
	defer h.wg.Done()
	every := max(h.cfg.IdleTimeout/4, 5*time.Millisecond)
	t := h.cfg.Clock.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.Chan():
			h.collectIdle(h.cfg.Clock.Now().Add(-h.cfg.IdleTimeout))
		}
	}
}

// deactivateAll deactivates idle's activations, collectWorkers at a time.
func (h *Host) deactivateAll(idle []*activation) {
	if len(idle) < 2 {
		for _, a := range idle {
			a.deactivate()
		}
		return
	}
	// Each deactivation releases its claim (a KV round trip) and runs the
	// hub's Deactivate: one at a time, a node collecting 333 000 idle
	// activations took 116 s (BenchmarkScale). Distinct addresses, so
	// nothing orders them.
	work := make(chan *activation)
	var wg sync.WaitGroup
	for range min(collectWorkers, len(idle)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range work {
				a.deactivate()
			}
		}()
	}
	for _, a := range idle {
		work <- a
	}
	close(work)
	wg.Wait()
}

// collectWorkers is how many idle activations one collection deactivates
// at a time.
const collectWorkers = 32

// Drain stops accepting (new deliveries are refused ShuttingDown), waits
// until every accepted delivery is handled or ctx's deadline nears, fails
// whatever is still queued with a late ShuttingDown, flushes those late
// verdicts to the server and deactivates every activation. It keeps the
// generation's subscription until Close: a duplicate of a delivery this
// host accepted (a sender's re-send under the same ID) is still answered
// from the dedupe window — Accepted, the kept response, the failure it met
// — and anything else is refused ShuttingDown, so a re-send in the drain's
// wake is not handled a second time by the address's next owner (found by
// the nemesis: a re-send 1 ms after a drain began met no responders once
// the drained host had unsubscribed, and ran again on the successor). The
// last quarter of the time to ctx's deadline (at most 500 ms) is kept for
// failing and flushing, so every late verdict is on its way to its sender
// by the deadline, when the caller may close the connection or stop an
// embedded server. It returns context.DeadlineExceeded (or ctx's error) if
// not everything was handled. Safe to call more than once.
func (h *Host) Drain(ctx context.Context) error {
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
	// The tail of the deadline is kept for settling: the late verdicts of
	// whatever is still queued must reach their senders (published and
	// flushed to the server) before the caller's deadline, after which the
	// connection — and an embedded server — may go at once.
	wait := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		// Real clock: ctx's deadline is real time and bounds network I/O.
		wait, cancel = context.WithDeadline(ctx, deadline.Add(-settleReserve(time.Until(deadline))))
		defer cancel()
	}
	var werr error
	// Real clock: a poll for the host to go idle, bounded by ctx's real
	// deadline, not a timeout of its own (a fake clock would stall it).
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for h.busy() {
		select {
		case <-wait.Done():
			werr = ctx.Err()
			if werr == nil {
				werr = context.DeadlineExceeded // the reserve began: the same deadline, cut short
			}
		case <-tick.C:
			continue
		}
		break
	}
	grace := DefaultCloseWait
	if werr != nil {
		grace = drainGrace // the deadline passed: do not wait much longer
	}
	h.closeWithin(grace, ctx, true)
	return werr
}

// settleReserve is the part of a drain's remaining time kept for failing
// what is still queued and flushing those late verdicts: a quarter of it, at
// most 500 ms.
func settleReserve(remaining time.Duration) time.Duration {
	return min(max(remaining, 0)/4, 500*time.Millisecond)
}

// busy reports whether any activation has queued or running work.
func (h *Host) busy() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, a := range h.activations {
		a.mu.Lock()
		b := a.running || a.head < len(a.queue)
		a.mu.Unlock()
		if b {
			return true
		}
	}
	return false
}

// Close unsubscribes, fails every queued delivery with a late ShuttingDown,
// cancels builds and handlers, waits for them (at most DefaultCloseWait: a
// handler that ignores its ctx is abandoned and logged) and deactivates
// every activation. Safe to call more than once.
func (h *Host) Close() { h.closeWithin(DefaultCloseWait, nil, false) }

// closeWithin closes the host, waiting at most wait for handlers; if flush
// is set, the late verdicts of what was still queued are flushed to the
// server, bounded by flush's deadline (2 s without one), before the wait.
// With keepSub the subscription stays (Drain: duplicates are answered from
// the dedupe window until Close).
func (h *Host) closeWithin(wait time.Duration, flush context.Context, keepSub bool) {
	h.mu.Lock()
	h.draining = true
	var sub *nats.Subscription
	if !keepSub {
		sub, h.sub = h.sub, nil
	}
	all := make([]*activation, 0, len(h.activations))
	for addr, a := range h.activations {
		all = append(all, a)
		delete(h.activations, addr)
	}
	h.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	for _, a := range all {
		a.close(verdict.New(verdict.ReasonHubShuttingDown, "activation %s on %s deactivated before handling", a.addr, h.nodeID))
	}
	if flush != nil {
		fctx := flush
		if _, ok := fctx.Deadline(); !ok {
			var cancel context.CancelFunc
			fctx, cancel = context.WithTimeout(fctx, 2*time.Second)
			defer cancel()
		}
		if err := h.cfg.Conn.FlushWithContext(fctx); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			h.log.Warn("late verdicts of the drain not confirmed flushed", "err", err)
		}
	}
	h.cancel()
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait): // real clock: bounds the caller's shutdown (Drain's grace past its ctx's real deadline)
		h.log.Error("handlers or builds ignore their cancelled ctx; abandoning them", "waited", wait.String())
	}
	for _, a := range all {
		a.mu.Lock()
		stuck := a.running
		a.mu.Unlock()
		if stuck {
			continue // its hub is still in use: do not deactivate under it
		}
		a.deactivate() // a build still running deactivates it when it returns
	}
}
