package mesh

import (
	"context"
	"errors"
	"time"
)

// A staged leg is a leg prepared in full before its ticket holds the cursor
// (message, reply slot, flight indexed under its owner), so that whoever
// passes the cursor on — the leg ahead that was just published, a settled
// ticket, a broken epoch — publishes it at once on its caller's behalf
// (pokeLocked), instead of waking the caller's goroutine to do it: a lane's
// legs then leave back to back. What decides a staged leg's fate is its
// state, under the lane's mutex: published by the lane (stagedSent: its
// caller awaits the reply), handed back to its caller (stagedHandoff: no
// in-flight slot was free, or a fact — the owner departed, the deadline,
// the caller's cancellation — must be reported as for any leg not sent),
// or withdrawn by its caller before either (its wait ended: nothing sent).
type stagedLeg struct {
	ctx      context.Context
	deadline time.Time
	f        *flight
	lm       *legMsg
	w        *legWait
	state    stagedState
	err      error         // stagedSent: the publish's error (nil: it left)
	wake     chan struct{} // stagedSent: f.wake as the leg was sent
}

type stagedState uint8

const (
	stagedWaiting stagedState = iota // for the cursor
	stagedSent                       // published by the lane (or its publish failed): err says which
	stagedHandoff                    // the lane declined it: its caller holds the cursor and sends it itself
)

// publishStagedLocked publishes t's staged leg, t being the lane's cursor
// within the window: it takes an in-flight slot if one is free, checks
// under the flight's lock that nothing forbids sending (an event, the
// deadline, the caller's cancellation), arms the leg's timeout and
// publishes. It reports false, having done nothing, when it may not; the
// caller hands the leg back. Called with l.mu held (lock order: a lane's
// mutex, then a flight's).
func (c *Client) publishStagedLocked(l *lane, t *laneTicket) bool {
	s := t.leg
	select {
	case c.sem <- struct{}{}:
	default:
		return false // its caller waits for a slot itself
	}
	f := s.f
	f.mu.Lock()
	legTimeout := min(c.opts.legTimeout, time.Until(s.deadline)) // real clock: bounds a NATS request
	if legTimeout <= 0 || s.ctx.Err() != nil || f.causeLocked() != nil {
		f.mu.Unlock()
		<-c.sem
		return false
	}
	f.phase, f.cancel = phaseSent, nil
	s.wake = f.wake
	f.mu.Unlock()
	n := c.inFlight.Add(1)
	for peak := c.peakInFlight.Load(); n > peak && !c.peakInFlight.CompareAndSwap(peak, n); peak = c.peakInFlight.Load() {
	}
	s.w.timer.Reset(legTimeout)
	s.err = c.publishLocked(l, t, s.lm)
	s.state = stagedSent
	return true
}

// errLaneWait wraps why a staged leg's wait for its lane ended before it
// was sent (the caller's cancellation, its deadline, the client closing):
// the same facts awaitTurn reports.
type errLaneWait struct{ err error }

func (e *errLaneWait) Error() string { return e.err.Error() }
func (e *errLaneWait) Unwrap() error { return e.err }

// stage offers s, t's prepared leg, to its lane and waits until the lane
// published it (sent: its caller awaits the reply; perr is the publish's
// error), or handed it back (handoff: t holds the cursor, its caller sends
// the leg itself), or the wait ended first: an event recorded on the
// flight (err: its verdict), the caller's cancellation or deadline, or the
// client closing (err: *errLaneWait) — then nothing was sent and t is
// parked in its place.
func (c *Client) stage(t *laneTicket, s *stagedLeg) (sent, handoff bool, perr, err error) {
	l := t.l
	l.mu.Lock()
	if t.state == ticketParked {
		t.state = ticketPending
	}
	t.leg, s.state = s, stagedWaiting
	c.pokeLocked(l)
	if sent, handoff, perr := c.stagedLocked(l, t); sent || handoff {
		l.mu.Unlock()
		return sent, handoff, perr, nil
	}
	l.mu.Unlock()
	s.f.mu.Lock()
	fwake := s.f.wake
	s.f.mu.Unlock()
	timer := deadlineTimer(s.deadline)
	defer releaseTimer(timer)
	for {
		select {
		case <-t.wake:
			l.mu.Lock()
			if sent, handoff, perr := c.stagedLocked(l, t); sent || handoff {
				l.mu.Unlock()
				return sent, handoff, perr, nil
			}
			l.mu.Unlock()
			continue
		case <-fwake:
			s.f.mu.Lock()
			ev := s.f.ev
			s.f.mu.Unlock()
			if ev == evNone {
				fwake = nil // woken by an answer, not an event
				continue
			}
			err = errEvent
		case <-s.ctx.Done():
			err = c.laneWaitEnded(s)
		case <-timer.C:
			err = c.laneWaitEnded(s)
		case <-c.stop:
			err = c.laneWaitEnded(s)
		}
		l.mu.Lock()
		if sent, handoff, perr := c.stagedLocked(l, t); sent || handoff {
			// The lane took it (or handed it back) first: that is the fact.
			l.mu.Unlock()
			return sent, handoff, perr, nil
		}
		t.leg = nil
		t.state = ticketParked
		c.pokeLocked(l)
		l.mu.Unlock()
		if err == errEvent {
			err = errStagedEvent // nothing was sent: the caller waits its turn unstaged
		}
		return false, false, nil, err
	}
}

// laneWaitEnded is the verdict of a staged leg's wait for its lane that
// its context, its deadline's timer or the client's stop ended:
// unsentVerdict's, from the facts (the flight's events are the fwake
// case's), as awaitTurn's.
func (c *Client) laneWaitEnded(s *stagedLeg) error {
	err := unsentVerdict(stageLane, c.unsentFactsOf(s.ctx, s.deadline, nil), "")
	if err == nil {
		err = unsentVerdict(stageLane, unsentFacts{deadline: true}, "") // the timer fires at the deadline
	}
	return &errLaneWait{err}
}

// errEvent marks a staged wait ended by an event on the flight.
var errEvent = errors.New("mesh: event")

// errStagedEvent: an event on the flight (its owner departed, moved) ended
// a staged leg's wait for its turn before anything was sent. It is not an
// attempt: the caller waits for its turn unstaged and resolves then, as a
// leg whose owner is not cached does (a departure meets only the legs sent
// to it and the one holding the cursor, never a deep lane's waiters).
var errStagedEvent = errors.New("mesh: staged leg's owner changed before it was sent")

// stagedLocked reads t's staged leg's fate: published by the lane (sent,
// with the publish's error), or handed back to t's caller, which then holds
// the cursor if it may (else the leg waits again, staged). Called with l.mu
// held.
func (c *Client) stagedLocked(l *lane, t *laneTicket) (sent, handoff bool, perr error) {
	s := t.leg
	switch s.state {
	case stagedSent:
		t.leg = nil
		return true, false, s.err
	case stagedHandoff:
		if l.mayHoldLocked(t, l.window) {
			t.leg = nil
			t.state = ticketHeld
			return false, true, nil
		}
		s.state = stagedWaiting
		c.pokeLocked(l)
		if s.state == stagedSent {
			t.leg = nil
			return true, false, s.err
		}
	}
	return false, false, nil
}
