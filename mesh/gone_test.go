package mesh

import (
	"fmt"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestGoneMarksBounded: a standalone client (no cluster view) remembers
// the departures it is told (FailNode) in a bounded store, however many
// generations depart — here three times the bound in names, each through
// three generations, checked after every departure — and still knows the
// recent ones: a departed generation, and every older generation of its
// name (a newer generation registers only once the older ones are gone);
// a late notice of an older generation does not make the newer one's
// departure forgotten, and a newer generation is not taken for gone.
func TestGoneMarksBounded(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: ghost})
	marks := func() int {
		c.fl.mu.Lock()
		defer c.fl.mu.Unlock()
		return len(c.fl.gone)
	}
	names := 3 * maxGoneMarks
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		for _, gen := range []uint64{3, 5, 4} { // the last one a late notice
			c.FailNode(subjects.NodeID{Name: name, Generation: gen}, "test")
			if m := marks(); m > maxGoneMarks {
				t.Fatalf("after %d names: %d departure marks, the bound is %d", i+1, m, maxGoneMarks)
			}
		}
	}
	for i := names - maxGoneMarks/2; i < names; i++ { // the recent ones
		name := fmt.Sprintf("n%d", i)
		for gen := uint64(1); gen <= 6; gen++ {
			if got, want := c.knownGone(subjects.NodeID{Name: name, Generation: gen}), gen <= 5; got != want {
				t.Fatalf("%s.%d: known gone %v, want %v", name, gen, got, want)
			}
		}
	}
}
