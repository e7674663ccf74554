package syncstream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
)

// subscribeCounter counts, per owner node generation, the subscribe
// deliveries its stream owners handled, and gives the latest owner of an
// address.
type subscribeCounter struct {
	mu    sync.Mutex
	subs  map[subjects.NodeID]int
	owner map[subjects.NodeID]*syncstream.Owner
}

func (c *subscribeCounter) register(t testing.TB, n *mesh.Node) {
	t.Helper()
	if err := n.Register("cnt", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		o := syncstream.NewOwner(n.Client, addr, func(subjects.Stream) []byte { return nil }, quiet)
		c.mu.Lock()
		c.owner[n.ID()] = o
		c.mu.Unlock()
		return &countedOwner{c: c, node: n.ID(), o: o}, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// countedOwner is a stream owner hub that counts the subscribes it handles
// and ends its streams when deactivated (as the kv hub does).
type countedOwner struct {
	c    *subscribeCounter
	node subjects.NodeID
	o    *syncstream.Owner
}

func (h *countedOwner) Handle(_ context.Context, d *hub.Delivery) error {
	if d.Type == syncstream.TypeSubscribe {
		h.c.mu.Lock()
		h.c.subs[h.node]++
		h.c.mu.Unlock()
	}
	_, err := h.o.Handle(d)
	return err
}

func (h *countedOwner) Deactivate(context.Context) { h.o.Close() }

func (c *subscribeCounter) count(n subjects.NodeID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subs[n]
}

func (c *subscribeCounter) ownerOn(n subjects.NodeID) *syncstream.Owner {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owner[n]
}

// TestOwnerRestartResubscribesOnce: the only node hosting a stream's owner
// stops and comes back under a new generation, again and again: each time
// the subscriber subscribes again exactly once to the new generation
// (DESIGN §7: once per owner change). The owner's stop is told twice — the
// activation ends its streams (a closed frame), then the node departs — and
// the second notice, coming while the subscriber's attempts fail (nobody
// hosts the kind for a moment), must not make it subscribe a second time
// once it has the new owner. Both ways a node stops: Close (its streams end
// as it closes), Drain (it leaves). A generation's count is final once it
// has stopped.
func TestOwnerRestartResubscribesOnce(t *testing.T) {
	t.Parallel()
	for _, stop := range []string{"close", "drain"} {
		t.Run(stop, func(t *testing.T) {
			t.Parallel() // each on its own server; the time is the subscriber's back-off
			s := natstest.RunServer(t)
			c := &subscribeCounter{subs: map[subjects.NodeID]int{}, owner: map[subjects.NodeID]*syncstream.Owner{}}
			start := func() (*mesh.Node, *nats.Conn) {
				nc, err := nats.Connect(s.ClientURL())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				mc := fast
				n, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "a", Membership: &mc, Logger: quiet, DisableControl: true}, mesh.WithLogger(quiet))
				if err != nil {
					t.Fatal(err)
				}
				c.register(t, n)
				if err := n.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { n.Close() })
				return n, nc
			}
			a, aConn := start()
			sub, _ := startNode(t, s, "sub", false)
			natstest.Eventually(t, 5*time.Second, func() bool { return len(sub.Members().Hosting("cnt")) == 1 }, "owner visible")
			ss, err := syncstream.Subscribe(context.Background(), sub, "cnt/x", "", func(syncstream.Frame) {})
			if err != nil {
				t.Fatal(err)
			}
			defer ss.Stop()
			const restarts = 4
			var gens []subjects.NodeID
			for k := 0; k <= restarts; k++ {
				gen := a.ID()
				gens = append(gens, gen)
				// Subscribed to this generation: its owner has one
				// subscriber and the subscriber follows its epoch.
				natstest.Eventually(t, 30*time.Second, func() bool {
					o := c.ownerOn(gen)
					if o == nil || o.Subscribers("") != 1 {
						return false
					}
					e, _ := ss.Position()
					return e == o.Epoch()
				}, "restart %d: subscribed to %s", k, gen)
				switch stop {
				case "close":
					a.Close()
				case "drain":
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := a.Drain(ctx); err != nil {
						t.Fatalf("drain %s: %v", gen, err)
					}
					cancel()
				}
				aConn.Close()
				if k < restarts {
					a, aConn = start()
				}
			}
			for k, gen := range gens {
				if n := c.count(gen); n != 1 {
					t.Errorf("generation %d (%s) handled %d subscribes, want 1", k, gen, n)
				}
			}
			_, _, resubs := ss.Stats()
			t.Logf("%d owner restarts: %d resubscribe attempts", restarts, resubs)
		})
	}
}
