package mesh

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/internal/plant"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// attempts runs the retry ladder in the delivery's lane: each attempt waits
// for its turn in the lane (lane.go), and an attempt refused out of order is
// sent again at once in the lane's new epoch without counting as a retry.
func (c *Client) attempts(ctx context.Context, deadline time.Time, d *Delivery, f *flight, t *laneTicket) (Receipt, error) {
	p := c.opts.retry
	b := p.backoff()
	var unplaced time.Time // since when no live node hosts the kind
	placing := false
	var last error
	var node subjects.NodeID
	sent := false // a leg of this delivery left: waiting again is not "waiting for its lane" only
	redirected := false
	unstaged := false // an event ended a staged wait: the attempts wait for their turn unstaged
	for attempt := 1; ; attempt++ {
		if attempt > 1 || sent {
			if n, ok := c.answered(f); ok {
				// Its response came although a leg's reply was lost: it
				// was accepted.
				return Receipt{ID: d.ID, Node: n, Attempts: attempt - 1}, nil
			}
			if werr := unsentVerdict(stageLeg, c.unsentFactsOf(ctx, deadline, nil), ""); werr != nil {
				r, err := attemptUnsent(d, werr, true, attempt, last)
				r.Node = node
				return r, err
			}
		}
		// A hot lane's legs are staged (prepared before their turn, then
		// published by the lane as the cursor reaches them): only when the
		// owner is known without blocking. Otherwise the attempt waits for
		// its turn and resolves then, one directory read per lane.
		var node0 subjects.NodeID
		staged := false
		if cr, ok := c.cfg.Resolver.(cachedResolver); ok && c.moving.Load() == nil && !unstaged {
			node0, staged = cr.Cached(d.To)
		}
		var err error
		if staged {
			node = node0
		} else {
			if err := c.awaitTurn(ctx, deadline, t); err != nil {
				return attemptUnsent(d, err, sent, attempt, last)
			}
			if err = c.awaitMove(ctx, deadline); err == nil {
				node, err = c.cfg.Resolver.Resolve(ctx, d.To)
				if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
					// The resolver gave up with the caller's context:
					// nothing was sent.
					if werr := unsentVerdict(stageResolve, c.unsentFactsOf(ctx, deadline, nil), "("+err.Error()+")"); werr != nil {
						err = werr
					}
				}
			}
		}
		if err == nil {
			var published bool
			published, err = c.leg(ctx, deadline, d, f, node, attempt, t, !staged)
			var lw *errLaneWait
			if errors.As(err, &lw) {
				return attemptUnsent(d, lw.err, sent, attempt, last)
			}
			if err == errStagedEvent {
				// Not an attempt: nothing was sent. It waits for its turn
				// unstaged from now on.
				unstaged = true
				attempt--
				continue
			}
			sent = sent || published
			if c.opts.tracer != nil {
				traceAttempt(ctx, attempt, node, err)
			}
			if err == nil {
				if !staged {
					c.learnOwner(d.To, node)
				}
				return Receipt{ID: d.ID, Node: node, Attempts: attempt}, nil
			}
			c.legEnded(t)
			if err == errRewound {
				attempt-- // nothing was sent: wait for its turn again
				continue
			}
			if errors.Is(err, verdict.ErrOutOfOrder) {
				// Not accepted because a leg ahead of it was not: sent
				// again at once in the lane's new epoch, same attempt.
				last = err
				attempt--
				continue
			}
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, verdict.ErrNotOwner) || errors.Is(err, verdict.ErrDeparted) {
				c.cfg.Resolver.Invalidate(d.To, node)
			}
			if !redirected && c.redirect(d.To, node, err) {
				// Refused "not the owner" naming the live owner: sent
				// there at once (once per delivery: two nodes naming
				// each other back off as any refusal does).
				redirected = true
				if attempt <= p.MaxRetries && !c.closing.Load() && time.Now().Before(deadline) { // real clock: a deadline
					last = fmt.Errorf("mesh: deliver %s to %s (attempt %d, node %s): %w", d.ID, d.To, attempt, node, err)
					continue
				}
			}
		} else {
			if c.opts.tracer != nil {
				traceAttempt(ctx, attempt, node, err) // nothing sent: no placement, directory down
			}
			c.legEnded(t)
		}
		if node.IsZero() {
			err = fmt.Errorf("mesh: deliver %s to %s (attempt %d): %w", d.ID, d.To, attempt, err)
		} else {
			err = fmt.Errorf("mesh: deliver %s to %s (attempt %d, node %s): %w", d.ID, d.To, attempt, node, err)
		}
		last = err
		resendable := verdict.IsResendable(err) || plant.On(plant.ResendTimeout) && errors.Is(err, context.DeadlineExceeded)
		if !resendable || attempt > p.MaxRetries || errors.Is(err, verdict.ErrDeadlineUnsent) {
			return Receipt{ID: d.ID, Node: node, Attempts: attempt}, err
		}
		if c.closing.Load() {
			return Receipt{ID: d.ID, Node: node, Attempts: attempt}, errors.Join(verdict.ErrClosing, err)
		}
		wait := b.NextBackOff()
		if errors.Is(err, verdict.ErrNoPlacement) {
			// Nothing was sent: a node hosting the kind may join, but a
			// typo in a kind must not cost the whole ladder.
			now := c.opts.clock.Now()
			if !placing {
				if d.placer != nil && c.opts.placementWait > 0 && !d.placer.unplaced() {
					return Receipt{ID: d.ID, Attempts: attempt}, fmt.Errorf("%w (no placement wait left for this caller on the ingress: not waited for)", err)
				}
				unplaced, placing = now, true
			}
			left := c.opts.placementWait - now.Sub(unplaced)
			if left <= 0 {
				return Receipt{ID: d.ID, Attempts: attempt}, err
			}
			wait = min(wait, left)
		}
		if berr := c.backOff(ctx, deadline, f, node, wait); berr != nil {
			// Attempt attempt+1 never left; attempt's leg may have.
			return attemptUnsent(d, berr, true, attempt+1, err)
		}
		c.retries.Add(1)
	}
}

// learnOwner tells the resolver that node accepted a delivery to addr
// (ownerLearner), so the next delivery finds it cached and is staged: after
// a placement (a cold address, or one whose owner departed) the sender
// reads the directory once per address, not once per delivery until the
// new claim can be read.
func (c *Client) learnOwner(addr subjects.Address, node subjects.NodeID) {
	if l, ok := c.cfg.Resolver.(ownerLearner); ok {
		l.Learn(addr, node)
	}
}

// redirect reports whether err refused addr at node "not the owner" naming
// another generation, which the resolver took as addr's owner (Redirector).
func (c *Client) redirect(addr subjects.Address, node subjects.NodeID, err error) bool {
	r, ok := c.cfg.Resolver.(Redirector)
	if !ok || !errors.Is(err, verdict.ErrNotOwner) {
		return false
	}
	var ve *verdict.Error
	if !errors.As(err, &ve) {
		return false
	}
	owner, perr := subjects.ParseNodeID(ve.Node)
	if perr != nil || owner == node {
		return false
	}
	return r.Redirect(addr, owner)
}

// backOff waits d before the next attempt, bounded by deadline. It is
// indexed under the owner the last attempt went to: that owner's departure
// cuts it short (the next attempt re-resolves at once). It returns nil to go
// on, or unsentVerdict's answer: verdict.ErrClosing, the caller's
// context.Canceled, or verdict.ErrDeadlineUnsent.
func (c *Client) backOff(ctx context.Context, deadline time.Time, f *flight, node subjects.NodeID, d time.Duration) error {
	sctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// A departure known before the back-off does not cut it short: the
	// last attempt met it already, and the next re-resolves anyway. Nor
	// does a repeated notice of it (one departure is announced by several
	// events: the advisory, the expiry, the takeover): a flight backing off
	// from a node known gone is not indexed under it, so that each notice
	// does not spend an attempt of the ladder at once.
	at := node
	if !node.IsZero() && c.knownGone(node) {
		at = subjects.NodeID{}
	}
	c.address(f, at, phaseWaiting, false)
	defer c.unindex(f)
	f.mu.Lock()
	f.backoff = true
	if f.ev == evNone {
		f.cancel = cancel
		f.mu.Unlock()
		t := c.opts.clock.NewTimer(d)
		select { // why it woke is read from the facts below
		case <-t.Chan():
		case <-sctx.Done():
		}
		t.Stop()
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	f.cancel = nil
	switch f.ev {
	case evDeparted:
		return nil // re-resolve now
	case evClosing:
		return verdict.ErrClosing
	}
	// Otherwise the facts decide, not the sleep's error: nil (the back-off
	// is over) unless the client stopped, the caller cancelled, or the
	// deadline passed.
	return unsentVerdict(stageBackOff, c.unsentFactsOf(ctx, deadline, nil), "")
}

// answered reports whether a response for Request flight f arrived while
// its legs' replies did not, and from which node.
func (c *Client) answered(f *flight) (subjects.NodeID, bool) {
	if !f.request {
		return subjects.NodeID{}, false
	}
	f.mu.Lock()
	n := f.node
	ok := c.takeEarlyLocked(f, n)
	f.mu.Unlock()
	if !ok {
		return subjects.NodeID{}, false
	}
	c.address(f, n, phaseAccepted, true)
	f.mu.Lock()
	f.wakeLocked()
	f.mu.Unlock()
	return n, true
}

// leg sends one attempt and decodes the verdict of its reply; published
// says whether the leg left. It is called holding t's lane cursor and
// passes it on as soon as the leg is published (lane.go). On Accepted a
// Request's flight stays indexed under node, in phaseAccepted; otherwise
// the flight leaves the index.
func (c *Client) leg(ctx context.Context, deadline time.Time, d *Delivery, f *flight, node subjects.NodeID, attempt int, t *laneTicket, held bool) (published bool, _ error) {
	lm := getLegMsg()
	defer putLegMsg(lm)
	lm.msg.Subject = c.deliverySubject(t.l, d, node)
	lm.msg.Data = d.Payload
	lm.set(hdrID, d.ID)
	lm.set(hdrAccept, hub.AcceptCompact) // read either form (legDone)
	if attempt > 1 {
		lm.set(hdrAttempt, strconv.Itoa(attempt))
	}
	lm.set(hdrAnswerTo, c.answerTo())
	if d.Type != "" {
		lm.set(hdrType, d.Type)
	}
	if d.From != "" {
		lm.set(hdrFrom, string(d.From))
	}
	if f.request {
		lm.set(hdrExpectResponse, "true")
	}
	if d.caller != "" {
		lm.set(hdrCaller, d.caller)
	}
	if d.chain != "" {
		lm.header().Set(hub.HeaderChain, d.chain)
	}
	if d.reminder != "" {
		h := lm.header()
		h.Set(hub.HeaderReminder, d.reminder)
		h.Set(hub.HeaderReminderDue, d.due)
	}
	if c.opts.tracer != nil {
		meshtrace.Inject(ctx, lm.header()) // the delivery's span: the same across its attempts
	}
	c.address(f, node, phaseWaiting, true)
	accepted := false
	defer func() {
		if !accepted {
			c.unindex(f)
		}
	}()
	w := c.replies.register()
	lm.msg.Reply = w.subject
	var err error
	var reply *nats.Msg
	if !held {
		// Staged: the lane publishes it when the cursor reaches it.
		s := &stagedLeg{ctx: ctx, deadline: deadline, f: f, lm: lm, w: w}
		sent, handoff, perr, werr := c.stage(t, s)
		switch {
		case sent:
			c.observeInFlight(c.inFlight.Load())
			if perr == nil {
				published = true
				reply, err = c.awaitReply(ctx, f, w, s.wake)
			} else {
				err = publishFailed(perr)
			}
			c.replies.forget(w)
			c.observeInFlight(c.inFlight.Add(-1))
			<-c.sem
			return c.legEnd(t, d, f, node, published, reply, err, &accepted)
		case !handoff:
			c.replies.forget(w)
			return false, werr
		}
		// Handed back: t holds the cursor; send it as any held leg.
	}
	// A slot is charged from the moment the leg is sent (DESIGN §4).
	select {
	case c.sem <- struct{}{}:
	default:
		if err := c.waitSlot(ctx, deadline, f); err != nil {
			c.replies.forget(w)
			return false, err
		}
	}
	legTimeout := min(c.opts.legTimeout, time.Until(deadline)) // real clock: bounds a NATS request
	f.mu.Lock()
	// Nothing has left yet: an event, a caller's deadline that passed (or
	// its cancellation) before this point sends nothing — a leg sent after
	// the deadline would only time out, reading "the callee may hold it".
	fx := c.unsentFactsOf(ctx, deadline, f.causeLocked())
	fx.stopped = false // a stopping client sends what it holds (Close waits for it)
	fx.deadline = fx.deadline || legTimeout <= 0
	if err := unsentVerdict(stageLeg, fx, ""); err != nil {
		f.mu.Unlock()
		<-c.sem
		c.replies.forget(w)
		return false, err
	}
	// An event (departure, link drop, closing) ends the wait for the reply
	// through f.wake: no per-leg context.
	f.phase, f.cancel = phaseSent, nil
	wake := f.wake
	f.mu.Unlock()

	n := c.inFlight.Add(1)
	for peak := c.peakInFlight.Load(); n > peak && !c.peakInFlight.CompareAndSwap(peak, n); peak = c.peakInFlight.Load() {
	}
	c.observeInFlight(n)
	w.timer.Reset(legTimeout) // the leg's own timeout, on the slot's pooled timer
	err = c.publishInLane(t, lm)
	if err == nil {
		published = true
		reply, err = c.awaitReply(ctx, f, w, wake)
	} else if err != errRewound {
		err = publishFailed(err)
	}
	c.replies.forget(w)
	c.observeInFlight(c.inFlight.Add(-1))
	<-c.sem
	return c.legEnd(t, d, f, node, published, reply, err, &accepted)
}

// decodeReply reads a leg's reply: a compact Accepted (hub.HeaderAccept:
// no headers, the answer key as payload), or the header form of any
// verdict (verdict.Decode). It returns the accepting generation's answer
// key (empty if the reply carries none; it may share reply's payload:
// read it, copy it to keep it) and nil for Accepted, or the verdict
// error. The accepting node is the one the leg was sent to: only that
// generation holds the delivery subject.
func decodeReply(reply *nats.Msg) (key []byte, err error) {
	if len(reply.Header) == 0 && len(reply.Data) > 0 && reply.Data[0] == hub.CompactAccepted {
		// hub.ParseCompactAccepted without the key's copy: the key is
		// read (answerKeys.learn compares it with the one it knows) and
		// copied only when it is new.
		return reply.Data[1:], nil
	}
	if _, err := verdict.Decode(reply.Header); err != nil {
		return nil, err
	}
	return []byte(reply.Header.Get(hub.HeaderAnswerKey)), nil
}

// legEnd is legDone, then the receiver's window grant in the reply of an
// epoch's first leg is applied (outside the flight's lock: lock order is a
// lane's mutex, then a flight's).
func (c *Client) legEnd(t *laneTicket, d *Delivery, f *flight, node subjects.NodeID, published bool, reply *nats.Msg, err error, accepted *bool) (bool, error) {
	published, err = c.legDone(d, f, node, published, reply, err, accepted)
	if err == nil && reply != nil && t.first {
		c.granted(t, reply)
	}
	return published, err
}

// legDone decides the verdict of a leg that was published (or whose
// publish failed) from the facts on f (legVerdict) and applies it: the
// flight's phase, its early answers, the answers given up. *accepted is
// set when a Request's flight stays indexed as accepted.
func (c *Client) legDone(d *Delivery, f *flight, node subjects.NodeID, published bool, reply *nats.Msg, err error, accepted *bool) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fx := legFacts{published: published, reply: reply, err: err, event: f.causeLocked(), timedOut: f.timeout}
	if err != nil && f.request {
		// Its genuine answer may have come although the reply was lost
		// (node's answer key was known from an earlier acceptance).
		fx.answered = c.takeEarlyLocked(f, node)
	}
	out, key, verr := legVerdict(fx)
	switch out {
	case legAccepted:
		c.learned(node, key)
		if c.gaveUp.n.Load() > 0 {
			c.gaveUp.accepted(d.ID, node) // accepted after all: its answers are taken again
		}
		*accepted = f.request
		if f.request {
			f.phase = phaseAccepted
			if f.ev == evMoved {
				// The owner's connection moved with the leg in flight, yet
				// its reply arrived: the acceptance was not lost, but the
				// response may be; the move stays recorded, so the awaited
				// request is re-sent at once (awaitResponse).
				f.evErr = nil
			}
			c.takeEarlyLocked(f, node)
		} else {
			f.phase = phaseDone
			c.settleEarlyLocked(f, true)
		}
		return true, nil
	case legAnswered:
		*accepted = true
		f.phase = phaseAccepted
		return published, nil
	case legRefused:
		f.phase = phaseWaiting // the callee holds nothing
		c.settleEarlyLocked(f, false)
		return true, verr
	case legEvent:
		f.phase = phaseWaiting
		if published {
			// Given up without its acceptance: node's answers for this
			// delivery are not to be taken from now on.
			c.gaveUp.add(d.ID, node)
		}
		c.settleEarlyLocked(f, false)
		return published, verr
	}
	f.phase = phaseWaiting
	// A timeout leaves the delivery with node (it may hold it): what it
	// answered stands. No responders, a failed publish, the caller's
	// cancellation: node holds nothing of this leg.
	c.settleEarlyLocked(f, out == legTimedOut)
	if errors.Is(verr, nats.ErrMaxPayload) {
		return false, payloadTooLarge(len(d.Payload), c.cfg.Conn.MaxPayload())
	}
	return published, verr
}

// publishFailed is the verdict of a leg whose publish returned err: nothing
// of it was sent (a publish that fails leaves nothing the server can
// deliver). A fault of the message itself (too large, a bad subject) stays
// terminal; anything else is this sender's own link failing — nats.go
// returns a socket's raw error ("write: broken pipe") from a publish that
// flushes — and is resendable after the reconnect, the same delivery ID,
// as nats.ErrDisconnected (DESIGN §3). It is never a timeout: the callee
// holds nothing.
func publishFailed(err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrInvalidMsg),
		errors.Is(err, nats.ErrHeadersNotSupported), errors.Is(err, nats.ErrInvalidConnection):
		return err
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, nats.ErrConnectionDraining):
		return fmt.Errorf("publishing the leg (nothing was sent): %w", err) // resendable already (verdict)
	}
	return fmt.Errorf("own NATS link failed publishing the leg, nothing was sent: %w: %w", nats.ErrDisconnected, err)
}

// awaitReply waits for the reply to a published leg: the reply (NATS no
// responders as nats.ErrNoResponders), or context.DeadlineExceeded when
// w's timer (the leg timeout) fires or the caller's deadline passes, or
// ctx's cancellation, or context.Canceled when an event is recorded on f
// (wake closed; the caller reads the event's verdict under f.mu). A reply
// already there when an event is recorded is the fact; a deadline that
// passed before the event was recorded is the fact too (flight.timedOut),
// however late this goroutine noticed either.
func (c *Client) awaitReply(ctx context.Context, f *flight, w *legWait, wake <-chan struct{}) (*nats.Msg, error) {
	for {
		select {
		case m := <-w.ch:
			return replyOf(m)
		case <-wake:
			f.mu.Lock()
			ev := f.ev
			f.mu.Unlock()
			if ev == evNone {
				wake = nil // woken by an answer, not an event: the reply is still awaited
				continue
			}
			select {
			case m := <-w.ch:
				return replyOf(m)
			case fired := <-w.timer.C:
				if f.timedOut(fired) {
					return nil, context.DeadlineExceeded
				}
			default:
				if dl, ok := ctx.Deadline(); ok && errors.Is(ctx.Err(), context.DeadlineExceeded) && f.timedOut(dl) {
					return nil, context.DeadlineExceeded
				}
			}
			return nil, context.Canceled
		case <-ctx.Done():
			err := ctx.Err()
			if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) {
				f.timedOut(dl) // else an event came first: legDone reads it
			}
			return nil, err
		case fired := <-w.timer.C:
			f.timedOut(fired)
			return nil, context.DeadlineExceeded
		}
	}
}

func replyOf(m *nats.Msg) (*nats.Msg, error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	return m, nil
}

// waitSlot waits for an in-flight slot. The verdict of a wait that ends
// without one is unsentVerdict's: the event recorded on f, the client
// stopped, the caller's cancellation, else the deadline.
func (c *Client) waitSlot(ctx context.Context, deadline time.Time, f *flight) error {
	timer := deadlineTimer(deadline) // not a context per wait
	defer releaseTimer(timer)
	f.mu.Lock()
	wake := f.wake
	f.mu.Unlock()
	select {
	case c.sem <- struct{}{}:
		return nil // an event meanwhile is read by the caller
	case <-wake:
	case <-ctx.Done():
	case <-timer.C:
	}
	if err := unsentVerdict(stageSlot, c.unsentFactsOf(ctx, deadline, flightEvent(f)), ""); err != nil {
		return err
	}
	// No fact holds: only the timer wakes the wait without one, and it
	// fires at the deadline.
	return unsentVerdict(stageSlot, unsentFacts{deadline: true}, "")
}
