package mesh

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/natsmesh/natsmesh/verdict"
)

// waitStage names what a delivery's attempt was waiting for when the wait
// ended with nothing of it sent; the verdict's message says it.
type waitStage string

const (
	stageLane    waitStage = "while waiting for the lane"
	stageSlot    waitStage = "while waiting for an in-flight slot"
	stageMove    waitStage = "while the connection moved to another server"
	stageLeg     waitStage = "before the leg was sent"
	stageResolve waitStage = "while resolving the owner"
	stageBackOff waitStage = "while backing off before the next attempt"
)

// unsentFacts are what is known when a wait of an attempt ends with nothing
// of that attempt sent. They are read after the wait, never taken from the
// channel that woke it: two facts can be ready at once, and a select picks
// among ready channels at random.
type unsentFacts struct {
	event    error // the verdict of an event recorded on the flight (flight.causeLocked): a departure, closing, the own link's drop
	stopped  bool  // the client stopped (Close, the end of Drain)
	ctxErr   error // the caller's context's error, if it ended
	deadline bool  // the attempt's deadline passed (the caller's, or the delivery's own earlier one)
}

// unsentVerdict is the sender's one mapping from the end of a wait in which
// nothing of an attempt was sent to that attempt's verdict (DESIGN §3–§4).
// The facts are taken in a fixed order, whichever goroutine noticed first:
//
//  1. an event recorded on the flight: its own verdict (a departure is
//     resendable, closing is ShuttingDown);
//  2. the client stopped: verdict.ErrClosing (ShuttingDown, resendable);
//  3. the caller cancelled: its context.Canceled, wrapped (Failed: the
//     caller chose, and nothing is re-sent on its behalf);
//  4. the deadline passed: verdict.ErrDeadlineUnsent (resendable,
//     Unavailable, never a timeout: no callee holds the delivery).
//
// detail, if not empty, is appended to the deadline's message. It returns
// nil when no fact ends the wait (a wake-up that decides nothing). It is
// the only place in the sender that builds verdict.ReasonDeadlineUnsent.
func unsentVerdict(stage waitStage, fx unsentFacts, detail string) error {
	switch {
	case fx.event != nil:
		return fx.event
	case fx.stopped:
		return verdict.ErrClosing
	case errors.Is(fx.ctxErr, context.Canceled):
		return fmt.Errorf("cancelled %s: %w", stage, fx.ctxErr)
	case fx.deadline || fx.ctxErr != nil:
		msg := "deadline passed " + string(stage)
		if detail != "" {
			msg += " " + detail
		}
		return &verdict.Error{Reason: verdict.ReasonDeadlineUnsent, Message: msg}
	}
	return nil
}

// unsentFactsOf reads the facts of unsentFacts for a wait bounded by ctx
// and deadline; event is the flight's recorded event's verdict, read by
// the caller under the flight's lock (nil when the wait has no flight or
// none was recorded).
func (c *Client) unsentFactsOf(ctx context.Context, deadline time.Time, event error) unsentFacts {
	fx := unsentFacts{event: event, ctxErr: ctx.Err()}
	select {
	case <-c.stop:
		fx.stopped = true
	default:
	}
	// The deadline is a wall-clock instant (the caller's context's, or
	// one computed from time.Now): compared with the wall clock, not the
	// retry ladder's injectable one.
	fx.deadline = !deadline.IsZero() && !time.Now().Before(deadline) // real clock: see above
	return fx
}

// flightEvent returns the verdict of the event recorded on f, if any
// (nil f: none). It takes f.mu.
func flightEvent(f *flight) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.causeLocked()
}

// attemptUnsent is the verdict of a delivery whose attempt ended unsent with
// werr (unsentVerdict's answer for its wait): sent says whether an earlier
// attempt's leg left, last is that attempt's failure. Nothing of this
// attempt left, so the delivery's verdict is the earlier attempts' plus
// why this one did not go: closing or the caller's cancellation joined
// with last; a deadline names the attempt and keeps last as text only, so
// that last's own class does not mask the fact that nothing was sent.
func attemptUnsent(d *Delivery, werr error, sent bool, attempt int, last error) (Receipt, error) {
	if !sent {
		return Receipt{ID: d.ID}, fmt.Errorf("mesh: deliver %s: %w", d.ID, werr)
	}
	r := Receipt{ID: d.ID, Attempts: attempt - 1}
	switch {
	case errors.Is(werr, verdict.ErrClosing):
		return r, errors.Join(verdict.ErrClosing, last)
	case errors.Is(werr, context.Canceled):
		return r, errors.Join(werr, last)
	case errors.Is(werr, verdict.ErrDeadlineUnsent):
		return r, unsent(d, attempt, last)
	}
	return r, errors.Join(werr, last) // an event's verdict (a departure): resendable as it is
}

// unsent is the verdict of a delivery whose deadline passed before its
// attempt could be sent: resendable, Unavailable, never a timeout (no
// callee holds it). last, the previous attempt's failure, is kept as text
// only.
func unsent(d *Delivery, attempt int, last error) error {
	detail := ""
	if last != nil {
		detail = "(last failure: " + last.Error() + ")"
	}
	stage := waitStage(fmt.Sprintf("before attempt %d was sent", attempt))
	return fmt.Errorf("mesh: deliver %s to %s: %w", d.ID, d.To, unsentVerdict(stage, unsentFacts{deadline: true}, detail))
}
