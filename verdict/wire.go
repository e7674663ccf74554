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
	h.Set(HeaderVerdict, Classify(err).String())
	h.Set(HeaderMessage, wireMessage(err))
	r := ReasonOf(err)
	if r != ReasonUnknown {
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
