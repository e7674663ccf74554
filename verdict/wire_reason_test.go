package verdict

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestWireReasonAgreesWithVerdict (issue 24): every error a node encodes
// as Failed carries a Mesh-Reason, and the reason sent agrees with the
// verdict sent (a reason whose fixed verdict contradicts it is no reason:
// decoders drop it); the decoded error reads like the original.
func TestWireReasonAgreesWithVerdict(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want Reason
	}{
		{"leg timeout", fmt.Errorf("mesh: deliver x (attempt 1): %w", nats.ErrTimeout), ReasonTimeout},
		{"leg deadline", fmt.Errorf("mesh: deliver x (attempt 1, node a.1): %w", context.DeadlineExceeded), ReasonTimeout},
		{"timeout behind a resendable reason", errors.Join(ErrDirectoryUnavailable, context.DeadlineExceeded), ReasonTimeout},
		{"cancelled", fmt.Errorf("mesh: %w", context.Canceled), ReasonCanceled},
		{"outcome unknown", fmt.Errorf("mesh: %w", &Error{Reason: ReasonOutcomeUnknown, Message: "owner departed"}), ReasonOutcomeUnknown},
		{"outcome unknown and a timeout", errors.Join(nats.ErrTimeout, &Error{Reason: ReasonOutcomeUnknown}), ReasonOutcomeUnknown},
		{"handler error", &Error{Reason: ReasonHandlerError, Message: "boom"}, ReasonHandlerError},
		{"max payload", fmt.Errorf("publish: %w", nats.ErrMaxPayload), ReasonPayloadTooLarge},
		{"unrecognised", errors.New("something odd"), ReasonInternal},
		{"no responders", fmt.Errorf("leg: %w", nats.ErrNoResponders), ReasonDeparted},
		{"closed", nats.ErrConnectionClosed, ReasonClosing},
		{"own link dropped", nats.ErrDisconnected, ReasonUnknown},
		{"directory", ErrDirectoryUnavailable, ReasonDirectoryDown},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := WireReason(c.err); got != c.want {
				t.Errorf("WireReason = %v, want %v", got, c.want)
			}
			h := nats.Header{}
			Encode(h, c.err, "n.1")
			if Classify(c.err) == Failed && h.Get(HeaderReason) == "" {
				t.Errorf("Failed without %s: %v", HeaderReason, h)
			}
			if r := h.Get(HeaderReason); r != "" && ladder[parseReason(r)].typ.String() != h.Get(HeaderVerdict) {
				t.Errorf("reason %s contradicts verdict %s", r, h.Get(HeaderVerdict))
			}
			_, back := Decode(h)
			if Classify(back) != Classify(c.err) || IsTransient(back) != IsTransient(c.err) || IsResendable(back) != IsResendable(c.err) {
				t.Errorf("decoded %v reads differently from %v", back, c.err)
			}
		})
	}
}
