package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// fastMembership detects a silent node within about half a second. The
// tests that use it (directly or through clusterNode) do not call
// t.Parallel: among parallel tests a live node's heartbeat can stall past
// its 400 ms TTL on a loaded machine.
var fastMembership = MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 400 * time.Millisecond, VerifyInterval: 100 * time.Millisecond}

// steadyMembership is for tests of what holds while every node lives
// (placement, single activation under claim races): heartbeats as fast as
// fastMembership's, but a TTL no stall of a loaded machine outlasts, so
// that no node is expired under the load the test itself makes.
var steadyMembership = MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second}

// clusterNode starts a node with membership on s with a recorder for "rec".
func clusterNode(t *testing.T, s *server.Server, name string, rec *recorder, opts ...Option) (*Node, *nats.Conn) {
	t.Helper()
	return clusterNodeWith(t, s, name, rec, fastMembership, opts...)
}

// clusterNodeWith is clusterNode with membership settings mc.
func clusterNodeWith(t *testing.T, s *server.Server, name string, rec *recorder, mc MembershipConfig, opts ...Option) (*Node, *nats.Conn) {
	t.Helper()
	nc := natstest.Connect(t, s)
	return startTestNode(t, NodeConfig{Conn: nc, Name: name, Membership: &mc}, rec, opts...), nc
}

// startTestNode builds and starts a node from cfg, hosting rec's kind
// "rec" unless rec is nil, closed when the test ends.
func startTestNode(t *testing.T, cfg NodeConfig, rec *recorder, opts ...Option) *Node {
	t.Helper()
	n, err := NewNode(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if rec != nil {
		if err := n.Register("rec", rec.factory); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func waitMembers(t *testing.T, want int, nodes ...*Node) {
	t.Helper()
	natstest.Eventually(t, 10*time.Second, func() bool {
		for _, n := range nodes {
			if len(n.Members().Members()) != want {
				return false
			}
		}
		return true
	}, "every node sees %d members", want)
}

// activeOn maps each activated address to the nodes that host it.
func activeOn(nodes ...*Node) map[subjects.Address][]string {
	out := map[subjects.Address][]string{}
	for _, n := range nodes {
		for _, a := range n.Host().Addresses() {
			out[a] = append(out[a], n.ID().Name)
		}
	}
	return out
}

// sameGenerations fails t if any node rejoined under a new generation
// since ids were taken (it was declared gone: the test's load stalled it).
func sameGenerations(t *testing.T, ids []subjects.NodeID, nodes ...*Node) {
	t.Helper()
	for i, n := range nodes {
		if n.ID() != ids[i] {
			t.Errorf("%s rejoined as %s during the test", ids[i], n.ID())
		}
	}
}

func idsOf(nodes ...*Node) []subjects.NodeID {
	var out []subjects.NodeID
	for _, n := range nodes {
		out = append(out, n.ID())
	}
	return out
}

// TestOneActivationPerAddress: deliveries from every node, through the
// library and through the ingress, reach the one activation of each
// address. No node is expired meanwhile (steadyMembership), so every
// address must have exactly one activation at the end.
func TestOneActivationPerAddress(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	rec := newRecorder()
	a, _ := clusterNodeWith(t, s, "a", rec, steadyMembership)
	b, _ := clusterNodeWith(t, s, "b", rec, steadyMembership)
	c, _ := clusterNodeWith(t, s, "c", rec, steadyMembership)
	waitMembers(t, 3, a, b, c)
	ids := idsOf(a, b, c)
	defer sameGenerations(t, ids, a, b, c)
	const addrs = 60
	ctx := context.Background()
	plain := natstest.Connect(t, s)
	for i := 0; i < addrs; i++ {
		to := subjects.Address(fmt.Sprintf("rec/%d", i))
		for _, n := range []*Node{a, b, c} {
			if _, err := n.Deliver(ctx, Delivery{To: to}); err != nil {
				t.Fatalf("deliver %s from %s: %v", to, n.ID(), err)
			}
		}
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress(to, ""))
		r, err := plain.RequestMsg(m, 10*time.Second)
		if err != nil || r.Header.Get(verdict.HeaderVerdict) != "Accepted" {
			t.Fatalf("ingress %s: %v %v", to, err, r)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return rec.total() == 4*addrs }, "all handled")
	act := activeOn(a, b, c)
	spread := map[string]int{}
	for i := 0; i < addrs; i++ {
		on := act[subjects.Address(fmt.Sprintf("rec/%d", i))]
		if len(on) != 1 {
			t.Errorf("rec/%d active on %v", i, on)
			continue
		}
		spread[on[0]]++
	}
	t.Logf("placement of %d addresses: %v", addrs, spread)
	if len(spread) < 2 {
		t.Errorf("placement put every address on one node: %v", spread)
	}
}

// TestClaimRace: two nodes racing to activate the same 1 000 addresses get
// exactly one activation each. No node is expired meanwhile
// (steadyMembership: the race itself loads the machine).
func TestClaimRace(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	rec := newRecorder()
	a, _ := clusterNodeWith(t, s, "a", rec, steadyMembership)
	b, _ := clusterNodeWith(t, s, "b", rec, steadyMembership)
	waitMembers(t, 2, a, b)
	defer sameGenerations(t, idsOf(a, b), a, b)
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for _, h := range []*hub.Host{a.Host(), b.Host()} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				release, err := h.Activate(context.Background(), subjects.Address(fmt.Sprintf("rec/%d", i)))
				if err == nil {
					release()
				} else if !errors.Is(err, verdict.ErrNotOwner) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	act := activeOn(a, b)
	if len(act) != n {
		t.Errorf("%d addresses active, want %d", len(act), n)
	}
	for addr, on := range act {
		if len(on) != 1 {
			t.Errorf("%s active on %v", addr, on)
		}
	}
	if a.Directory().Owned()+b.Directory().Owned() != n {
		t.Errorf("claims: %d + %d", a.Directory().Owned(), b.Directory().Owned())
	}
}

// TestPromptFailureOnDeparture: requests awaiting responses from a node that
// dies fail with the outcome-unknown departed verdict once membership
// notices — not at their timeout — and are not re-sent; deliveries after it
// succeed elsewhere.
func TestPromptFailureOnDeparture(t *testing.T) {
	s := natstest.RunServer(t)
	recA, recB := newRecorder(), newRecorder()
	a, _ := clusterNode(t, s, "a", recA)
	b, bConn := clusterNode(t, s, "b", recB)
	waitMembers(t, 2, a, b)
	block := make(chan struct{})
	defer close(block)
	recB.fn = func(ctx context.Context, d *hub.Delivery) error {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil
	}
	// An address owned by b.
	var target subjects.Address
	for i := 0; ; i++ {
		target = subjects.Address(fmt.Sprintf("rec/p%d", i))
		if n, _ := directory.Place(target, []subjects.NodeID{a.ID(), b.ID()}); n == b.ID() {
			break
		}
	}
	const reqs = 20
	results := make(chan error, reqs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < reqs; i++ {
		go func() {
			_, err := a.Request(ctx, Delivery{To: target, Stream: subjects.Stream(fmt.Sprint(i))})
			results <- err
		}()
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return recB.total() >= 1 }, "b handling")
	natstest.Eventually(t, 10*time.Second, func() bool { return b.Host().Stats().Accepted == reqs }, "all accepted by b")
	killed := time.Now()
	bConn.Close() // b's link is gone: it stops heartbeating and answering
	b.Close()
	for i := 0; i < reqs; i++ {
		err := <-results
		if !errors.Is(err, verdict.ErrOutcomeUnknown) || !errors.Is(err, verdict.ErrDeparted) || verdict.IsResendable(err) || !verdict.IsTransient(err) || verdict.Classify(err) != verdict.Failed {
			t.Fatalf("request %d: %v; want the outcome-unknown departed verdict (accepted: not resendable)", i, err)
		}
	}
	took := time.Since(killed)
	t.Logf("%d awaited responses failed %v after the owner died (TTL %v)", reqs, took, fastMembership.TTL)
	if took > 2*(fastMembership.TTL+fastMembership.Heartbeat)+time.Second {
		t.Errorf("failure took %v", took)
	}
	// After the departure the address is placed on a again.
	r, err := a.Deliver(context.Background(), Delivery{To: target})
	if err != nil || r.Node != a.ID() {
		t.Fatalf("after departure: %+v %v", r, err)
	}
}

// TestFencingRejoin: a node whose registration is removed behind its back
// (declared gone) stops serving that generation and rejoins with a new one.
func TestFencingRejoin(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	a, _ := clusterNode(t, s, "a", rec)
	b, _ := clusterNode(t, s, "b", rec)
	waitMembers(t, 2, a, b)
	old := b.ID()
	if _, err := a.Deliver(context.Background(), Delivery{To: "rec/x"}); err != nil {
		t.Fatal(err)
	}
	// Declare b gone the way a survivor does after an advisory.
	js := mustKV(t, s)
	if err := js.Delete(context.Background(), old.Name); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return b.ID() != old && b.ID().Generation > old.Generation }, "b rejoined with a new generation")
	// The old generation's subject has no subscriber any more.
	plain := natstest.Connect(t, s)
	m := nats.NewMsg(subjects.DefaultPrefix.Delivery(old, "rec/x", ""))
	m.Header.Set("Mesh-Id", "to-old")
	if _, err := plain.RequestMsg(m, 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("old generation still answers: %v", err)
	}
	waitMembers(t, 2, a, b)
	if b.Status().Membership.Rejoins != 1 {
		t.Errorf("rejoins = %d", b.Status().Membership.Rejoins)
	}
	if st := b.Status().Membership; st.Fenced != 1 || st.Superseded != 0 {
		t.Errorf("fenced = %d, superseded = %d; want 1, 0", st.Fenced, st.Superseded)
	}
}

// TestClaimReverification: a claim deleted behind its owner's back is
// re-claimed; one overwritten by another node makes the owner stand down
// within the verification period.
func TestClaimReverification(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	a, _ := clusterNode(t, s, "a", rec)
	waitMembers(t, 1, a)
	if _, err := a.Deliver(context.Background(), Delivery{To: "rec/v"}); err != nil {
		t.Fatal(err)
	}
	dir := mustDir(t, s)
	key := subjects.EncodeToken("rec/v")
	if err := dir.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		e, err := dir.Get(context.Background(), key)
		return err == nil && len(e.Value()) > 0
	}, "claim re-created")
	if len(a.Host().Addresses()) != 1 {
		t.Fatal("the owner stood down after a deleted claim")
	}
	if _, err := dir.Put(context.Background(), key, []byte(`{"owner":"intruder.7"}`)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	natstest.Eventually(t, 5*time.Second, func() bool { return len(a.Host().Addresses()) == 0 }, "owner stood down")
	t.Logf("stood down %v after its claim was overwritten (verify every %v)", time.Since(start), fastMembership.VerifyInterval)
}

// TestDrainHandsOver: a drained node marks itself draining, settles, releases
// its claims and leaves; its addresses move to the survivors.
func TestDrainHandsOver(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	a, _ := clusterNode(t, s, "a", rec)
	b, _ := clusterNode(t, s, "b", rec)
	waitMembers(t, 2, a, b)
	var mine []subjects.Address
	for i := 0; len(mine) < 5; i++ {
		addr := subjects.Address(fmt.Sprintf("rec/d%d", i))
		if n, _ := directory.Place(addr, []subjects.NodeID{a.ID(), b.ID()}); n == b.ID() {
			mine = append(mine, addr)
			if _, err := a.Deliver(context.Background(), Delivery{To: addr}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if b.Directory().Owned() != 5 {
		t.Fatalf("b owns %d", b.Directory().Owned())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Deliver(context.Background(), Delivery{To: "rec/z"}); !errors.Is(err, verdict.ErrClosing) {
		t.Errorf("a drained node's own delivery: %v", err)
	}
	waitMembers(t, 1, a)
	for _, addr := range mine {
		r, err := a.Deliver(context.Background(), Delivery{To: addr})
		if err != nil || r.Node != a.ID() {
			t.Fatalf("%s after drain: %+v %v", addr, r, err)
		}
	}
}
