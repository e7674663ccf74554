package mesh

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// overlapHub counts the turns of each address running at once, on any
// node: more than one is two activations serving (DESIGN §5 "at most one
// live activation per address", "Turns: one delivery at a time").
type overlapHub struct {
	mu       sync.Mutex
	running  map[subjects.Address]int
	overlaps []string
	handled  map[string]int
	block    map[string]chan struct{} // delivery ID -> released when closed
	entered  map[string]chan struct{} // delivery ID -> closed when its turn starts
}

func newOverlapHub() *overlapHub {
	return &overlapHub{running: map[subjects.Address]int{}, handled: map[string]int{}, block: map[string]chan struct{}{}, entered: map[string]chan struct{}{}}
}

func (o *overlapHub) hold(id string) (entered, release chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.block[id] = make(chan struct{})
	o.entered[id] = make(chan struct{})
	return o.entered[id], o.block[id]
}

func (o *overlapHub) factory(node string) hub.Factory {
	return func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			o.mu.Lock()
			o.running[d.To]++
			if n := o.running[d.To]; n > 1 {
				o.overlaps = append(o.overlaps, fmt.Sprintf("%s: turn of %s on %s while %d other turn(s) of the address run", d.To, d.ID, node, n-1))
			}
			o.handled[d.ID]++
			blk, ent := o.block[d.ID], o.entered[d.ID]
			o.mu.Unlock()
			if ent != nil {
				close(ent)
			}
			if blk != nil {
				<-blk
			}
			o.mu.Lock()
			o.running[d.To]--
			o.mu.Unlock()
			return nil
		}), nil
	}
}

// TestBreakDeactivateUnderRunningTurn: Host.Deactivate (used by sync-stream
// subscribers, tests, operators) removes the activation from the host
// before the turn in progress returns. A delivery for the same address
// arriving meanwhile builds a second activation on the same node, which
// re-adopts the claim the first still holds, and its turn runs while the
// first activation's handler is still running: two activations of one
// address serving at once (DESIGN §5), one node, no fault at all.
func TestDeactivateWaitsForTheRunningTurn(t *testing.T) {
	t.Parallel()
	for _, withClaims := range []bool{false, true} {
		t.Run(fmt.Sprintf("claims=%v", withClaims), func(t *testing.T) {
			s := natstest.RunServer(t)
			oh := newOverlapHub()
			cfg := NodeConfig{Conn: natstest.Connect(t, s), Name: "a"}
			if withClaims {
				mc := steadyMembership
				cfg.Membership = &mc
			}
			n, err := NewNode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.Register("ov", oh.factory("a")); err != nil {
				t.Fatal(err)
			}
			if err := n.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			if withClaims {
				waitMembers(t, 1, n)
			}
			const addr = subjects.Address("ov/x")
			entered, release := oh.hold("first")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := n.Client.Deliver(ctx, Delivery{ID: "first", To: addr}); err != nil {
				t.Fatal(err)
			}
			<-entered // the first turn runs (and blocks)
			var deactivated atomic.Bool
			go func() {
				n.Host().Deactivate(addr) // "blocks until a handler in progress returns"
				deactivated.Store(true)
			}()
			// Deliveries while Deactivate waits for the first turn: those
			// that arrive before it closed the activation are accepted and
			// fail late (not handled); the first one after is refused
			// resendable — no second activation beside the running turn —
			// and retried until the first turn returned.
			retries := n.Client.Stats().Retries
			probes := make(chan error, 1)
			var stopProbes atomic.Bool
			go func() {
				for i := 0; ; i++ {
					if _, err := n.Client.Deliver(ctx, Delivery{ID: fmt.Sprintf("probe-%d", i), To: addr}); err != nil || stopProbes.Load() {
						probes <- err
						return
					}
				}
			}()
			natstest.Eventually(t, 10*time.Second, func() bool { return n.Client.Stats().Retries > retries }, "a delivery refused while the first turn runs: %v", lazyString(func() string { return fmt.Sprintf("%+v", n.Status().Host) }))
			if deactivated.Load() {
				t.Fatal("Deactivate returned while the turn in progress runs")
			}
			stopProbes.Store(true)
			close(release)
			if err := <-probes; err != nil {
				t.Fatalf("probe: %v", err)
			}
			_, release2 := oh.hold("second")
			close(release2)
			if _, err := n.Client.Deliver(ctx, Delivery{ID: "second", To: addr}); err != nil {
				t.Fatalf("second: %v", err)
			}
			natstest.Eventually(t, 5*time.Second, deactivated.Load, "Deactivate returned")
			natstest.Eventually(t, 5*time.Second, func() bool {
				oh.mu.Lock()
				defer oh.mu.Unlock()
				return oh.handled["second"] == 1
			}, "second handled")
			oh.mu.Lock()
			defer oh.mu.Unlock()
			for _, o := range oh.overlaps {
				t.Error(o)
			}
		})
	}
}

type lazyString func() string

func (f lazyString) String() string { return f() }
