package verdict

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// ErrorType is the verdict a delivery ends with. The zero value is Accepted.
type ErrorType uint8

// Verdicts (DESIGN §1, §3).
const (
	// Accepted: the destination holds the delivery and will handle it.
	Accepted ErrorType = iota
	// Failed: a terminal failure (bad input, handler error, timeout, the
	// caller's cancellation).
	Failed
	// ShuttingDown: a lifecycle transition (a node left, drained, or was
	// superseded); the callee holds nothing and a re-resolve may succeed.
	ShuttingDown
	// Unavailable: no activation could be had (no node hosts the kind, or
	// the hub's build failed).
	Unavailable
	// Ignored: refused under overload (storm breaker, full inbox).
	Ignored
)

var typeNames = [...]string{"Accepted", "Failed", "ShuttingDown", "Unavailable", "Ignored"}

// String returns the verdict's name, as carried in [HeaderVerdict].
func (t ErrorType) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("ErrorType(%d)", uint8(t))
}

// ParseErrorType reads the String form of an ErrorType.
func ParseErrorType(s string) (ErrorType, bool) {
	for i, n := range typeNames {
		if n == s {
			return ErrorType(i), true
		}
	}
	return Failed, false
}

// Error is a mesh failure: a hub's refusal, or a sender-side fact such as a
// departed owner. It matches the sentinel of its [Reason] with [errors.Is]
// whatever its Message, so errors decoded from the wire match too.
type Error struct {
	// Type is the verdict. For a known Reason it is the reason's fixed type
	// (see [Error.Verdict]); it matters alone only for ReasonUnknown, as
	// decoded from a peer that knows a reason this one does not.
	Type ErrorType
	// Reason is the fact reported.
	Reason Reason
	// Message is human-readable detail.
	Message string
	// Node is the node that refused or the owner it names ("name.gen"),
	// when known.
	Node string
	// Err is the local cause, if any. It is not sent on the wire.
	Err error
}

// New returns an *Error of reason r with a formatted message.
func New(r Reason, format string, args ...any) *Error {
	return &Error{Type: rungOf(r, Failed).typ, Reason: r, Message: fmt.Sprintf(format, args...)}
}

// Error formats "<verdict>: <message>[ (node <node>)][: <cause>]". A cause
// that is itself an *Error is written without its verdict: the text names
// one verdict, e's (an outcome-unknown Failed whose cause is a departure
// does not read "ShuttingDown" too).
func (e *Error) Error() string { return e.Verdict().String() + ": " + e.text() }

// text is Error without the leading verdict.
func (e *Error) text() string {
	s := e.Message
	if s == "" {
		s = e.Reason.String()
	}
	if e.Node != "" {
		s += " (node " + e.Node + ")"
	}
	if inner, ok := e.Err.(*Error); ok {
		s += ": " + inner.text()
	} else if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Verdict returns the error's verdict type.
func (e *Error) Verdict() ErrorType { return e.rung().typ }

// Unwrap returns the local cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error of the same known reason (the
// sentinels in errors.go are such errors). An invalid delivery ID is a bad
// request too: it matches [ErrBadRequest] as well as [ErrInvalidID].
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Reason == ReasonUnknown {
		return false
	}
	return t.Reason == e.Reason || t.Reason == ReasonBadRequest && e.Reason == ReasonInvalidID
}

func (e *Error) rung() rung { return rungOf(e.Reason, e.Type) }

// rungOf is the ladder position of reason r; an unknown reason takes its
// place from the verdict type it came with: ShuttingDown says the callee
// holds nothing (resendable), anything else is terminal.
func rungOf(r Reason, typ ErrorType) rung {
	if r != ReasonUnknown && r < numReasons {
		return ladder[r]
	}
	if typ == ShuttingDown {
		return rung{ShuttingDown, true, true}
	}
	if typ == Accepted {
		typ = Failed
	}
	return rung{typ, false, false}
}

// facts are what an error graph says, independent of where each sits.
type facts struct {
	canceled   bool      // the caller's own ctx was cancelled
	mayHold    bool      // a leg timed out, or the outcome is unknown: the callee may hold it
	terminal   ErrorType // strongest terminal verdict seen, Accepted if none
	resendable ErrorType // strongest resendable verdict seen, Accepted if none
}

// terminal precedence: the more final fact wins whatever its position.
var (
	terminalRank = [len(typeNames)]int{Ignored: 1, Unavailable: 2, Failed: 3}
	resendRank   = [len(typeNames)]int{Unavailable: 1, ShuttingDown: 2}
)

func (f *facts) addTerminal(t ErrorType) {
	if terminalRank[t] > terminalRank[f.terminal] {
		f.terminal = t
	}
}

func (f *facts) addResendable(t ErrorType) {
	if resendRank[t] > resendRank[f.resendable] {
		f.resendable = t
	}
}

// natsFacts maps nats.go's errors onto the ladder (DESIGN §3 table).
func (f *facts) leaf(err error) {
	switch {
	case err == context.Canceled:
		f.canceled = true
	case err == context.DeadlineExceeded || err == nats.ErrTimeout:
		f.mayHold = true
	case err == nats.ErrNoResponders, // the generation holds no subscription
		err == nats.ErrDisconnected,         // own link dropped, leg in flight
		err == nats.ErrReconnectBufExceeded, // nothing was sent
		err == nats.ErrConnectionClosed,     // this client is closing
		err == nats.ErrConnectionDraining:
		f.addResendable(ShuttingDown)
	case err == nats.ErrMaxPayload, err == nats.ErrBadSubject, err == nats.ErrInvalidMsg, err == nats.ErrHeadersNotSupported:
		f.addTerminal(Failed)
	}
}

func collect(err error) facts {
	var f facts
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if e, ok := err.(*Error); ok {
			r := e.rung()
			if r.transient && !r.resendable {
				f.mayHold = true
			} else if r.resendable {
				f.addResendable(r.typ)
			} else {
				f.addTerminal(r.typ)
			}
		} else {
			f.leaf(err)
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return f
}

// IsTransient reports whether another attempt of the delivery is conceivable
// at all: the graph holds a timeout, an unknown outcome ([ErrOutcomeUnknown])
// or a resendable fact, and no caller
// cancellation and no terminal refusal. IsTransient(nil) is false.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	f := collect(err)
	return !f.canceled && f.terminal == Accepted && (f.mayHold || f.resendable != Accepted)
}

// IsResendable reports whether the same delivery may be sent again now (after
// re-resolving its owner): it is transient and no timeout and no unknown
// outcome appears anywhere in the graph — a timed-out callee, or one that
// accepted the delivery before its answer was lost, may still hold it.
func IsResendable(err error) bool {
	if err == nil {
		return false
	}
	f := collect(err)
	return !f.canceled && f.terminal == Accepted && !f.mayHold && f.resendable != Accepted
}

// Classify returns the verdict an error reports: Accepted for nil; Failed for
// a caller's cancellation, a timeout or an unknown outcome anywhere in the
// graph; else the
// strongest terminal verdict present (Failed > Unavailable > Ignored); else
// the strongest resendable one (ShuttingDown > Unavailable); Failed for an
// error the mesh does not recognise. Classify(err) == ShuttingDown implies
// IsResendable(err).
func Classify(err error) ErrorType {
	if err == nil {
		return Accepted
	}
	f := collect(err)
	switch {
	case f.canceled, f.mayHold:
		return Failed
	case f.terminal != Accepted:
		return f.terminal
	case f.resendable != Accepted:
		return f.resendable
	}
	return Failed
}

// ReasonOf returns the Reason of the first *Error in err's graph, or
// ReasonUnknown.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ReasonUnknown
}
