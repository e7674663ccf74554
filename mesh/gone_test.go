package mesh

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// goneView is a cluster view for a standalone test client: the generations
// depart declared gone. Like a node's membership, it knows a departure
// before the client is told (depart: mark, then failNode), and a newer
// generation of a name makes the older ones gone.
type goneView struct {
	mu   sync.Mutex
	gone map[string]uint64 // by name: the newest generation gone
	asks map[subjects.NodeID]int
}

func newGoneView() *goneView {
	return &goneView{gone: map[string]uint64{}, asks: map[subjects.NodeID]int{}}
}

func (v *goneView) Gone(node subjects.NodeID) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.asks[node]++
	g, ok := v.gone[node.Name]
	return ok && node.Generation <= g
}

// mark declares node gone in the view only.
func (v *goneView) mark(node subjects.NodeID) {
	v.mu.Lock()
	if node.Generation > v.gone[node.Name] {
		v.gone[node.Name] = node.Generation
	}
	v.mu.Unlock()
}

// depart declares node gone and tells c, as a node's session does.
func (v *goneView) depart(c *Client, node subjects.NodeID, how string) {
	v.mark(node)
	c.failNode(node, how)
}

func (v *goneView) asked(node subjects.NodeID) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.asks[node]
}

// TestSenderConsultsView: a generation the injected cluster view reports
// gone gets no leg: work addressed to it fails at once with the resendable
// departed verdict (and is re-resolved), although the generation is in
// fact live and would accept it. Without the view consulted, x accepts.
func TestSenderConsultsView(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	x, recX := testNode(t, s, "x")
	y, _ := testNode(t, s, "y")
	view := newGoneView()
	view.mark(x.ID())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("no retries", func(t *testing.T) {
		c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: x.ID()}, WithView(view), WithRetry(RetryPolicy{MaxRetries: -1}))
		start := time.Now()
		r, err := c.Deliver(ctx, Delivery{To: "rec/a"})
		if !errors.Is(err, verdict.ErrDeparted) || !verdict.IsResendable(err) {
			t.Fatalf("delivery to a generation the view reports gone: %+v %v; want the resendable departed verdict", r, err)
		}
		if el := time.Since(start); el > DefaultLegTimeout/2 {
			t.Fatalf("the departed verdict took %v: not prompt", el)
		}
		if view.asked(x.ID()) == 0 {
			t.Fatal("the view was never asked about x")
		}
	})
	t.Run("re-resolved", func(t *testing.T) {
		res := newRouteResolver(func(_ subjects.Address, call int) subjects.NodeID {
			if call == 1 {
				return x.ID()
			}
			return y.ID()
		})
		c := newClient(t, natstest.Connect(t, s), res, WithView(view), WithRetry(RetryPolicy{MaxRetries: 3, Initial: time.Millisecond, Max: time.Millisecond}))
		r, err := c.Deliver(ctx, Delivery{To: "rec/b"})
		if err != nil || r.Node != y.ID() || r.Attempts != 2 {
			t.Fatalf("%+v %v; want accepted by %v at the second attempt", r, err, y.ID())
		}
	})
	if st := x.hostStats(); st.Accepted != 0 || recX.total() != 0 {
		t.Fatalf("x, reported gone, accepted %d and handled %d deliveries", st.Accepted, recX.total())
	}
}

// TestStandaloneClientStaticView: a client made with NewClient alone reads
// the static cluster view: deliveries to a node-hosted address get their
// verdicts (accepted, a Request's response, a refusal), and a departure
// notice (failNode, from whoever tells it) fails what is in flight but
// leaves no mark of its own — the client keeps no second liveness store,
// so the next delivery to that generation, alive after all, is sent and
// accepted. (It was failed departed at every attempt when the client
// remembered the notice.)
func TestStandaloneClientStaticView(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	rec.fn = func(_ context.Context, d *hub.Delivery) error {
		if d.Type == "fail" {
			return errors.New("handler says no")
		}
		return nil
	}
	n, _ := clusterNode(t, s, "host", rec)
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithRetry(RetryPolicy{MaxRetries: -1}))
	if _, ok := c.opts.view.(membership.Static); !ok {
		t.Fatalf("a standalone client's view is %T, want membership.Static", c.opts.view)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := c.Deliver(ctx, Delivery{To: "rec/a"}); err != nil || r.Node != n.ID() {
		t.Fatalf("deliver: %+v %v", r, err)
	}
	if _, err := c.Request(ctx, Delivery{To: "rec/a"}); err != nil {
		t.Fatalf("request: %v", err)
	}
	if _, err := c.Request(ctx, Delivery{To: "rec/a", Type: "fail"}); err == nil || verdict.IsResendable(err) {
		t.Fatalf("request the handler fails: %v, want its terminal verdict", err)
	}
	if _, err := c.Deliver(ctx, Delivery{To: "nobody/a"}); err == nil {
		t.Fatal("a delivery of a kind the node does not host was accepted")
	}

	c.failNode(n.ID(), "a stale notice")
	r, err := c.Deliver(ctx, Delivery{To: "rec/a"})
	if err != nil || r.Node != n.ID() {
		t.Fatalf("after a departure notice of a live generation: %+v %v; want accepted (the static view sees it not gone)", r, err)
	}
}
