package verdict

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// TestWireRoundTrip sends every refusal as reply headers through a real
// server and checks that the decoded error matches the same sentinel and
// reads the same on all three predicates.
func TestWireRoundTrip(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	errs := []error{
		nil,
		ErrNoPlacement, ErrDeparted, ErrDirectoryUnavailable, ErrClosing,
		ErrHubShuttingDown, ErrActivationFailed, ErrStormBreaker, ErrInboxFull,
		ErrBadRequest, ErrHandler, ErrUnknownKind, ErrInvalidAddress, ErrPayloadTooLarge,
		ErrOutcomeUnknown, ErrDeadlineUnsent, ErrInvalidID, ErrResponseGone, ErrOutOfOrder,
		&Error{Reason: ReasonOutcomeUnknown, Message: "accepted by b.9, which departed", Node: "b.9", Err: ErrDeparted},
		&Error{Reason: ReasonNotOwner, Message: "not the owner of echo/x", Node: "b.9"},
		fmt.Errorf("handler: %w", &Error{Reason: ReasonHandlerError, Message: "boom", Err: errors.New("db down")}),
	}
	var current error
	sub, err := nc.Subscribe("verdict.rt", func(m *nats.Msg) {
		reply := nats.NewMsg(m.Reply)
		Encode(reply.Header, current, "a.1")
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for _, want := range errs {
		current = want
		msg, err := nc.Request("verdict.rt", nil, 2*time.Second)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		node, got := Decode(msg.Header)
		if want == nil {
			if got != nil || node != "a.1" {
				t.Errorf("Accepted decoded as %v from %q", got, node)
			}
			continue
		}
		var we *Error
		errors.As(want, &we)
		if !errors.Is(got, we) {
			t.Errorf("decoded %v does not match sentinel of %v", got, want)
		}
		if IsTransient(got) != IsTransient(want) || IsResendable(got) != IsResendable(want) || Classify(got) != Classify(want) {
			t.Errorf("decoded %v reads differently from %v", got, want)
		}
		wantNode := "a.1"
		if we.Node != "" {
			wantNode = we.Node
		}
		if node != wantNode {
			t.Errorf("node = %q, want %q", node, wantNode)
		}
	}
}

func TestDecodeForeignReplies(t *testing.T) {
	// No verdict header: a peer that does not speak the protocol.
	_, err := Decode(nats.Header{})
	if Classify(err) != Failed || IsTransient(err) {
		t.Errorf("missing header decoded as %v", err)
	}
	// A reason this version does not know: the verdict type decides.
	h := nats.Header{}
	h.Set(HeaderVerdict, "ShuttingDown")
	h.Set(HeaderReason, "rebalancing")
	_, err = Decode(h)
	if !IsResendable(err) || Classify(err) != ShuttingDown {
		t.Errorf("unknown ShuttingDown reason decoded as %v", err)
	}
	h.Set(HeaderVerdict, "Ignored")
	_, err = Decode(h)
	if IsTransient(err) || Classify(err) != Ignored {
		t.Errorf("unknown Ignored reason decoded as %v", err)
	}
	// A reason that contradicts its verdict: the verdict wins.
	h.Set(HeaderVerdict, "Failed")
	h.Set(HeaderReason, "not-owner")
	_, err = Decode(h)
	if IsTransient(err) || errors.Is(err, ErrNotOwner) {
		t.Errorf("contradictory header decoded as %v", err)
	}
}
