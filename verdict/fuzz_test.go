package verdict

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecode feeds verdict.Decode reply headers from anyone on the
// account. It must never panic; Accepted only for the Accepted header; any
// other reply decodes to an *Error whose three predicates nest (ShuttingDown
// ⇒ resendable ⇒ transient), that matches its reason's sentinel, and that
// reads the same after being encoded and decoded again.
func FuzzDecode(f *testing.F) {
	f.Add("Accepted", "", "", "a.1")
	f.Add("ShuttingDown", "not-owner", "owned by b.2", "b.2")
	f.Add("Failed", "outcome-unknown", "accepted by c.3, which departed", "c.3")
	f.Add("Unavailable", "deadline-unsent", "", "")
	f.Add("Failed", "not-owner", "contradiction", "")
	f.Add("ShuttingDown", "made-up-reason", "", "")
	f.Add("Ignored", "inbox-full", "full", "n.1")
	f.Add("", "", "", "")
	f.Add("accepted", "bad-request", "\x00\xff", "\r\n")
	f.Fuzz(func(t *testing.T, v, reason, msg, node string) {
		h := nats.Header{}
		for k, val := range map[string]string{HeaderVerdict: v, HeaderReason: reason, HeaderMessage: msg, HeaderNode: node} {
			if val != "" {
				h.Set(k, val)
			}
		}
		gotNode, err := Decode(h)
		if gotNode != node {
			t.Fatalf("node %q, want %q", gotNode, node)
		}
		if err == nil {
			if v != "Accepted" {
				t.Fatalf("%q decoded as Accepted", v)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("decoded %T, want *Error", err)
		}
		tr, rs, cl := IsTransient(err), IsResendable(err), Classify(err)
		if cl == ShuttingDown && !rs || rs && !tr || cl == Accepted {
			t.Fatalf("%v: transient %v resendable %v class %v: the ladder does not nest", err, tr, rs, cl)
		}
		if e.Reason != ReasonUnknown && !errors.Is(err, &Error{Reason: e.Reason}) {
			t.Fatalf("%v does not match its reason's sentinel", err)
		}
		if t2, ok := ParseErrorType(v); ok && cl != t2 {
			t.Fatalf("%v: class %v, the reply said %q", err, cl, v)
		}
		h2 := nats.Header{}
		Encode(h2, err, "")
		_, err2 := Decode(h2)
		if err2 == nil || IsTransient(err2) != tr || IsResendable(err2) != rs || Classify(err2) != cl || ReasonOf(err2) != e.Reason {
			t.Fatalf("%v reads differently after a round trip: %v", err, err2)
		}
	})
}
