package verdict

import (
	"errors"

	"github.com/nats-io/nats.go"
)

// Reply headers that carry a verdict (docs/protocol.md).
const (
	// HeaderVerdict is the verdict's [ErrorType] name: "Accepted",
	// "Failed", "ShuttingDown", "Unavailable" or "Ignored".
	HeaderVerdict = "Mesh-Verdict"
	// HeaderReason is the failure's [Reason] wire name, e.g. "not-owner".
	HeaderReason = "Mesh-Reason"
	// HeaderMessage is human-readable detail.
	HeaderMessage = "Mesh-Message"
	// HeaderNode is the answering node ("name.gen") on Accepted, or the node
	// a failure names (the owner, for not-owner).
	HeaderNode = "Mesh-Node"
)

// Encode writes the verdict for err into h: Accepted when err is nil (with
// node, the accepting node, if not empty), else [Classify](err), the reason
// and node of the first *[Error] in the graph, and that error's message (the
// fact said once: no verdict name, node or wrapping; err's text when the
// graph holds no *Error with a message). It replaces any verdict headers
// already in h.
func Encode(h nats.Header, err error, node string) {
	h.Del(HeaderReason)
	h.Del(HeaderMessage)
	h.Del(HeaderNode)
	if err == nil {
		h.Set(HeaderVerdict, Accepted.String())
		if node != "" {
			h.Set(HeaderNode, node)
		}
		return
	}
	typ := Classify(err)
	h.Set(HeaderVerdict, typ.String())
	h.Set(HeaderMessage, wireMessage(err))
	if r := WireReason(err); r != ReasonUnknown {
		h.Set(HeaderReason, r.String())
	}
	var e *Error
	if errors.As(err, &e) && e.Node != "" {
		node = e.Node
	}
	if node != "" {
		h.Set(HeaderNode, node)
	}
}

// WireReason is the reason a reply reports for err: the reason of the
// first *[Error] in the graph whose verdict is err's own ([Classify]) and,
// when err says the callee may hold the delivery (a timeout, an unknown
// outcome), one that says so too; else the fact the graph holds: the
// sender's cancellation (ReasonCanceled), a timeout (ReasonTimeout), NATS
// no responders on a delivery subject (ReasonDeparted), a closing
// connection (ReasonClosing), an oversized or malformed message. Every
// Failed verdict of this node's has one — ReasonInternal when nothing is
// known — so a reply never says Failed without saying why (issue 24).
// ReasonUnknown is returned only for nil, for a resendable fact the
// protocol names no reason for (this sender's own link dropped), and for a
// verdict relayed from a peer that gave no reason this node knows (it is
// relayed as the peer said it).
func WireReason(err error) Reason {
	if err == nil {
		return ReasonUnknown
	}
	typ := Classify(err)
	f := collect(err)
	var found Reason
	peer := false // a verdict a peer sent without a reason this node knows
	var walk func(error) bool
	walk = func(err error) bool {
		if err == nil {
			return false
		}
		if e, ok := err.(*Error); ok && e.Reason == ReasonUnknown {
			peer = true
		}
		if e, ok := err.(*Error); ok && e.Reason != ReasonUnknown {
			r := e.rung()
			if r.typ == typ && (!f.mayHold || r.transient && !r.resendable) {
				found = e.Reason
				return true
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			return walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if walk(e) {
					return true
				}
			}
		}
		return false
	}
	if walk(err) {
		return found
	}
	switch {
	case f.canceled:
		return ReasonCanceled
	case f.mayHold:
		return ReasonTimeout
	case errors.Is(err, nats.ErrMaxPayload):
		return ReasonPayloadTooLarge
	case errors.Is(err, nats.ErrBadSubject):
		return ReasonInvalidAddress
	case errors.Is(err, nats.ErrInvalidMsg), errors.Is(err, nats.ErrHeadersNotSupported):
		return ReasonBadRequest
	case typ == ShuttingDown && errors.Is(err, nats.ErrNoResponders):
		return ReasonDeparted
	case typ == ShuttingDown && (errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining)):
		return ReasonClosing
	case typ == Failed && !peer:
		return ReasonInternal
	}
	return ReasonUnknown
}

// wireMessage is the detail of err for Mesh-Message: the message (and local
// cause) of the first *Error in the graph — the fact, said once, without the
// verdict name, the node (Mesh-Verdict and Mesh-Node carry them) or the
// sender's wrapping — else err's text.
func wireMessage(err error) string {
	var e *Error
	if !errors.As(err, &e) || e.Message == "" {
		return err.Error()
	}
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

// Decode reads a verdict from reply headers. It returns the accepting node and
// a nil error for Accepted, or an *[Error] that matches the sentinel of its
// reason. A reply without a recognisable [HeaderVerdict] decodes to a Failed
// *Error of ReasonUnknown: a peer that does not speak the protocol.
func Decode(h nats.Header) (node string, err error) {
	node = h.Get(HeaderNode)
	v := h.Get(HeaderVerdict)
	t, ok := ParseErrorType(v)
	if !ok {
		return node, &Error{Type: Failed, Message: "reply carries no valid " + HeaderVerdict + " header (got " + quote(v) + ")", Node: node}
	}
	if t == Accepted {
		return node, nil
	}
	r := parseReason(h.Get(HeaderReason))
	if r != ReasonUnknown && ladder[r].typ != t {
		// A reason contradicting its verdict: trust the verdict type, which
		// is what the peer told its sender.
		r = ReasonUnknown
	}
	return node, &Error{Type: t, Reason: r, Message: h.Get(HeaderMessage), Node: node}
}

func quote(s string) string {
	if s == "" {
		return "nothing"
	}
	return "\"" + s + "\""
}
