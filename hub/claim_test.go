package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

	// pipelined: claimHost gives the host pipeGate{g}, a
	// PipelinedClaims, instead of g.
	pipelined bool

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

// newGateClaimsOn is newGateClaims of node h.1, pipelined or not.
func newGateClaimsOn(pipelined bool) *gateClaims {
	g := newGateClaims(subjects.NodeID{Name: "h", Generation: 1})
	g.pipelined = pipelined
	return g
}

// bothClaimPaths runs test on a host whose Claims is plain (a goroutine per
// claim) and on one whose Claims is pipelined (TryClaim first, then Claim
// when the plain case did not settle it).
func bothClaimPaths(t *testing.T, test func(t *testing.T, pipelined bool)) {
	t.Parallel()
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelined=%v", pipelined), func(t *testing.T) {
			t.Parallel()
			test(t, pipelined)
		})
	}
}

// pipeGate is gateClaims as a PipelinedClaims: TryClaim runs the gated
// claim on a goroutine of its own and reports it as the plain case, except
// for addresses whose name begins "fallback" (never the plain case, like a
// key that exists) and claims that failed (the host's Claim then runs, as
// it does after a directory's TryClaim that did not settle).
type pipeGate struct{ *gateClaims }

func (p pipeGate) TryClaim(ctx context.Context, addr subjects.Address, done func(Grant, bool)) {
	go func() {
		if strings.HasPrefix(addr.ID(), "fallback") {
			done(Grant{}, false)
			return
		}
		g, err := p.Claim(ctx, addr)
		done(g, err == nil)
	}()
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
	if g.pipelined {
		cfg.Claims = pipeGate{g}
	}
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
func TestClaimOffIntake(t *testing.T) { bothClaimPaths(t, testClaimOffIntake) }

func testClaimOffIntake(t *testing.T, pipelined bool) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaimsOn(pipelined)
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
func TestClaimParkBounds(t *testing.T) { bothClaimPaths(t, testClaimParkBounds) }

func testClaimParkBounds(t *testing.T, pipelined bool) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaimsOn(pipelined)
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
func TestClaimsPipelined(t *testing.T) { bothClaimPaths(t, testClaimsPipelined) }

func testClaimsPipelined(t *testing.T, pipelined bool) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaimsOn(pipelined)
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

// TestPipelinedClaimQueue: with a pipelined Claims and two claim slots, a
// burst of cold addresses — some settled by the plain case, some needing
// the whole claim (fallback) — all activate, each address's deliveries in
// arrival order, never more than two claims in flight; and a host closed
// with claims queued for a slot gives every parked delivery one resendable
// verdict and leaves nothing claimed or running.
func TestPipelinedClaimQueue(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	t.Run("burst", func(t *testing.T) {
		g := newGateClaimsOn(true)
		close(g.open)
		h, o := claimHost(t, nc, g, Config{ClaimConcurrency: 2})
		// Published in order on one connection (their arrival order),
		// each address's three interleaved with the others'.
		inbox := nc.NewInbox()
		verdicts := make(chan *nats.Msg, 90)
		sub, err := nc.ChanSubscribe(inbox+".*", verdicts)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		var addrs []subjects.Address
		for i := range 30 {
			addr := subjects.Address(fmt.Sprintf("fast/%d", i))
			if i%3 == 0 {
				addr = subjects.Address(fmt.Sprintf("fast/fallback-%d", i))
			}
			addrs = append(addrs, addr)
		}
		for j := range 3 {
			for i, addr := range addrs {
				m := nats.NewMsg(subjects.DefaultPrefix.Delivery(g.node, addr, ""))
				m.Header.Set(HeaderID, fmt.Sprintf("%d-%d", i, j))
				m.Data = []byte(fmt.Sprint(j))
				m.Reply = fmt.Sprintf("%s.%d-%d", inbox, i, j)
				if err := nc.PublishMsg(m); err != nil {
					t.Fatal(err)
				}
			}
		}
		for range 90 {
			select {
			case r := <-verdicts:
				if _, err := verdict.Decode(r.Header); err != nil {
					t.Fatalf("delivery %s: %v", r.Subject, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("not every delivery was answered")
			}
		}
		for _, addr := range addrs {
			natstest.Eventually(t, 5*time.Second, func() bool { return len(o.handled(addr)) == 3 }, "%s handled", addr)
			if got := o.handled(addr); !slices.Equal(got, []string{"0", "1", "2"}) {
				t.Fatalf("%s handled %v", addr, got)
			}
		}
		g.mu.Lock()
		peak := g.peak
		g.mu.Unlock()
		if peak > 2 {
			t.Fatalf("peak claims in flight %d, over the bound 2", peak)
		}
		if st := h.Stats(); st.Claiming != 0 || st.Parked != 0 || st.Activations != 30 || g.heldCount() != 30 {
			t.Fatalf("after: %+v, held %d", st, g.heldCount())
		}
	})
	t.Run("close", func(t *testing.T) {
		// send's first request starts nc's response subscription (a
		// goroutine for the connection's life): start it before the
		// snapshot, so the leak check does not count it.
		_, _ = nc.Request("warmup.none", nil, time.Second)
		before := natstest.SnapshotGoroutines()
		g := newGateClaimsOn(true)
		cfg := Config{Conn: nc, Node: g.node, Claims: pipeGate{g}, ClaimConcurrency: 1}
		h, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_ = h.Register("slow", (&orderHub{got: map[subjects.Address][]string{}}).factory)
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		var chs []<-chan error
		for i := range 10 {
			chs = append(chs, send(nc, g.node, subjects.Address(fmt.Sprintf("slow/%d", i)), fmt.Sprint(i), ""))
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return h.Stats().Parked == 10 }, "parked")
		h.Close()
		for i, ch := range chs {
			if err := <-ch; err == nil || !verdict.IsResendable(err) {
				t.Fatalf("parked delivery %d after Close: %v", i, err)
			}
		}
		if st := h.Stats(); st.Claiming != 0 || st.Parked != 0 || st.Activations != 0 || g.heldCount() != 0 {
			t.Fatalf("after Close: %+v, held %d", st, g.heldCount())
		}
		natstest.NoGoroutineLeak(t, before, 0, 5*time.Second)
	})
}

// TestClaimFailureRefusesParked: a failed claim refuses every parked
// delivery once with the resendable directory verdict, and holds nothing.
func TestClaimFailureRefusesParked(t *testing.T) { bothClaimPaths(t, testClaimFailureRefusesParked) }

func testClaimFailureRefusesParked(t *testing.T, pipelined bool) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaimsOn(pipelined)
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
	bothClaimPaths(t, testActivateDrainingReleasesClaim)
}

func testActivateDrainingReleasesClaim(t *testing.T, pipelined bool) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	for _, explicit := range []bool{false, true} {
		t.Run(fmt.Sprintf("explicit=%v", explicit), func(t *testing.T) {
			g := newGateClaimsOn(pipelined)
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
			// Released before the verdict, or (pipelined: the claim ends
			// on the pipeline's goroutine, which never blocks on the
			// network) right after it.
			natstest.Eventually(t, 5*time.Second, func() bool { return g.heldCount() == 0 }, "claims held after a draining activation: %d", g.heldCount())
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
	before := natstest.SnapshotGoroutines()
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
	natstest.NoGoroutineLeak(t, before, 2, 5*time.Second)
}

// TestDeactivateWaitsForTheTurn: Deactivate blocks while a turn of the
// address runs (no second activation may start beside it) and returns
// once that turn returns, deactivating the hub exactly once; a Deactivate
// of an idle activation returns at once. Repeated, at every moment of the
// turn's end relative to the wait.
func TestDeactivateWaitsForTheTurn(t *testing.T) {
	t.Parallel()
	var c deactCounter
	release := make(chan chan struct{}, 1)
	h, nc, node := kindHost(t, "turn", func(context.Context, subjects.Address) (Hub, error) {
		return blockingHub{&c, release}, nil
	})
	for i := range 20 {
		addr := subjects.Address(fmt.Sprintf("turn/a%d", i))
		gate := make(chan struct{})
		release <- gate
		if err := <-send(nc, node, addr, fmt.Sprintf("d%d", i), ""); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return len(release) == 0 }, "the turn started")
		before := c.deactivated.Load()
		done := make(chan struct{})
		go func() { h.Deactivate(addr); close(done) }()
		select {
		case <-done:
			t.Fatalf("round %d: Deactivate returned while the turn ran", i)
		default:
		}
		close(gate)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Deactivate still waiting after the turn returned", i)
		}
		if n := c.deactivated.Load() - before; n != 1 {
			t.Fatalf("round %d: deactivated %d times", i, n)
		}
		h.Deactivate(addr) // gone already: returns at once
	}
}

// blockingHub's turn takes a gate from release and waits until it is
// closed.
type blockingHub struct {
	c       *deactCounter
	release chan chan struct{}
}

func (b blockingHub) Handle(context.Context, *Delivery) error {
	<-<-b.release
	return nil
}
func (b blockingHub) Deactivate(context.Context) { b.c.deactivated.Add(1) }

// TestActivateWaitsForTheClosingTurn: Activate of an address whose
// activation Deactivate closed, while that activation's last turn still
// runs, waits (on a signal, not a poll) until Deactivate took it out of the
// host, and then activates it anew: the new activation never exists beside
// the old one's running turn.
func TestActivateWaitsForTheClosingTurn(t *testing.T) {
	t.Parallel()
	var c deactCounter
	release := make(chan chan struct{}, 1)
	h, nc, node := kindHost(t, "turn", func(context.Context, subjects.Address) (Hub, error) {
		return blockingHub{&c, release}, nil
	})
	current := func(addr subjects.Address) *activation {
		h.mu.RLock()
		defer h.mu.RUnlock()
		return h.activations[addr]
	}
	for i := range 20 {
		addr := subjects.Address(fmt.Sprintf("turn/a%d", i))
		gate := make(chan struct{})
		release <- gate
		if err := <-send(nc, node, addr, fmt.Sprintf("d%d", i), ""); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return len(release) == 0 }, "the turn started")
		old := current(addr)
		deactivated := make(chan struct{})
		go func() { h.Deactivate(addr); close(deactivated) }()
		natstest.Eventually(t, 5*time.Second, func() bool {
			old.mu.Lock()
			defer old.mu.Unlock()
			return old.state == stateClosed
		}, "round %d: the activation closed", i)
		type result struct {
			release func()
			err     error
		}
		activated := make(chan result, 1)
		go func() {
			rel, err := h.Activate(context.Background(), addr)
			activated <- result{rel, err}
		}()
		select {
		case r := <-activated:
			t.Fatalf("round %d: Activate returned (err %v) while the closed activation's turn ran", i, r.err)
		case <-time.After(20 * time.Millisecond): // the wait holds; it is woken by a signal, not by this
		}
		close(gate)
		r := <-activated
		if r.err != nil {
			t.Fatalf("round %d: Activate: %v", i, r.err)
		}
		if a := current(addr); a == nil || a == old {
			t.Fatalf("round %d: Activate returned the closed activation (or none)", i)
		}
		<-deactivated
		r.release()
	}
}

// overlapHub counts the turns of its address running at once across its
// activations (shared), and blocks the delivery typed "block" until gate
// closes; then it watches for a second turn of the address for a while.
type overlapHub struct {
	running, worst *atomic.Int64
	gate           chan struct{}
	handled        chan string
}

func (o overlapHub) Handle(_ context.Context, d *Delivery) error {
	n := o.running.Add(1)
	defer o.running.Add(-1)
	for {
		w := o.worst.Load()
		if n <= w || o.worst.CompareAndSwap(w, n) {
			break
		}
	}
	if d.Type == "block" {
		<-o.gate
		// A turn of a successor activation that was let start beside
		// this one would be running by now.
		natstest.Poll(200*time.Millisecond, func() bool {
			if r := o.running.Load(); r > 1 {
				o.worst.Store(r)
				return true
			}
			return false
		})
	}
	o.handled <- d.ID
	return nil
}

// TestStoodDownTurnBlocksTheNextActivation: an activation stood down
// (StandDown: its claim was lost, decided on the verifier, which never
// waits for a turn) while a turn of it still runs is out of the host at
// once, and a delivery arriving then builds the address's next activation
// on this node — which must not run a turn until the stood-down one's last
// turn returned and it deactivated: two turns of one address never overlap
// on a node (DESIGN §5). Before, the next activation ran beside it (found
// by TestLeaseServerPartition: a state save stuck 10 s in a partition, and
// 95 turns of the successor under it).
func TestStoodDownTurnBlocksTheNextActivation(t *testing.T) {
	t.Parallel()
	var running, worst atomic.Int64
	gate := make(chan chan struct{}, 1)
	handled := make(chan string, 16)
	h, nc, node := kindHost(t, "ov", func(context.Context, subjects.Address) (Hub, error) {
		return overlapHub{&running, &worst, <-gate, handled}, nil
	})
	for i := range 10 {
		addr := subjects.Address(fmt.Sprintf("ov/a%d", i))
		g := make(chan struct{})
		gate <- g
		m := nats.NewMsg(subjects.DefaultPrefix.Delivery(node, addr, ""))
		m.Header.Set(HeaderID, fmt.Sprintf("b%d", i))
		m.Header.Set(HeaderType, "block")
		if _, err := nc.RequestMsg(m, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return running.Load() == 1 }, "round %d: the blocking turn runs", i)
		h.StandDown(ClaimToken{Addr: addr})
		gate <- g // the successor's hub shares the gate (it never blocks: its delivery is not "block")
		if err := <-send(nc, node, addr, fmt.Sprintf("n%d", i), ""); err != nil {
			t.Fatalf("round %d: the delivery after the stand-down: %v", i, err)
		}
		close(g)
		for _, want := range []string{fmt.Sprintf("b%d", i), fmt.Sprintf("n%d", i)} {
			select {
			case id := <-handled:
				if id != want {
					t.Fatalf("round %d: handled %s, want %s next", i, id, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: %s never handled", i, want)
			}
		}
		if w := worst.Load(); w > 1 {
			t.Fatalf("round %d: %d turns of %s ran at once on one node", i, w, addr)
		}
		// The counters are shared by every address: a turn reports its
		// delivery handled before it returns, so this round's last turn
		// may still be counted running when the next round's turn starts
		// (seen under load: "round 6: 2 turns of ov/a6 ran at once").
		natstest.Eventually(t, 5*time.Second, func() bool { return running.Load() == 0 }, "round %d: every turn returned", i)
	}
}

// kindHost starts a host of node h.1 on a fresh in-process server with one
// kind registered, closed when the test ends.
func kindHost(t *testing.T, kind string, f Factory) (*Host, *nats.Conn, subjects.NodeID) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	node := subjects.NodeID{Name: "h", Generation: 1}
	h, err := New(Config{Conn: nc, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Register(kind, f)
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, nc, node
}
