package hub

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// gateClaims is a Claims whose claims of addresses of kind "slow" wait for
// open; it counts claims held and the most in flight at once.
type gateClaims struct {
	node subjects.NodeID
	open chan struct{}
	// onClaim, if set, runs inside Claim after the gate.
	onClaim func(subjects.Address)

	mu       sync.Mutex
	held     map[subjects.Address]ClaimToken
	next     uint64
	inFlight int
	peak     int
}

func newGateClaims(node subjects.NodeID) *gateClaims {
	return &gateClaims{node: node, open: make(chan struct{}), held: map[subjects.Address]ClaimToken{}}
}

func (g *gateClaims) Claim(ctx context.Context, addr subjects.Address) (Grant, error) {
	g.mu.Lock()
	g.inFlight++
	g.peak = max(g.peak, g.inFlight)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight--
		g.mu.Unlock()
	}()
	if addr.Kind() == "slow" {
		select {
		case <-g.open:
		case <-ctx.Done():
			return Grant{}, ctx.Err()
		}
	}
	if g.onClaim != nil {
		g.onClaim(addr)
	}
	g.mu.Lock()
	g.next++
	tok := ClaimToken{Addr: addr, ID: g.next, Rev: g.next}
	g.held[addr] = tok
	g.mu.Unlock()
	return Grant{Owner: g.node, Token: tok}, nil
}

func (g *gateClaims) Release(t ClaimToken) {
	g.mu.Lock()
	if g.held[t.Addr] == t {
		delete(g.held, t.Addr)
	}
	g.mu.Unlock()
}

func (g *gateClaims) heldCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held)
}

// orderHub records the payloads it handles per address.
type orderHub struct {
	mu  sync.Mutex
	got map[subjects.Address][]string
}

func (o *orderHub) factory(context.Context, subjects.Address) (Hub, error) {
	return HandlerFunc(func(_ context.Context, d *Delivery) error {
		o.mu.Lock()
		o.got[d.To] = append(o.got[d.To], string(d.Payload))
		o.mu.Unlock()
		return nil
	}), nil
}

func (o *orderHub) handled(addr subjects.Address) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.got[addr]...)
}

func claimHost(t *testing.T, nc *nats.Conn, g *gateClaims, cfg Config) (*Host, *orderHub) {
	t.Helper()
	cfg.Conn, cfg.Node, cfg.Claims = nc, g.node, g
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := &orderHub{got: map[subjects.Address][]string{}}
	for _, k := range []string{"slow", "fast"} {
		if err := h.Register(k, o.factory); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, o
}

// send requests one delivery asynchronously; the verdict arrives on the
// returned channel.
func send(nc *nats.Conn, node subjects.NodeID, addr subjects.Address, id, payload string) <-chan error {
	ch := make(chan error, 1)
	m := nats.NewMsg(subjects.DefaultPrefix.Delivery(node, addr, ""))
	m.Header.Set(HeaderID, id)
	m.Data = []byte(payload)
	go func() {
		r, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			ch <- err
			return
		}
		_, err = verdict.Decode(r.Header)
		ch <- err
	}()
	return ch
}

// TestClaimOffIntake: while a cold address's claim is in flight, deliveries
// to warm addresses are accepted and handled; the cold address's
// deliveries park unanswered, then are Accepted and handled in arrival
// order once the claim succeeds — each with one verdict.
func TestClaimOffIntake(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaims(subjects.NodeID{Name: "h", Generation: 1})
	h, o := claimHost(t, nc, g, Config{})
	if err := <-send(nc, g.node, "fast/warm", "w0", "0"); err != nil {
		t.Fatal(err)
	}
	var cold []<-chan error
	for i := range 20 {
		cold = append(cold, send(nc, g.node, "slow/cold", fmt.Sprintf("c%d", i), fmt.Sprint(i)))
		natstest.Eventually(t, 5*time.Second, func() bool { return h.Stats().Parked == i+1 }, "parked %d", i+1)
	}
	for i := 1; i <= 50; i++ {
		if err := <-send(nc, g.node, "fast/warm", fmt.Sprintf("w%d", i), fmt.Sprint(i)); err != nil {
			t.Fatalf("warm delivery %d while a claim is in flight: %v", i, err)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return len(o.handled("fast/warm")) == 51 }, "warm deliveries handled")
	for _, ch := range cold {
		select {
		case err := <-ch:
			t.Fatalf("a parked delivery was answered (%v) before its claim", err)
		default:
		}
	}
	close(g.open)
	for i, ch := range cold {
		if err := <-ch; err != nil {
			t.Fatalf("parked delivery %d: %v", i, err)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return len(o.handled("slow/cold")) == 20 }, "parked deliveries handled")
	for i, p := range o.handled("slow/cold") {
		if p != fmt.Sprint(i) {
			t.Fatalf("handled out of order: %v", o.handled("slow/cold"))
		}
	}
	if st := h.Stats(); st.Parked != 0 || st.Claiming != 0 || st.Accepted != 71 {
		t.Fatalf("stats after: %+v", st)
	}
}

// TestClaimParkBounds: past the per-address parking bound and past the
// node-wide backlog, deliveries are refused Ignored (inbox full) at once;
// the parked ones still get exactly one verdict each.
func TestClaimParkBounds(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaims(subjects.NodeID{Name: "h", Generation: 1})
	h, _ := claimHost(t, nc, g, Config{ParkPerAddress: 3, ParkBacklog: 5})
	var parked []<-chan error
	for i := range 3 {
		parked = append(parked, send(nc, g.node, "slow/a", fmt.Sprintf("a%d", i), ""))
		natstest.Eventually(t, 5*time.Second, func() bool { return h.Stats().Parked == i+1 }, "parked")
	}
	if err := <-send(nc, g.node, "slow/a", "a3", ""); !errors.Is(err, verdict.ErrInboxFull) || verdict.Classify(err) != verdict.Ignored {
		t.Fatalf("past the per-address bound: %v", err)
	}
	for i := range 2 {
		parked = append(parked, send(nc, g.node, subjects.Address(fmt.Sprintf("slow/b%d", i)), fmt.Sprintf("b%d", i), ""))
		natstest.Eventually(t, 5*time.Second, func() bool { return h.Stats().Parked == 4+i }, "parked")
	}
	if err := <-send(nc, g.node, "slow/c", "c", ""); !errors.Is(err, verdict.ErrInboxFull) {
		t.Fatalf("past the node backlog: %v", err)
	}
	if st := h.Stats(); st.ParkRefused != 2 {
		t.Fatalf("ParkRefused = %d", st.ParkRefused)
	}
	close(g.open)
	for i, ch := range parked {
		if err := <-ch; err != nil {
			t.Fatalf("parked %d: %v", i, err)
		}
	}
}

// TestClaimsPipelined: claims of many cold addresses are in flight at once.
func TestClaimsPipelined(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaims(subjects.NodeID{Name: "h", Generation: 1})
	h, _ := claimHost(t, nc, g, Config{ClaimConcurrency: 16})
	var chs []<-chan error
	for i := range 40 {
		chs = append(chs, send(nc, g.node, subjects.Address(fmt.Sprintf("slow/%d", i)), fmt.Sprint(i), ""))
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return h.Stats().Claiming == 40 }, "40 claims started")
	natstest.Eventually(t, 5*time.Second, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.inFlight == 16
	}, "16 claims in flight at once")
	close(g.open)
	for _, ch := range chs {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if g.peak != 16 {
		t.Fatalf("peak claims in flight %d, want 16 (the bound)", g.peak)
	}
}

// TestClaimFailureRefusesParked: a failed claim refuses every parked
// delivery once with the resendable directory verdict, and holds nothing.
func TestClaimFailureRefusesParked(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaims(subjects.NodeID{Name: "h", Generation: 1})
	h, _ := claimHost(t, nc, g, Config{})
	var chs []<-chan error
	for i := range 5 {
		chs = append(chs, send(nc, g.node, "slow/x", fmt.Sprint(i), ""))
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return h.Stats().Parked == 5 }, "parked")
	// No open: the claim times out (ClaimTimeout).
	for _, ch := range chs {
		if err := <-ch; !errors.Is(err, verdict.ErrDirectoryUnavailable) || !verdict.IsResendable(err) {
			t.Fatalf("parked delivery after a failed claim: %v", err)
		}
	}
	if st := h.Stats(); st.Activations != 0 || st.Parked != 0 || st.Claiming != 0 || g.heldCount() != 0 {
		t.Fatalf("after a failed claim: %+v, claims held %d", st, g.heldCount())
	}
}

// TestActivateDrainingReleasesClaim: a claim taken by a host that is found
// draining right after claiming is released (it used to leak), on both the
// parked path and the explicit Activate path.
func TestActivateDrainingReleasesClaim(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	for _, explicit := range []bool{false, true} {
		t.Run(fmt.Sprintf("explicit=%v", explicit), func(t *testing.T) {
			g := newGateClaims(subjects.NodeID{Name: "h", Generation: 1})
			h, _ := claimHost(t, nc, g, Config{})
			g.onClaim = func(subjects.Address) {
				h.mu.Lock()
				h.draining = true // a drain began while the claim was in flight
				h.mu.Unlock()
			}
			close(g.open)
			if explicit {
				if _, err := h.Activate(context.Background(), "fast/x"); verdict.Classify(err) != verdict.ShuttingDown {
					t.Fatalf("Activate while draining: %v", err)
				}
			} else if err := <-send(nc, g.node, "fast/x", "1", ""); verdict.Classify(err) != verdict.ShuttingDown {
				t.Fatalf("delivery while draining: %v", err)
			}
			if n := g.heldCount(); n != 0 {
				t.Fatalf("%d claims held after a draining activation", n)
			}
			if st := h.Stats(); st.Activations != 0 {
				t.Fatalf("activations: %+v", st)
			}
		})
	}
}

// deactivations counts hubs built and deactivated.
type deactCounter struct{ built, deactivated atomic.Int64 }

type countedHub struct{ c *deactCounter }

func (countedHub) Handle(context.Context, *Delivery) error { return nil }
func (h countedHub) Deactivate(context.Context)            { h.c.deactivated.Add(1) }

// TestBuildOutlivingCloseIsDeactivated: a hub whose build ignores its
// cancelled ctx and returns after Close gave up waiting is still
// deactivated, and its claim released; no goroutine is left behind.
func TestBuildOutlivingCloseIsDeactivated(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	before := runtime.NumGoroutine()
	g := newGateClaims(subjects.NodeID{Name: "h", Generation: 1})
	close(g.open)
	h, err := New(Config{Conn: nc, Node: g.node, Claims: g})
	if err != nil {
		t.Fatal(err)
	}
	var c deactCounter
	finish := make(chan struct{})
	_ = h.Register("slow", func(context.Context, subjects.Address) (Hub, error) {
		<-finish // ignores ctx
		c.built.Add(1)
		return countedHub{&c}, nil
	})
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	ch := send(nc, g.node, "slow/b", "1", "")
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
	h.closeWithin(50*time.Millisecond, nil, false) // gives up on the build
	if g.heldCount() != 1 || c.deactivated.Load() != 0 {
		t.Fatalf("before the build returned: claims %d, deactivated %d", g.heldCount(), c.deactivated.Load())
	}
	close(finish)
	natstest.Eventually(t, 5*time.Second, func() bool { return c.deactivated.Load() == 1 }, "the late hub deactivated")
	natstest.Eventually(t, 5*time.Second, func() bool { return g.heldCount() == 0 }, "its claim released")
	natstest.Eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= before+2 }, "goroutines back to %d (now %d)", before, runtime.NumGoroutine())
}
