package mesh

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestFlightVerdictTable pins the sender's verdict for every phase of a
// flight × every event that can reach it × Idempotent, the way verdict's
// own table pins the ladder (DESIGN §3, §4; the table in departure.go).
// Events arrive through the entry points the cluster view and the link
// watcher use (FailNode, FailInFlight, OwnerMoved, interruptAll), on a
// flight indexed as the sender indexes it, and the verdict is read as the
// goroutine working on the flight reads it (causeLocked). Each cell is
// checked against the three predicates and the reason, in both
// directions: a cell that should be nil is nil, and only that.
func TestFlightVerdictTable(t *testing.T) {
	owner := subjects.NodeID{Name: "o", Generation: 7}
	moved := fmt.Errorf("owner's connection moved with the leg in flight: %w", nats.ErrDisconnected) // as the node passes it
	events := []struct {
		name  string
		apply func(c *Client)
	}{
		{"none", func(*Client) {}},
		{"departure", func(c *Client) { c.FailNode(owner, "test") }},
		{"link drop", func(c *Client) { c.interruptAll(evLinkDrop) }},
		{"closing", func(c *Client) { c.interruptAll(evClosing) }},
		{"connection moved", func(c *Client) { c.OwnerMoved(owner, moved) }},
		{"in transit lost", func(c *Client) { c.FailInFlight(owner, moved) }},
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
