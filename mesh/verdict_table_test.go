package mesh

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// flightEventIn is the verdict of event ev recorded on a flight in phase p
// (idempotent or not), read as the goroutine working on the flight reads it
// (causeLocked): the table's events are the real ones, not copies.
func flightEventIn(p phase, ev event, idempotent bool) (time.Time, error) {
	owner := subjects.NodeID{Name: "o", Generation: 7}
	f := &flight{id: "d1", idempotent: idempotent, request: true, node: owner, phase: p, wake: make(chan struct{})}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev == evNone {
		return time.Time{}, nil
	}
	if ev == evMoved {
		f.evErr = fmt.Errorf("owner's connection moved with the leg in flight: %w", nats.ErrDisconnected)
	}
	f.recordLocked(ev, "test")
	return f.evAt, f.causeLocked()
}

// ladderOf names an error by the fact it reports, for the tables below:
// "accepted" for nil, else its reason (verdict.ReasonOf), or, for the
// facts no reason names, "disconnected", "cancelled", "timeout".
func ladderOf(err error) string {
	switch {
	case err == nil:
		return "accepted"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, nats.ErrNoResponders):
		return "no-responders"
	case verdict.ReasonOf(err) != verdict.ReasonUnknown:
		return verdict.ReasonOf(err).String()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timeout"
	case errors.Is(err, nats.ErrDisconnected):
		return "disconnected"
	case errors.Is(err, nats.ErrMaxPayload):
		return "max-payload"
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining):
		return "closing"
	}
	return "?" + err.Error()
}

// wantLadder is the ladder each fact must sit on (DESIGN §3): transient,
// resendable, Classify.
var wantLadder = map[string]struct {
	transient, resendable bool
	class                 verdict.ErrorType
}{
	"departed":          {true, true, verdict.ShuttingDown},
	"disconnected":      {true, true, verdict.ShuttingDown},
	"closing":           {true, true, verdict.ShuttingDown},
	"no-responders":     {true, true, verdict.ShuttingDown},
	"not-owner":         {true, true, verdict.ShuttingDown},
	"shutting-down":     {true, true, verdict.ShuttingDown},
	"outcome-unknown":   {true, false, verdict.Failed},
	"timeout":           {true, false, verdict.Failed},
	"cancelled":         {false, false, verdict.Failed},
	"storm-breaker":     {false, false, verdict.Ignored},
	"bad-request":       {false, false, verdict.Failed},
	"max-payload":       {false, false, verdict.Failed},
	"activation-failed": {false, false, verdict.Unavailable},
}

func checkLadder(t *testing.T, name string, err error, want string) {
	t.Helper()
	if got := ladderOf(err); got != want {
		t.Errorf("%s: verdict %v (%s), want %s", name, err, got, want)
		return
	}
	if err == nil {
		return
	}
	l, ok := wantLadder[want]
	if !ok {
		t.Fatalf("%s: no ladder for %q", name, want)
	}
	if verdict.IsTransient(err) != l.transient || verdict.IsResendable(err) != l.resendable || verdict.Classify(err) != l.class {
		t.Errorf("%s: %v is transient %v resendable %v %v, want %v %v %v", name, err,
			verdict.IsTransient(err), verdict.IsResendable(err), verdict.Classify(err), l.transient, l.resendable, l.class)
	}
}

// TestLegVerdictTable pins the verdict of a leg's end (legVerdict) for
// every reply × every way the wait can end without one × every event that
// can be recorded on a flight in flight × the leg's timeout recorded first
// or not × a Request's answer arriving although the reply was lost. The
// expected fact is written out per row, in the order DESIGN §3 gives it: a
// reply is the fact; then an answer from the addressed node (accepted);
// then an event recorded before the leg's deadline; then what ended the
// wait — a timeout only if the leg left (the callee may hold it), else
// what says nothing is held. Each fact is checked against its ladder.
func TestLegVerdictTable(t *testing.T) {
	t.Parallel()
	reply := func(err error) *nats.Msg {
		m := nats.NewMsg("_INBOX.x")
		verdict.Encode(m.Header, err, "o.7")
		m.Header.Set(hub.HeaderAnswerKey, "k")
		return m
	}
	compact := &nats.Msg{Data: []byte("+k")}
	replies := []struct {
		name string
		msg  *nats.Msg
		want string
	}{
		{"compact accepted", compact, "accepted"},
		{"header accepted", reply(nil), "accepted"},
		{"not the owner", reply(verdict.New(verdict.ReasonNotOwner, "owned by p.3")), "not-owner"},
		{"hub shutting down", reply(verdict.New(verdict.ReasonHubShuttingDown, "draining")), "shutting-down"},
		{"storm breaker", reply(verdict.New(verdict.ReasonStormBreaker, "over")), "storm-breaker"},
		{"bad request", reply(verdict.New(verdict.ReasonBadRequest, "no")), "bad-request"},
		{"activation failed", reply(verdict.New(verdict.ReasonActivationFailed, "build")), "activation-failed"},
	}
	// Ways a wait ends without a reply, with whether the leg had left and
	// whether the leg's deadline is recorded as the flight's fact
	// (flight.timedOut: only a timeout can be).
	waits := []struct {
		name      string
		err       error
		published bool
		want      string // when no event and no answer decides
	}{
		{"leg timer", context.DeadlineExceeded, true, "timeout"},
		{"nats timeout", nats.ErrTimeout, true, "timeout"},
		{"caller cancelled", context.Canceled, true, "cancelled"},
		{"event's wake", context.Canceled, true, "cancelled"}, // only ever with an event: see below
		{"no responders", nats.ErrNoResponders, true, "no-responders"},
		{"publish failed (broken pipe)", publishFailed(syscall.EPIPE), false, "disconnected"},
		{"publish failed (closed)", publishFailed(nats.ErrConnectionClosed), false, "closing"},
		{"publish failed (too large)", publishFailed(nats.ErrMaxPayload), false, "max-payload"},
	}
	events := []struct {
		ev   event
		want string
	}{{evNone, ""}, {evDeparted, "departed"}, {evLinkDrop, "disconnected"}, {evClosing, "closing"}, {evMoved, "disconnected"}}
	rows := 0
	for _, e := range events {
		_, evErr := flightEventIn(phaseSent, e.ev, false)
		for _, answered := range []bool{false, true} {
			for _, timedOut := range []bool{false, true} {
				// A reply is the fact, whatever else is recorded.
				for _, r := range replies {
					rows++
					name := fmt.Sprintf("reply %s/event %v/answered %v/timed out %v", r.name, e.ev, answered, timedOut)
					out, key, err := legVerdict(legFacts{published: true, reply: r.msg, event: evErr, answered: answered, timedOut: timedOut})
					checkLadder(t, name, err, r.want)
					if (out == legAccepted) != (r.want == "accepted") || out != legAccepted && out != legRefused {
						t.Errorf("%s: outcome %d", name, out)
					}
					if out == legAccepted && string(key) != "k" {
						t.Errorf("%s: answer key %q, want k", name, key)
					}
				}
				for _, w := range waits {
					if timedOut && !timedOutErr(w.err) {
						continue // the flight records a timeout only when its wait ended with one
					}
					if w.name == "event's wake" && e.ev == evNone {
						continue
					}
					rows++
					name := fmt.Sprintf("%s/event %v/answered %v/timed out %v", w.name, e.ev, answered, timedOut)
					out, _, err := legVerdict(legFacts{published: w.published, err: w.err, event: evErr, answered: answered, timedOut: timedOut})
					want, wantOut := w.want, legNotHeld
					switch {
					case answered:
						want, wantOut = "accepted", legAnswered
					case e.want != "" && !timedOut:
						want, wantOut = e.want, legEvent
					case want == "timeout":
						wantOut = legTimedOut
					}
					checkLadder(t, name, err, want)
					if out != wantOut {
						t.Errorf("%s: outcome %d, want %d", name, out, wantOut)
					}
				}
			}
		}
	}
	if rows != 238 {
		t.Fatalf("only %d rows", rows)
	}
}

func timedOutErr(err error) bool { return timedOut(err) }

// TestResponseVerdictTable pins the verdict of an accepted Request whose
// wait for its response ended (responseVerdict) for every answer × every
// event in the accepted phase × Idempotent × how the wait ended × the
// event recorded before or after the deadline. Written out: an answer is
// the fact; then an event recorded before the deadline passed (outcome
// unknown, or the event's own resendable verdict for an Idempotent
// delivery); then the caller's cancellation or the timeout — never
// resendable, even for an Idempotent delivery, when the deadline came
// first.
func TestResponseVerdictTable(t *testing.T) {
	t.Parallel()
	answers := []struct {
		name string
		a    *answer
		want string
	}{
		{"none", nil, ""},
		{"response", &answer{payload: []byte("r")}, "accepted"},
		{"late activation-failed", &answer{err: verdict.New(verdict.ReasonActivationFailed, "build")}, "activation-failed"},
		{"late shutting-down", &answer{err: verdict.New(verdict.ReasonHubShuttingDown, "deactivated")}, "shutting-down"},
	}
	events := []struct {
		ev       event
		want     string // plain
		wantIdem string // Idempotent
	}{
		{evNone, "", ""},
		{evDeparted, "outcome-unknown", "departed"},
		{evLinkDrop, "outcome-unknown", "disconnected"},
		{evClosing, "outcome-unknown", "closing"},
		{evMoved, "", ""}, // not a failure: the awaited request is re-sent
	}
	ends := []struct {
		name    string
		ctxErr  error
		expired bool
		want    string
	}{
		{"caller cancelled", context.Canceled, false, "cancelled"},
		{"caller's deadline", context.DeadlineExceeded, false, "timeout"},
		{"request's own deadline", nil, true, "timeout"},
	}
	deadline := time.Now()
	rows := 0
	for _, a := range answers {
		for _, e := range events {
			for _, idem := range []bool{false, true} {
				at, evErr := flightEventIn(phaseAccepted, e.ev, idem)
				for _, end := range ends {
					for _, after := range []bool{false, true} {
						rows++
						evAt := deadline.Add(-time.Millisecond)
						if after {
							evAt = deadline.Add(time.Millisecond)
						}
						if at.IsZero() {
							evAt = time.Time{}
						}
						name := fmt.Sprintf("answer %s/event %v/idempotent %v/%s/event after deadline %v", a.name, e.ev, idem, end.name, after)
						out, err := responseVerdict(responseFacts{answer: a.a, event: evErr, eventAt: evAt, ctxErr: end.ctxErr, expired: end.expired, deadline: deadline})
						evWant := e.want
						if idem {
							evWant = e.wantIdem
						}
						want, wantOut := end.want, responseTimedOut
						switch {
						case a.want != "":
							want, wantOut = a.want, responseAnswered
						case evWant != "" && !(after && end.want == "timeout"):
							want, wantOut = evWant, responseEvent
						}
						checkLadder(t, name, err, want)
						if out != wantOut {
							t.Errorf("%s: outcome %d, want %d", name, out, wantOut)
						}
					}
				}
			}
		}
	}
	if rows != 4*5*2*3*2 {
		t.Fatalf("%d rows", rows)
	}
}
