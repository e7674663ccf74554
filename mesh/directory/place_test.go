package directory

import (
	"fmt"
	"testing"

	"github.com/natsmesh/natsmesh/subjects"
)

// TestPlaceRendezvous: every sender picks the same node whatever the order
// of candidates; load spreads; a departure moves only the departed node's
// addresses.
func TestPlaceRendezvous(t *testing.T) {
	t.Parallel()
	nodes := []subjects.NodeID{{Name: "a", Generation: 1}, {Name: "b", Generation: 1}, {Name: "c", Generation: 1}, {Name: "d", Generation: 1}}
	reversed := []subjects.NodeID{nodes[3], nodes[2], nodes[1], nodes[0]}
	const n = 4000
	count := map[string]int{}
	before := map[subjects.Address]subjects.NodeID{}
	for i := 0; i < n; i++ {
		addr := subjects.Address(fmt.Sprintf("k/%d", i))
		x, ok := Place(addr, nodes)
		y, _ := Place(addr, reversed)
		if !ok || x != y {
			t.Fatalf("%s: %v vs %v", addr, x, y)
		}
		count[x.Name]++
		before[addr] = x
	}
	for _, nd := range nodes {
		if c := count[nd.Name]; c < n/4*7/10 || c > n/4*13/10 {
			t.Errorf("node %s got %d of %d addresses", nd.Name, c, n)
		}
	}
	survivors := nodes[:3] // d departs
	moved := 0
	for addr, was := range before {
		now, _ := Place(addr, survivors)
		if was.Name != "d" && now != was {
			t.Fatalf("%s moved from %s to %s although %s is alive", addr, was, now, was)
		}
		if was.Name == "d" {
			moved++
		}
	}
	t.Logf("spread %v; %d addresses moved when d departed", count, moved)
	if _, ok := Place("k/x", nil); ok {
		t.Error("placement without candidates")
	}
}
