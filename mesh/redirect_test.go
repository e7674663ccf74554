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

// TestRedirectToOwner: a sender whose cached owner of an address is stale
// (the address moved to another live node meanwhile) meets "not the owner"
// naming the new owner, and re-sends there at once (DESIGN §5: "the sender
// re-resolves at once"; one attempt more, no back-off) and remembers it
// (the next delivery goes straight there). Nothing is handled on the old
// owner, which does not activate the address again. Addresses across the
// three nodes, each moved from its placement to the next node, sent from
// every node (the new owner's own sender included).
func TestRedirectToOwner(t *testing.T) {
	t.Parallel()
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
	for i := range 30 {
		addr := subjects.Address(fmt.Sprintf("rec/r%d", i))
		placed, ok := directory.Place(addr, a.Members().Hosting("rec"))
		if !ok {
			t.Fatal("no placement")
		}
		var old, owner *Node
		for j, n := range nodes {
			if n.ID() == placed {
				old, owner = n, nodes[(j+1)%len(nodes)]
			}
		}
		// Every sender learns the placed node as owner (the second
		// delivery of the first sender reads the claim the first made).
		for _, from := range append(nodes, nodes[0]) {
			if r, err := from.Deliver(ctx, Delivery{To: addr}); err != nil || r.Node != old.ID() {
				t.Fatalf("%s from %s: %+v %v; want accepted by %s", addr, from.ID(), r, err, old.ID())
			}
		}
		natstest.Eventually(t, 10*time.Second, func() bool {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(rec.handled[addr]) == len(nodes)+1
		}, "%s: the old owner's deliveries handled", addr)
		// The address moves: the old owner stands down, the new one holds it.
		old.Host().Deactivate(addr)
		var release func()
		natstest.Eventually(t, 10*time.Second, func() bool {
			var err error
			release, err = owner.Host().Activate(ctx, addr)
			return err == nil
		}, "%s: activating on %s after the old owner released it", addr, owner.ID())
		for _, from := range nodes {
			before := from.Client.Stats().Retries
			r, err := from.Deliver(ctx, Delivery{To: addr})
			if err != nil {
				t.Fatalf("%s from %s: %v", addr, from.ID(), err)
			}
			want := 2 // the stale owner refused, then the owner
			if from == owner || from == old {
				want = 1 // its own claim is in its cache; the old owner forgot its own
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
			return len(rec.handled[addr]) == 10
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
	}
}
