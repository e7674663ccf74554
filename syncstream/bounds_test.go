package syncstream_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// boundedOwners registers kind "bnd" on n: bare stream owners with at most
// perStream subscribers per stream and perCaller per caller.
func boundedOwners(t testing.TB, n *mesh.Node, perStream, perCaller int) *sync.Map {
	var owners sync.Map
	if err := n.Register("bnd", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		o := syncstream.NewOwner(n.Client, addr, func(subjects.Stream) []byte { return nil }, quiet)
		o.SetSubscriberLimits(perStream, perCaller)
		owners.Store(addr, o)
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			_, err := o.Handle(d)
			return err
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	return &owners
}

// TestSubscriberBounds (issue 22, Why 3: a lasting fan-out from one
// caller): an owner takes at most its bound of subscribers per caller (the
// subscribing node generation) and per stream; a subscribe beyond either
// is refused Ignored (inbox-full) and the subscription reports it, while
// subscribers already registered keep their frames, and another caller may
// still subscribe until the stream's bound. Before, every subscribe was
// registered.
func TestSubscriberBounds(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	owners := boundedOwners(t, owner, 3, 2)
	a, _ := startNode(t, s, "suba", false)
	b, _ := startNode(t, s, "subb", false)
	const addr = "bnd/x"
	subscribe := func(n *mesh.Node) error {
		ss, err := syncstream.Subscribe(context.Background(), n, addr, "", func(syncstream.Frame) {})
		if err == nil {
			t.Cleanup(ss.Stop)
		}
		return err
	}
	overBound := func(who string, err error) {
		t.Helper()
		if !errors.Is(err, verdict.ErrInboxFull) || verdict.Classify(err) != verdict.Ignored {
			t.Fatalf("%s: subscribe over the bound: %v, want Ignored inbox-full", who, err)
		}
	}
	for i := range 2 {
		if err := subscribe(a); err != nil {
			t.Fatalf("a's subscribe %d: %v", i, err)
		}
	}
	overBound("a's third (per caller)", subscribe(a))
	if err := subscribe(b); err != nil {
		t.Fatalf("b's first: %v", err)
	}
	overBound("b's second (per stream)", subscribe(b))
	v, _ := owners.Load(subjects.Address(addr))
	o := v.(*syncstream.Owner)
	if got := o.Subscribers(""); got != 3 {
		t.Fatalf("%d subscribers registered, want 3", got)
	}
	if got := o.Refused(); got != 2 {
		t.Fatalf("refused %d, want 2", got)
	}
}

// TestSubscribeFromOutsideCallerRefused: a subscribe delivery that an
// ingress forwarded (it carries an outside caller) is refused bad-request
// by the owner itself, so the epoch and version in its reply are told only
// to nodes — even if an ingress that does not refuse the protocol forwards
// one (an older node during an upgrade).
func TestSubscribeFromOutsideCallerRefused(t *testing.T) {
	t.Parallel()
	o := syncstream.NewOwner(nil, "bnd/y", func(subjects.Stream) []byte { return nil }, quiet)
	d := &hub.Delivery{To: "bnd/y", Type: syncstream.TypeSubscribe, Caller: "inbox:_INBOX.mallory",
		Payload: []byte(`{"subscriber":"_sub/m/1","stream":"","attempt":"x","format":1}`)}
	handled, err := o.Handle(d)
	if !handled || !errors.Is(err, verdict.ErrBadRequest) {
		t.Fatalf("handled %v, err %v; want a bad-request refusal", handled, err)
	}
	if o.Subscribers("") != 0 {
		t.Fatal("an outside caller's subscriber was registered")
	}
}
