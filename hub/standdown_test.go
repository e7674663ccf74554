package hub

import (
	"context"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestStandDownByToken (DESIGN §5, claims are tokens; issue 20): a
// stand-down names the token of the claim that was lost. A token that is
// not the activation's (an older activation's of the same address, or a
// made-up one) stands nothing down; the activation's own token stands it
// down at once — StandDown does not wait for a turn in progress (the
// verifier calls it) — and the claim is released when that turn returns,
// by that token.
func TestStandDownByToken(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaims(subjects.NodeID{Name: "a", Generation: 1})
	h, _ := claimHost(t, nc, g, Config{IdleTimeout: -1})
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	if err := h.Register("held", func(context.Context, subjects.Address) (Hub, error) {
		return HandlerFunc(func(context.Context, *Delivery) error {
			started <- struct{}{}
			<-release
			return nil
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	addr := subjects.Address("held/1")
	if err := <-send(nc, g.node, addr, "d1", "x"); err != nil {
		t.Fatal(err)
	}
	<-started
	g.mu.Lock()
	tok := g.held[addr]
	g.mu.Unlock()
	if tok.IsZero() {
		t.Fatal("no claim held")
	}
	for _, other := range []ClaimToken{{Addr: addr, ID: tok.ID + 100}, {Addr: addr, ID: tok.ID - 1, Rev: tok.Rev}} {
		h.StandDown(other)
		if len(h.Addresses()) != 1 {
			t.Fatalf("stand-down with a token not the activation's (%v, its own %v) removed it", other, tok)
		}
	}
	done := make(chan struct{})
	go func() { h.StandDown(tok); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("StandDown waited for the turn in progress")
	}
	if len(h.Addresses()) != 0 {
		t.Fatal("the activation holding the lost claim is still active")
	}
	if g.heldCount() != 1 {
		t.Fatal("the claim was released before the running turn returned")
	}
	close(release)
	natstest.Eventually(t, 5*time.Second, func() bool { return g.heldCount() == 0 }, "claim not released after the turn returned")
}
