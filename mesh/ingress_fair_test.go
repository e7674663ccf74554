package mesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// fairNode is a one-node mesh with 64 ingress slots whose resolver finds no
// node hosting kind "nope" (and waits a minute for one), hosting "rec"
// (records) and "gate" (handles nothing until the test ends), with two
// client connections.
func fairNode(t *testing.T, opts ...Option) (n *Node, victim, attacker *nats.Conn) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	id := subjects.NodeID{Name: "fair", Generation: 1}
	res := ResolverFunc(func(_ context.Context, addr subjects.Address) (subjects.NodeID, error) {
		if addr.Kind() == "nope" {
			return subjects.NodeID{}, &verdict.Error{Reason: verdict.ReasonNoPlacement, Message: `no live node hosts kind "nope"`}
		}
		return id, nil
	})
	n, err := NewNode(NodeConfig{
		Conn: nc, Name: id.Name, Generation: id.Generation, Resolver: res,
		IngressConcurrency: 64, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, append([]Option{WithPlacementWait(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	if err := n.Register("rec", rec.factory); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	if err := n.Register("gate", func(context.Context, subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			select {
			case <-gate:
			case <-ctx.Done():
			}
			return d.Respond(nil)
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	t.Cleanup(func() { close(gate) }) // runs first
	return n, natstest.Connect(t, s), natstest.Connect(t, s)
}

// victimAccepted sends k ingress deliveries to rec/victim from nc (its own
// inbox) and fails the test unless every one comes back Accepted.
func victimAccepted(t *testing.T, nc *nats.Conn, k int) {
	t.Helper()
	for i := range k {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("rec/victim", ""))
		m.Header.Set(hub.HeaderID, fmt.Sprintf("victim-%d-%s", i, nats.NewInbox()[7:]))
		r, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatalf("victim delivery %d: %v", i, err)
		}
		if _, err := verdict.Decode(r.Header); err != nil {
			t.Fatalf("victim delivery %d during another caller's flood: %v (headers %v)", i, err, r.Header)
		}
	}
}

// TestIngressFloodToUnhostedKind (issue 22, Why 5): a flood of
// fire-and-forget deliveries to a kind nobody hosts, each of which waits
// for placement, leaves another caller's deliveries Accepted: placement
// waits are bounded apart from the ingress slots, and a caller (here
// "anon") holds at most half of either pool. Before, the flood's 64
// deliveries held every ingress slot for the placement wait and the
// victim was answered Ignored.
func TestIngressFloodToUnhostedKind(t *testing.T) {
	t.Parallel()
	n, victim, attacker := fairNode(t)
	const flood = 256
	for i := range flood {
		if err := attacker.Publish(subjects.DefaultPrefix.Ingress(subjects.Address(fmt.Sprintf("nope/%d", i)), ""), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := attacker.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return n.Status().Ingress >= flood }, "flood not taken")
	victimAccepted(t, victim, 20)
	st := n.Status().IngressShares
	if st.PlacementHeld == 0 || st.PlacementHeld > n.placementPool.open || st.PlacementRefused == 0 {
		t.Errorf("placement waits %+v: want some held, at most %d, and the rest refused", st, n.placementPool.open)
	}
}

// TestIngressFloodOfRequests: one caller (its own inbox prefix) floods
// requests whose handler does not answer, each holding an ingress slot
// while its response is awaited; another caller's deliveries are still
// Accepted, and the flooder's surplus is answered Ignored (counted).
// Before, the flooder held all 64 slots and the victim was Ignored.
func TestIngressFloodOfRequests(t *testing.T) {
	t.Parallel()
	n, victim, attacker := fairNode(t)
	const flood = 200
	for i := range flood {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress(subjects.Address(fmt.Sprintf("gate/%d", i)), ""))
		m.Reply = fmt.Sprintf("_INBOX.mallory.c.%d", i)
		m.Header.Set(hub.HeaderExpectResponse, "true")
		if err := attacker.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := attacker.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return n.Status().Ingress >= flood }, "flood not taken")
	victimAccepted(t, victim, 20)
	if st := n.Status().IngressShares; st.ShareRefused < flood-int64(n.ingressPool.open) {
		t.Errorf("shares %+v: want the flooder's surplus (%d) refused", st, flood-n.ingressPool.open)
	}
}

// TestFairPool pins the share rule: a caller holds its share for sure and
// more only while under half the pool is held; the pool's map forgets
// callers that hold nothing.
func TestFairPool(t *testing.T) {
	t.Parallel()
	p := newFairPool(8, 2)
	for i := range 4 {
		if !p.acquire("a") {
			t.Fatalf("a's slot %d refused under half", i)
		}
	}
	if p.acquire("a") {
		t.Fatal("a took a fifth slot of 8 beyond its share of 2 at half")
	}
	for i := range 2 {
		if !p.acquire("b") {
			t.Fatalf("b's share slot %d refused", i)
		}
	}
	if p.acquire("b") {
		t.Fatal("b took beyond its share over half")
	}
	c1, c2 := p.acquire("c"), p.acquire("c")
	if !c1 || !c2 || p.acquire("d") {
		t.Fatal("c's share, then a full pool")
	}
	for range 4 {
		p.release("a")
	}
	p.release("b")
	p.release("b")
	p.release("c")
	p.release("c")
	if held, callers := p.usage(); held != 0 || callers != 0 {
		t.Fatalf("usage after releases: %d held by %d callers", held, callers)
	}
}

// TestIngressCallerRate: with a per-caller rate limit, a caller over its
// rate is answered Ignored (storm-breaker) and counted, and another
// caller's deliveries are still Accepted. The status lists both callers.
func TestIngressCallerRate(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: "rated", IngressCallerRate: 1, IngressCallerBurst: 5, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	if err := n.Register("rec", rec.factory); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	hot := natstest.Connect(t, s, nats.CustomInboxPrefix("_INBOX.hot"))
	var limited int
	for i := range 20 {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("rec/hot", ""))
		m.Header.Set(hub.HeaderID, fmt.Sprintf("hot-%d", i))
		r, err := hot.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := verdict.Decode(r.Header); err != nil {
			if !errors.Is(err, verdict.ErrStormBreaker) || verdict.Classify(err) != verdict.Ignored {
				t.Fatalf("hot caller's delivery %d: %v, want Ignored storm-breaker", i, err)
			}
			limited++
		}
	}
	if limited == 0 {
		t.Fatal("20 deliveries at once, a rate of 1/s with a burst of 5: none limited")
	}
	victimAccepted(t, natstest.Connect(t, s), 5)
	st := n.Status().IngressShares
	if st.RateLimited != int64(limited) {
		t.Errorf("RateLimited %d, want %d", st.RateLimited, limited)
	}
	byCaller := map[string]IngressCaller{}
	for _, c := range st.Busiest {
		byCaller[c.Caller] = c
	}
	if c := byCaller["inbox:_INBOX.hot"]; c.RateLimited != int64(limited) || c.Taken != int64(20-limited) {
		t.Errorf("hot caller's counts %+v (all %+v)", c, st.Busiest)
	}
	if c := byCaller["inbox:_INBOX"]; c.Taken != 5 {
		t.Errorf("victim's counts %+v (all %+v)", c, st.Busiest)
	}
}

// TestCallerRatesBounded: made-up callers beyond the tracked bound share
// one bucket; idle callers are forgotten to make room.
func TestCallerRatesBounded(t *testing.T) {
	t.Parallel()
	r := newCallerRates(1, 1)
	now := time.Unix(0, 0)
	for i := range maxRateCallers {
		if !r.allow(fmt.Sprint(i), now) {
			t.Fatalf("caller %d's first delivery refused", i)
		}
	}
	if !r.allow("new-1", now) || r.allow("new-2", now) {
		t.Fatal("untracked callers do not share one bucket")
	}
	if len(r.m) > maxRateCallers {
		t.Fatalf("%d callers tracked", len(r.m))
	}
	later := now.Add(2 * time.Second) // every bucket refilled: idle
	if !r.allow("new-3", later) || len(r.m) != 1 {
		t.Fatalf("idle callers not forgotten: %d tracked", len(r.m))
	}
}

// TestCallerCountsBounded: the counts name at most maxCountedCallers
// callers and list at most MaxListedCallers, the rest as OtherCallers.
func TestCallerCountsBounded(t *testing.T) {
	t.Parallel()
	var c callerCounts
	for i := range maxCountedCallers + 10 {
		c.add(fmt.Sprint(i), func(e *IngressCaller) { e.Taken++ })
	}
	if len(c.m) != maxCountedCallers+1 { // and OtherCallers
		t.Fatalf("%d callers counted by name", len(c.m))
	}
	list := c.busiest()
	if len(list) != MaxListedCallers || list[len(list)-1].Caller != OtherCallers {
		t.Fatalf("listed %d, last %+v", len(list), list[len(list)-1])
	}
	var sum int64
	for _, e := range list {
		sum += e.Taken
	}
	if sum != maxCountedCallers+10 {
		t.Fatalf("listed counts sum to %d", sum)
	}
}
