package verdict

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// row is one row of the DESIGN §3 table.
type row struct {
	name       string
	err        error
	transient  bool
	resendable bool
	class      ErrorType
	why        string
}

// table returns DESIGN §3 row by row. live supplies errors provoked from a
// real server where one can be.
func table(live map[string]error) []row {
	return []row{
		{"no responders (constructed)", nats.ErrNoResponders, true, true, ShuttingDown, "that generation holds no subscription: the callee holds nothing"},
		{"no responders (live server)", live["noresponders"], true, true, ShuttingDown, "that generation holds no subscription: the callee holds nothing"},
		{"no placement", ErrNoPlacement, true, true, Unavailable, "nothing was sent; a node may join"},
		{"leg timeout nats.ErrTimeout", nats.ErrTimeout, true, false, Failed, "the callee may still hold the request: re-sending duplicates work on the destination that is already too slow"},
		{"leg timeout ctx deadline", context.DeadlineExceeded, true, false, Failed, "the callee may still hold the request: re-sending duplicates work on the destination that is already too slow"},
		{"leg timeout (live server)", live["timeout"], true, false, Failed, "the callee may still hold the request: re-sending duplicates work on the destination that is already too slow"},
		{"own link dropped", nats.ErrDisconnected, true, true, ShuttingDown, "not a slowness signal of the callee"},
		{"reconnect buffer full", nats.ErrReconnectBufExceeded, true, true, ShuttingDown, "nothing was sent"},
		{"owner departed before acceptance", ErrDeparted, true, true, ShuttingDown, "an incarnation cannot answer again and holds nothing"},
		{"owner departed after acceptance, idempotent", ErrDeparted, true, true, ShuttingDown, "the handler may have run, and may safely run again"},
		{"owner departed after acceptance", &Error{Reason: ReasonOutcomeUnknown, Message: "accepted by n.3, which departed", Err: ErrDeparted}, true, false, Failed, "the handler may have run: the caller reconciles"},
		{"own link dropped after acceptance", &Error{Reason: ReasonOutcomeUnknown, Message: "own link dropped", Err: nats.ErrDisconnected}, true, false, Failed, "the handler may have run: the caller reconciles"},
		{"own link dropped after acceptance, idempotent", fmt.Errorf("response lost: %w", nats.ErrDisconnected), true, true, ShuttingDown, "the handler may safely run again"},
		{"client closing after acceptance", &Error{Reason: ReasonOutcomeUnknown, Message: "closing", Err: ErrClosing}, true, false, Failed, "the handler may have run: the caller reconciles"},
		{"outcome unknown (sentinel)", ErrOutcomeUnknown, true, false, Failed, "the handler may have run: the caller reconciles"},
		{"deadline passed before any leg was sent", ErrDeadlineUnsent, true, true, Unavailable, "nothing was sent: not a timeout"},
		{"invalid delivery ID", ErrInvalidID, false, false, Failed, "returned before anything is sent"},
		{"duplicate request, response gone", ErrResponseGone, false, false, Failed, "the handler ran; its response is lost"},
		{"hub refused: out of order in its lane", ErrOutOfOrder, true, true, ShuttingDown, "refused before acceptance: the sender re-sends from its first unaccepted delivery"},
		{"directory unreachable", ErrDirectoryUnavailable, true, true, ShuttingDown, "nothing was sent"},
		{"mesh client closing", ErrClosing, true, true, ShuttingDown, "a lifecycle transition"},
		{"nats connection closed (live)", live["closed"], true, true, ShuttingDown, "a lifecycle transition"},
		{"nats connection draining", nats.ErrConnectionDraining, true, true, ShuttingDown, "a lifecycle transition"},
		{"hub refused: shutting down", ErrHubShuttingDown, true, true, ShuttingDown, "refused before acceptance"},
		{"hub refused: not the owner", ErrNotOwner, true, true, ShuttingDown, "refused before acceptance"},
		{"hub refused: activation failed", ErrActivationFailed, false, false, Unavailable, "the hub cannot be built"},
		{"hub refused: storm breaker", ErrStormBreaker, false, false, Ignored, "resending feeds the overload it reports"},
		{"hub refused: inbox full", ErrInboxFull, false, false, Ignored, "resending feeds the overload it reports"},
		{"hub refused: bad request", ErrBadRequest, false, false, Failed, "terminal"},
		{"hub refused: handler error", ErrHandler, false, false, Failed, "terminal"},
		{"hub refused: unknown kind", ErrUnknownKind, false, false, Failed, "terminal"},
		{"invalid address", ErrInvalidAddress, false, false, Failed, "returned before anything is sent"},
		{"payload over max_payload", ErrPayloadTooLarge, false, false, Failed, "returned before anything is sent"},
		{"payload over max_payload (live)", live["maxpayload"], false, false, Failed, "returned before anything is sent"},
		{"caller cancelled", context.Canceled, false, false, Failed, "the caller chose"},
		{"caller cancelled (live)", live["canceled"], false, false, Failed, "the caller chose"},
		{"unrecognised error", errors.New("boom"), false, false, Failed, "unknown errors are terminal"},
	}
}

// provoke makes real nats.go errors against an in-process server.
func provoke(t *testing.T) map[string]error {
	s := natstest.RunServer(t, natstest.WithMaxPayload(1024))
	nc := natstest.Connect(t, s)
	live := map[string]error{}

	_, live["noresponders"] = nc.Request("nobody.listens", nil, 2*time.Second)

	sub, err := nc.SubscribeSync("never.answers")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, live["timeout"] = nc.RequestWithContext(ctx, "never.answers", nil)
	cancel()

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	_, live["canceled"] = nc.RequestWithContext(ctx, "never.answers", nil)

	_, live["maxpayload"] = nc.Request("never.answers", make([]byte, 2048), time.Second)

	nc2, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	nc2.Close()
	_, live["closed"] = nc2.Request("never.answers", nil, time.Second)

	for k, v := range live {
		if v == nil {
			t.Fatalf("provoking %s produced no error", k)
		}
	}
	return live
}

func check(t *testing.T, name string, err error, want row) {
	t.Helper()
	if got := IsTransient(err); got != want.transient {
		t.Errorf("%s: IsTransient(%v) = %v, want %v (%s)", name, err, got, want.transient, want.why)
	}
	if got := IsResendable(err); got != want.resendable {
		if got && !want.resendable && want.transient {
			t.Errorf("%s: IsResendable(%v) = true, want false: the callee may still hold the request (%s)", name, err, want.why)
		} else {
			t.Errorf("%s: IsResendable(%v) = %v, want %v (%s)", name, err, got, want.resendable, want.why)
		}
	}
	if got := Classify(err); got != want.class {
		t.Errorf("%s: Classify(%v) = %v, want %v (%s)", name, err, got, want.class, want.why)
	}
}

// TestLadder pins every DESIGN §3 row in both directions: each asserts all
// three predicates, so both a widening and a narrowing fail.
func TestLadder(t *testing.T) {
	for _, r := range table(provoke(t)) {
		check(t, r.name, r.err, r)
		check(t, r.name+" wrapped", fmt.Errorf("leg 3 to n.7: %w", r.err), r)
		check(t, r.name+" double-wrapped", fmt.Errorf("deliver: %w", fmt.Errorf("leg: %w", r.err)), r)
		check(t, r.name+" joined alone", errors.Join(r.err), r)
	}
	// The ladder is nested: ShuttingDown ⊆ resendable ⊆ transient.
	for _, r := range table(provoke(t)) {
		if r.class == ShuttingDown && !r.resendable || r.resendable && !r.transient {
			t.Errorf("table row %q breaks the ladder's nesting", r.name)
		}
	}
	if IsTransient(nil) || IsResendable(nil) || Classify(nil) != Accepted {
		t.Errorf("nil error: want not transient, not resendable, Accepted")
	}
}

func want(transient, resendable bool, class ErrorType, why string) row {
	return row{transient: transient, resendable: resendable, class: class, why: why}
}

// TestJoinedGraphs: a fact counts wherever it sits in a joined or wrapped
// graph, in both orders.
func TestJoinedGraphs(t *testing.T) {
	timeout := want(true, false, Failed, "a timeout anywhere in the graph: the callee may still hold the request")
	canceled := want(false, false, Failed, "the caller cancelled")
	type pair struct {
		other error
		want  row
	}
	for _, r := range table(provoke(t)) {
		pairs := []pair{{context.Canceled, canceled}}
		if r.transient {
			// Anything transient joined with a timeout is a timeout.
			pairs = append(pairs, pair{nats.ErrTimeout, timeout}, pair{fmt.Errorf("attempt 2: %w", context.DeadlineExceeded), timeout})
		}
		for _, p := range pairs {
			check(t, r.name+" ⋈ "+p.other.Error(), errors.Join(r.err, p.other), p.want)
			check(t, p.other.Error()+" ⋈ "+r.name, errors.Join(p.other, r.err), p.want)
			check(t, "wrapped join "+r.name, fmt.Errorf("deliver: %w", errors.Join(fmt.Errorf("a: %w", p.other), r.err)), p.want)
		}
	}
	// A terminal refusal anywhere stops the retry, in either order.
	ignored := want(false, false, Ignored, "a terminal refusal in the graph")
	check(t, "inbox full ⋈ no responders", errors.Join(ErrInboxFull, nats.ErrNoResponders), ignored)
	check(t, "no responders ⋈ inbox full", errors.Join(nats.ErrNoResponders, ErrInboxFull), ignored)
	// Precedence among terminals is by verdict, not position.
	failed := want(false, false, Failed, "Failed outranks Ignored")
	check(t, "bad request ⋈ inbox full", errors.Join(ErrBadRequest, ErrInboxFull), failed)
	check(t, "inbox full ⋈ bad request", errors.Join(ErrInboxFull, ErrBadRequest), failed)
	// Among resendables, ShuttingDown outranks Unavailable (keep recovery armed).
	sd := want(true, true, ShuttingDown, "a departed owner in the graph")
	check(t, "no placement ⋈ departed", errors.Join(ErrNoPlacement, ErrDeparted), sd)
	check(t, "departed ⋈ no placement", errors.Join(ErrDeparted, ErrNoPlacement), sd)
	// An unknown error joined with a resendable fact does not veto it.
	check(t, "boom ⋈ no responders", errors.Join(errors.New("boom"), nats.ErrNoResponders), sd)
}

func TestErrorMatchesSentinels(t *testing.T) {
	e := New(ReasonNotOwner, "not the owner of %s", "echo/x")
	e.Node = "b.4"
	if !errors.Is(e, ErrNotOwner) || errors.Is(e, ErrHubShuttingDown) {
		t.Errorf("errors.Is mismatch for %v", e)
	}
	if !errors.Is(fmt.Errorf("x: %w", e), ErrNotOwner) {
		t.Errorf("wrapped refusal does not match its sentinel")
	}
	if got := e.Error(); !strings.Contains(got, "ShuttingDown") || !strings.Contains(got, "b.4") {
		t.Errorf("Error() = %q", got)
	}
	withCause := &Error{Reason: ReasonDeparted, Message: "owner n.3 departed", Err: nats.ErrNoResponders}
	if !errors.Is(withCause, nats.ErrNoResponders) || !errors.Is(withCause, ErrDeparted) {
		t.Errorf("cause not reachable")
	}
	for r := ReasonUnknown; r < numReasons; r++ {
		if r.String() == "" || parseReason(r.String()) != r {
			t.Errorf("reason %d does not round-trip its name %q", r, r.String())
		}
	}
	for _, typ := range []ErrorType{Accepted, Failed, ShuttingDown, Unavailable, Ignored} {
		if back, ok := ParseErrorType(typ.String()); !ok || back != typ {
			t.Errorf("ErrorType %v does not round-trip", typ)
		}
	}
}

// An *Error whose cause is another *Error names one verdict, its own: an
// outcome-unknown Failed caused by a departure does not read
// "ShuttingDown" as well (a new user grepping logs misread it).
func TestErrorTextNamesOneVerdict(t *testing.T) {
	t.Parallel()
	departed := &Error{Reason: ReasonDeparted, Message: "owner o.7 departed (crash)", Node: "o.7"}
	e := &Error{Reason: ReasonOutcomeUnknown, Node: "o.7", Err: departed, Message: "accepted by o.7, then its owner departed before its response: the handler may have run"}
	want := "Failed: accepted by o.7, then its owner departed before its response: the handler may have run (node o.7): owner o.7 departed (crash) (node o.7)"
	if got := e.Error(); got != want {
		t.Errorf("text %q\nwant %q", got, want)
	}
	if got := (&Error{Reason: ReasonBadRequest, Message: "m", Err: errors.New("io")}).Error(); got != "Failed: m: io" {
		t.Errorf("text %q", got)
	}
}
