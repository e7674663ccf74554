package mesh

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestRedirectToOwner: a sender places an uncached address without reading
// the directory; where the address is not where placement puts it (held by
// another live generation: activated locally there), the placed node's
// claim refuses "not the owner" naming the owner, and the sender re-sends
// there at once (no back-off, one attempt more) and remembers it (the next
// delivery goes straight there). Nothing is ever handled on the placed node,
// and it does not activate the address. Addresses across the three nodes'
// placements, each sent from every node (the owner's own sender included).
func TestRedirectToOwner(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	a, _ := clusterNodeWith(t, s, "a", rec, steadyMembership)
	b, _ := clusterNodeWith(t, s, "b", rec, steadyMembership)
	c, _ := clusterNodeWith(t, s, "c", rec, steadyMembership)
	nodes := []*Node{a, b, c}
	waitMembers(t, 3, a, b, c)
	defer sameGenerations(t, idsOf(a, b, c), a, b, c)
	ids := map[subjects.NodeID]*Node{a.ID(): a, b.ID(): b, c.ID(): c}
	ctx := context.Background()
	moved := 0
	for i := range 30 {
		addr := subjects.Address(fmt.Sprintf("rec/r%d", i))
		placed, ok := directory.Place(addr, a.Members().Hosting("rec"))
		if !ok {
			t.Fatal("no placement")
		}
		// The owner: the next node after the placed one (so never it).
		var owner *Node
		for j, n := range nodes {
			if n.ID() == placed {
				owner = nodes[(j+1)%len(nodes)]
			}
		}
		release, err := owner.Host().Activate(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, from := range nodes {
			before := from.Client.Stats().Retries
			r, err := from.Deliver(ctx, Delivery{To: addr})
			if err != nil {
				t.Fatalf("%s from %s: %v", addr, from.ID(), err)
			}
			want := 2 // placed node refused, then the owner
			switch {
			case from == owner:
				want = 1 // its own claim is in its cache
			case from.ID() == placed && from != nodes[0]:
				want = 1 // its claim met the owner's when it refused an earlier sender
			}
			if r.Node != owner.ID() || r.Attempts != want {
				t.Fatalf("%s from %s: accepted by %s in %d attempts, want %s in %d", addr, from.ID(), r.Node, r.Attempts, owner.ID(), want)
			}
			if n := from.Client.Stats().Retries - before; n != 0 {
				t.Fatalf("%s from %s: %d re-sends after a back-off; the redirect must not back off", addr, from.ID(), n)
			}
			// Remembered: straight to the owner.
			if r, err := from.Deliver(ctx, Delivery{To: addr}); err != nil || r.Node != owner.ID() || r.Attempts != 1 {
				t.Fatalf("%s from %s again: %+v %v", addr, from.ID(), r, err)
			}
		}
		release()
		natstest.Eventually(t, 10*time.Second, func() bool {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(rec.handled[addr]) == 6
		}, "%s: not all handled", addr)
		for id, n := range ids {
			has := false
			for _, x := range n.Host().Addresses() {
				has = has || x == addr
			}
			if has != (id == owner.ID()) {
				t.Fatalf("%s active on %s: %v (owner %s)", addr, id, has, owner.ID())
			}
		}
		moved++
	}
	t.Logf("%d addresses redirected from their placement to their owner", moved)
}
