package hub

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestIdleCollectionReleasesEveryClaim: one collection that finds many
// idle activations deactivates them several at a time — each hub's
// Deactivate runs once and each claim is released by its own token — and
// every address activates again (claiming anew) on its next delivery,
// over three rounds of collection.
func TestIdleCollectionReleasesEveryClaim(t *testing.T) {
	const n = 200
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaims(subjects.NodeID{Name: "a", Generation: 1})
	h, _ := claimHost(t, nc, g, Config{IdleTimeout: 40 * time.Millisecond})
	var mu sync.Mutex
	deact := map[subjects.Address]int{}
	if err := h.Register("idle", func(_ context.Context, addr subjects.Address) (Hub, error) {
		return deactivatorHub{addr: addr, onDeactivate: func(a subjects.Address) {
			mu.Lock()
			deact[a]++
			mu.Unlock()
		}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	for round := 1; round <= 3; round++ {
		var errs []<-chan error
		for i := range n {
			addr := subjects.Address(fmt.Sprintf("idle/%d", i))
			errs = append(errs, send(nc, g.node, addr, fmt.Sprintf("r%d-%d", round, i), "x"))
		}
		for i, ch := range errs {
			if err := <-ch; err != nil {
				t.Fatalf("round %d, delivery %d: %v", round, i, err)
			}
		}
		natstest.Eventually(t, 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(deact) == n && g.heldCount() == 0 && h.Stats().Activations == 0
		}, "round %d: %d activations collected and their claims released", round, n)
		mu.Lock()
		for addr, c := range deact {
			if c != round {
				t.Errorf("round %d: %s deactivated %d times", round, addr, c)
			}
		}
		mu.Unlock()
	}
	if d := h.Stats().Deactivated; d != 3*n {
		t.Errorf("Deactivated = %d, want %d", d, 3*n)
	}
}

// deactivatorHub accepts everything and reports its Deactivate.
type deactivatorHub struct {
	addr         subjects.Address
	onDeactivate func(subjects.Address)
}

func (deactivatorHub) Handle(context.Context, *Delivery) error { return nil }

func (d deactivatorHub) Deactivate(context.Context) { d.onDeactivate(d.addr) }
