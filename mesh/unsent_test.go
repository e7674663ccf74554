package mesh

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestUnsentVerdictTable pins the sender's verdict for a wait that ended
// with nothing of its attempt sent, for every combination of the facts
// that can hold when it ends (an event on the flight, the client stopped,
// the caller's context ended, the deadline passed) and every stage: the
// facts are taken in one order — event, stopped, cancelled, deadline —
// whichever channel woke the wait (DESIGN §3). Each row names the expected
// verdict by its reason and is checked against the ladder.
func TestUnsentVerdictTable(t *testing.T) {
	t.Parallel()
	departed := departedError(subjects.NodeID{Name: "o", Generation: 7}, "test")
	linkDrop := fmt.Errorf("own NATS link dropped: %w", nats.ErrDisconnected)
	events := map[string]error{"": nil, "departed": departed, "closing": verdict.ErrClosing, "link drop": linkDrop}
	ctxErrs := map[string]error{"": nil, "cancelled": context.Canceled, "deadline": context.DeadlineExceeded}
	stages := []waitStage{stageLane, stageSlot, stageMove, stageLeg, stageResolve, stageBackOff}
	// want: the expected verdict for (event, stopped, ctx, deadline),
	// written out rather than computed: "" none, else the fact that decides.
	want := func(ev string, stopped bool, ctxe string, deadline bool) string {
		switch {
		case ev != "":
			return ev
		case stopped:
			return "closing"
		case ctxe == "cancelled":
			return "cancelled"
		case ctxe == "deadline" || deadline:
			return "deadline-unsent"
		}
		return ""
	}
	rows := 0
	for _, stage := range stages {
		for ev, evErr := range events {
			for _, stopped := range []bool{false, true} {
				for ce, ctxErr := range ctxErrs {
					for _, deadline := range []bool{false, true} {
						rows++
						fx := unsentFacts{event: evErr, stopped: stopped, ctxErr: ctxErr, deadline: deadline}
						got := unsentVerdict(stage, fx, "")
						name := fmt.Sprintf("%s/event=%q/stopped=%v/ctx=%q/deadline=%v", stage, ev, stopped, ce, deadline)
						checkUnsent(t, name, got, want(ev, stopped, ce, deadline), stage)
					}
				}
			}
		}
	}
	if rows != 6*4*2*3*2 {
		t.Fatalf("%d rows", rows)
	}
}

// checkUnsent checks one verdict against the reason it should carry and
// the ladder that reason implies.
func checkUnsent(t *testing.T, name string, got error, want string, stage waitStage) {
	t.Helper()
	switch want {
	case "":
		if got != nil {
			t.Errorf("%s: %v, want no verdict (the wait goes on)", name, got)
		}
		return
	case "departed":
		var ve *verdict.Error
		if !errors.As(got, &ve) || ve.Reason != verdict.ReasonDeparted || !verdict.IsResendable(got) {
			t.Errorf("%s: %v, want the resendable departed verdict", name, got)
		}
	case "closing":
		if !errors.Is(got, verdict.ErrClosing) || verdict.Classify(got) != verdict.ShuttingDown {
			t.Errorf("%s: %v, want ErrClosing (ShuttingDown)", name, got)
		}
	case "link drop":
		if !errors.Is(got, nats.ErrDisconnected) || !verdict.IsResendable(got) {
			t.Errorf("%s: %v, want the own link's drop (resendable)", name, got)
		}
	case "cancelled":
		if !errors.Is(got, context.Canceled) || verdict.IsTransient(got) || verdict.Classify(got) != verdict.Failed {
			t.Errorf("%s: %v, want the caller's cancellation (Failed, not transient)", name, got)
		}
	case "deadline-unsent":
		if !isUnsentVerdict(got) {
			t.Errorf("%s: %v, want deadline-unsent (resendable Unavailable, never a timeout)", name, got)
		}
		var ve *verdict.Error
		if want := "deadline passed " + string(stage); !errors.As(got, &ve) || ve.Message != want {
			t.Errorf("%s: %v does not say where: want the message %q", name, got, want)
		}
	default:
		t.Fatalf("unknown want %q", want)
	}
}

// blockingResolver resolves nothing: it waits for ctx and returns its
// error, as a resolver whose directory does not answer does.
type blockingResolver struct{ calls chan struct{} }

func (r blockingResolver) Resolve(ctx context.Context, _ subjects.Address) (subjects.NodeID, error) {
	select {
	case r.calls <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return subjects.NodeID{}, fmt.Errorf("directory read: %w", ctx.Err())
}

func (blockingResolver) Invalidate(subjects.Address, subjects.NodeID) {}

// TestResolverGivesUpWithTheContext: a resolver that returns the caller's
// context's error (the directory did not answer before the deadline, or
// the caller cancelled) has sent nothing: the delivery's verdict is the
// resendable deadline-unsent one — never a timeout, which would say the
// callee may hold it — or, when the caller cancelled, Failed wrapping
// context.Canceled. Repeated: the verdict follows from the facts, not from
// which wait noticed first.
func TestResolverGivesUpWithTheContext(t *testing.T) {
	s := natstest.RunServer(t)
	res := blockingResolver{calls: make(chan struct{}, 1)}
	c := newClient(t, natstest.Connect(t, s), res)
	for rep := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, err := c.Deliver(ctx, Delivery{To: "echo/x", ID: fmt.Sprintf("d-%d", rep)})
		cancel()
		if !isUnsentVerdict(err) {
			t.Fatalf("rep %d, deadline while resolving: %v; want deadline-unsent (resendable Unavailable, not a timeout)", rep, err)
		}
		select {
		case <-res.calls: // the Deliver's
		default:
		}
		ctx, cancel = context.WithCancel(context.Background())
		go func() {
			<-res.calls
			cancel()
		}()
		_, err = c.Request(ctx, Delivery{To: "echo/x", ID: fmt.Sprintf("r-%d", rep)})
		if !errors.Is(err, context.Canceled) || verdict.IsTransient(err) {
			t.Fatalf("rep %d, cancelled while resolving: %v; want Failed wrapping context.Canceled", rep, err)
		}
	}
}
