package mesh

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/verdict"
)

// The sender's verdicts are decided in this file only, one function per
// phase of a flight, each from facts read after its wait ended — never
// from which channel woke the wait (DESIGN §3, §4):
//
//	nothing of the attempt sent (lane, slot, move, resolve, back-off)  unsentVerdict
//	a leg sent (or its publish failed), its reply awaited              legVerdict
//	accepted, a Request's response awaited                             responseVerdict
//
// The tables in unsent_test.go and verdicts_test.go pin each.

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

// legOutcome is what a leg's verdict decided, for the sender's bookkeeping
// (the flight's phase, its early answers, the answers given up).
type legOutcome uint8

const (
	legAccepted legOutcome = iota // the reply accepted it
	legAnswered                   // a Request's genuine answer came from the addressed node although the reply was lost: accepted
	legRefused                    // the reply refused it: the callee holds nothing
	legEvent                      // an event recorded on the flight came first: its verdict (departed, own link dropped, closing, moved)
	legTimedOut                   // the leg's own timeout (or the caller's deadline) came first: the callee may hold it
	legNotHeld                    // no responders, a failed publish, the caller's cancellation: the callee holds nothing of this leg
)

// legFacts are what is known when the wait for a leg's reply ends. Like
// unsentFacts, they are read after the wait, under the flight's lock —
// never taken from the channel that woke it.
type legFacts struct {
	published bool      // the leg left (a publish that failed leaves nothing)
	reply     *nats.Msg // the leg's reply, if the wait ended with one
	err       error     // else what ended the wait: the leg's timeout, the caller's context, an event's wake, no responders, a failed publish
	answered  bool      // a Request's genuine answer came from the addressed node although the reply was lost (takeEarlyLocked)
	event     error     // the verdict of the event recorded on the flight (flight.causeLocked), nil if none
	timedOut  bool      // the leg's deadline passed before any event was recorded (flight.timeout)
}

// legVerdict is the sender's one mapping from the end of a leg's wait to
// that leg's verdict (DESIGN §3): the facts are taken in a fixed order,
// whichever goroutine noticed first:
//
//  1. a reply is the fact, whatever else happened meanwhile: Accepted (key
//     is the accepting generation's answer key, "" if it sent none), or
//     the verdict it carries (a refusal: the callee holds nothing);
//  2. a Request's genuine answer from the addressed node although the
//     reply was lost: accepted;
//  3. an event recorded before the leg's deadline passed: the event's
//     verdict (a departure or the own link's drop before acceptance is
//     resendable; closing is ShuttingDown);
//  4. otherwise the wait's own error: a timeout (legTimedOut: never
//     re-sent, the callee may hold it) when the leg was published, else no
//     responders, a failed publish or the caller's cancellation
//     (legNotHeld: nothing of this leg is held).
//
// It decides nothing else and changes nothing (legDone applies the
// outcome).
func legVerdict(fx legFacts) (out legOutcome, key []byte, err error) {
	switch {
	case fx.err == nil:
		key, err = decodeReply(fx.reply)
		if err != nil {
			return legRefused, nil, err
		}
		return legAccepted, key, nil
	case fx.answered:
		return legAnswered, nil, nil
	case fx.event != nil && !fx.timedOut:
		return legEvent, nil, fx.event
	case fx.published && timedOut(fx.err):
		return legTimedOut, nil, fx.err
	}
	return legNotHeld, nil, fx.err
}

// responseOutcome is what an awaited response's verdict decided.
type responseOutcome uint8

const (
	responseAnswered responseOutcome = iota // the response (or the late verdict in its place) arrived: err is the late verdict, if any
	responseEvent                           // an event recorded before the deadline ended the wait: its verdict (outcome unknown, or resendable for an Idempotent delivery)
	responseTimedOut                        // the deadline passed, or the caller cancelled, first: the callee may hold it
)

// responseFacts are what is known when the wait for an accepted Request's
// response ends, read under the flight's lock.
type responseFacts struct {
	answer   *answer   // the genuine response or late verdict that arrived, nil if none
	event    error     // the verdict of the event recorded on the flight in its accepted phase (flight.causeLocked)
	eventAt  time.Time // when it was recorded
	ctxErr   error     // the caller's context's error, if it ended
	expired  bool      // the request's own deadline timer fired (the caller's context has none)
	deadline time.Time // the deadline that bounds the wait: the context's, else the request's
}

// responseVerdict is the sender's one mapping from the end of the wait for
// an accepted Request's response to the Request's verdict (DESIGN §3–§4),
// in a fixed order: an answer that arrived is the fact; then an event
// recorded before the deadline passed (an event recorded after it leaves
// the timeout: never re-sent, even for an Idempotent delivery); then the
// caller's context's error, or context.DeadlineExceeded for the request's
// own deadline. A response's payload is the answer's.
func responseVerdict(fx responseFacts) (responseOutcome, error) {
	deadlineEnded := fx.expired || errors.Is(fx.ctxErr, context.DeadlineExceeded)
	switch {
	case fx.answer != nil:
		return responseAnswered, fx.answer.err
	case fx.event != nil && !(deadlineEnded && fx.eventAt.After(fx.deadline)):
		return responseEvent, fx.event
	case fx.ctxErr != nil:
		return responseTimedOut, fx.ctxErr
	}
	return responseTimedOut, context.DeadlineExceeded // the request timeout: the callee may hold it
}
