package mesh

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestFlightVerdictTable pins the sender's verdict for every phase of a
// flight × every event that can reach it × Idempotent, the way verdict's
// own table pins the ladder (DESIGN §3, §4; the table in departure.go).
// Events arrive through the entry points the cluster view and the link
// watcher use (failNode, failInFlight, ownerMoved, interruptAll), on a
// flight indexed as the sender indexes it, and the verdict is read as the
// goroutine working on the flight reads it (causeLocked). Each cell is
// checked against the three predicates and the reason, in both
// directions: a cell that should be nil is nil, and only that.
func TestFlightVerdictTable(t *testing.T) {
	t.Parallel()
	owner := subjects.NodeID{Name: "o", Generation: 7}
	moved := fmt.Errorf("owner's connection moved with the leg in flight: %w", nats.ErrDisconnected) // as the node passes it
	events := []struct {
		name  string
		apply func(c *Client)
	}{
		{"none", func(*Client) {}},
		{"departure", func(c *Client) { c.failNode(owner, "test") }},
		{"link drop", func(c *Client) { c.interruptAll(evLinkDrop) }},
		{"closing", func(c *Client) { c.interruptAll(evClosing) }},
		{"connection moved", func(c *Client) { c.ownerMoved(owner, moved) }},
		{"in transit lost", func(c *Client) { c.failInFlight(owner, moved) }},
	}
	// want: "" (no verdict: the wait goes on), a verdict's reason
	// ("departed", "outcome-unknown"), or the client's own "closing" and
	// "disconnected".
	type cell struct{ plain, idem string }
	table := map[phase]map[string]cell{
		phaseWaiting: {
			"none": {"", ""}, "departure": {"departed", "departed"},
			"link drop":        {"", ""}, // nothing in flight: sent after the reconnect
			"closing":          {"closing", "closing"},
			"connection moved": {"", ""}, "in transit lost": {"", ""}, // nothing in transit
		},
		phaseSent: {
			"none": {"", ""}, "departure": {"departed", "departed"},
			"link drop": {"disconnected", "disconnected"}, "closing": {"closing", "closing"},
			"connection moved": {"disconnected", "disconnected"}, "in transit lost": {"disconnected", "disconnected"},
		},
		phaseAccepted: {
			"none":      {"", ""},
			"departure": {"outcome-unknown", "departed"},
			"link drop": {"outcome-unknown", "disconnected"},
			"closing":   {"outcome-unknown", "closing"},
			// The awaited request is re-sent to the same generation
			// (awaitResponse), not failed; a leg's loss is not its concern.
			"connection moved": {"", ""}, "in transit lost": {"", ""},
		},
	}
	for _, p := range []phase{phaseWaiting, phaseSent, phaseAccepted} {
		for _, ev := range events {
			for _, idem := range []bool{false, true} {
				name := fmt.Sprintf("%v/%s/idempotent=%v", p, ev.name, idem)
				t.Run(name, func(t *testing.T) {
					c := &Client{fl: newFlights(), opts: options{}}
					f := &flight{id: "d1", idempotent: idem, request: true, wake: make(chan struct{})}
					c.address(f, owner, p, false)
					ev.apply(c)
					f.mu.Lock()
					err := f.causeLocked()
					f.mu.Unlock()
					want := table[p][ev.name].plain
					if idem {
						want = table[p][ev.name].idem
					}
					checkCell(t, err, want)
				})
			}
		}
	}
}

// checkCell checks err against the reason want names ("" for no verdict;
// "closing" and "disconnected" for the client's own sentinels) and the
// ladder that reason implies.
func checkCell(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("verdict %v, want none (the wait goes on)", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no verdict, want %s", want)
	}
	switch want {
	case "closing":
		if !errors.Is(err, verdict.ErrClosing) {
			t.Fatalf("verdict %v, want closing", err)
		}
	case "disconnected":
		if !errors.Is(err, nats.ErrDisconnected) {
			t.Fatalf("verdict %v, want the own link's drop", err)
		}
	default:
		reason := map[string]verdict.Reason{"departed": verdict.ReasonDeparted, "outcome-unknown": verdict.ReasonOutcomeUnknown}[want]
		var ve *verdict.Error
		if !errors.As(err, &ve) || ve.Reason != reason {
			t.Fatalf("verdict %v, want reason %s", err, want)
		}
	}
	resendable := want != "outcome-unknown"
	if got := verdict.IsResendable(err); got != resendable {
		t.Fatalf("%v: IsResendable = %v, want %v", err, got, resendable)
	}
	if !verdict.IsTransient(err) {
		t.Fatalf("%v: not transient", err)
	}
	wantClass := verdict.ShuttingDown
	if !resendable {
		wantClass = verdict.Failed
	}
	if got := verdict.Classify(err); got != wantClass {
		t.Fatalf("%v: Classify = %v, want %v", err, got, wantClass)
	}
}

func (p phase) String() string {
	return [...]string{"waiting", "sent", "accepted", "done"}[p]
}

// TestTimeoutIsAFact: the verdict of a leg whose deadline and an event
// (the owner's departure) both reached it follows from which happened
// first, never from which the waiting goroutine saw first (DESIGN §3): a
// deadline that passed before the departure was recorded leaves a
// timeout — not resendable, the callee may hold it — and a departure
// recorded before the deadline leaves the departed verdict (resendable).
// Both for the leg's own timer and for the caller's deadline; repeated,
// since the wait picks among ready channels at random.
func TestTimeoutIsAFact(t *testing.T) {
	owner := subjects.NodeID{Name: "o", Generation: 7}
	for _, tc := range []struct {
		name           string
		eventFirst     bool
		callerDeadline bool
	}{
		{"leg timer, then departure", false, false},
		{"departure, then leg timer", true, false},
		{"caller's deadline, then departure", false, true},
		{"departure, then caller's deadline", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 50 {
				c := &Client{fl: newFlights(), opts: options{}}
				f := &flight{id: "d1", wake: make(chan struct{})}
				c.address(f, owner, phaseSent, false)
				w := &legWait{ch: make(chan *nats.Msg, 1), timer: time.NewTimer(time.Hour)}
				ctx := context.Background()
				depart := func() {
					c.failNode(owner, "test")
					f.mu.Lock()
					at := f.evAt
					f.mu.Unlock()
					spinPast(at)
				}
				if tc.eventFirst {
					depart()
				}
				if tc.callerDeadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithDeadline(ctx, time.Now())
					defer cancel()
					<-ctx.Done()
					dl, _ := ctx.Deadline()
					spinPast(dl)
				} else {
					w.timer.Reset(0) // fires at once: its time is at most at
					spinPast(time.Now())
				}
				if !tc.eventFirst {
					depart()
				}
				_, err := c.awaitReply(ctx, f, w, f.wake)
				var accepted bool
				_, err = c.legDone(&Delivery{ID: "d1"}, f, owner, true, nil, err, &accepted)
				if tc.eventFirst {
					var ve *verdict.Error
					if !errors.As(err, &ve) || ve.Reason != verdict.ReasonDeparted || !verdict.IsResendable(err) {
						t.Fatalf("verdict %v, want the departed verdict (resendable)", err)
					}
					continue
				}
				if !errors.Is(err, context.DeadlineExceeded) || verdict.IsResendable(err) || verdict.Classify(err) != verdict.Failed {
					t.Fatalf("verdict %v (resendable %v), want the timeout: Failed, never re-sent", err, verdict.IsResendable(err))
				}
			}
		})
	}
}

// TestResponseTimeoutIsAFact: the same rule for an accepted Request whose
// response is awaited: a deadline that passed before the owner's departure
// was recorded is the timeout (never re-sent, even for an Idempotent
// delivery, whose departure would be resendable); a departure recorded
// first is the departure's verdict.
func TestResponseTimeoutIsAFact(t *testing.T) {
	owner := subjects.NodeID{Name: "o", Generation: 7}
	for _, eventFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("departure first %v", eventFirst), func(t *testing.T) {
			for range 50 {
				c := &Client{fl: newFlights(), opts: options{}}
				f := &flight{id: "d1", idempotent: true, request: true, wake: make(chan struct{})}
				c.address(f, owner, phaseAccepted, false)
				depart := func() {
					c.failNode(owner, "test")
					f.mu.Lock()
					at := f.evAt
					f.mu.Unlock()
					spinPast(at)
				}
				if eventFirst {
					depart()
				}
				ctx, cancel := context.WithDeadline(context.Background(), time.Now())
				<-ctx.Done()
				dl, _ := ctx.Deadline()
				spinPast(dl)
				if !eventFirst {
					depart()
				}
				_, err := c.awaitResponse(ctx, dl, &Delivery{ID: "d1", Idempotent: true}, f, Receipt{Node: owner})
				cancel()
				if eventFirst {
					if !verdict.IsResendable(err) {
						t.Fatalf("verdict %v, want the departed verdict (resendable: idempotent)", err)
					}
					continue
				}
				if !errors.Is(err, context.DeadlineExceeded) || verdict.IsResendable(err) {
					t.Fatalf("verdict %v (resendable %v), want the timeout", err, verdict.IsResendable(err))
				}
			}
		})
	}
}

// spinPast returns a millisecond after t0, so that two facts are apart by
// more than the runtime's reading of a timer's fire time (which may run a
// few microseconds late under the race detector). It spins: a sleep's
// wake-up is what it must not depend on.
func spinPast(t0 time.Time) {
	for !time.Now().After(t0.Add(time.Millisecond)) {
	}
}
