package mesh

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/subjects"
)

// turnLog checks single activation from the hub side, turn by turn: no two
// turns of one address overlap (on one node or across nodes), and every turn
// runs while the directory names its node as the address's owner.
type turnLog struct {
	kv jetstream.KeyValue

	mu       sync.Mutex
	running  map[subjects.Address]string // address -> node whose turn runs
	turns    atomic.Int64
	overlaps []string
	noClaim  []string
	handled  map[string]int // delivery ID -> executions
}

// loggedHub is a hub whose deactivation takes a while (a hub saving its
// state, say): the window in which a collected activation still holds its
// claim while new deliveries arrive for its address.
type loggedHub struct {
	hub.HandlerFunc
	linger time.Duration
}

func (h loggedHub) Deactivate(context.Context) { time.Sleep(h.linger) }

func (l *turnLog) factory(node string, seed uint64) hub.Factory {
	var n atomic.Uint64
	return func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		linger := time.Duration(rand.New(rand.NewPCG(seed, n.Add(1))).IntN(3000)) * time.Microsecond
		return loggedHub{linger: linger, HandlerFunc: func(ctx context.Context, d *hub.Delivery) error {
			l.mu.Lock()
			if other, ok := l.running[d.To]; ok {
				l.overlaps = append(l.overlaps, fmt.Sprintf("%s: a turn on %s while one on %s runs", d.To, node, other))
			}
			l.running[d.To] = node
			l.handled[d.ID]++
			l.mu.Unlock()
			l.turns.Add(1)
			owner := "(none)"
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if e, err := l.kv.Get(rctx, subjects.EncodeToken(string(d.To))); err == nil {
				var c directory.Claim
				if json.Unmarshal(e.Value(), &c) == nil {
					owner = c.Owner.Name
				}
			} else {
				owner = "(" + err.Error() + ")"
			}
			cancel()
			l.mu.Lock()
			if owner != node {
				l.noClaim = append(l.noClaim, fmt.Sprintf("%s: a turn on %s while the directory names %s", d.To, node, owner))
			}
			delete(l.running, d.To)
			l.mu.Unlock()
			return nil
		}}, nil
	}
}

// TestIdleCollectionRacesDeliveries (issue 20, race 1): activations
// collected idle (an idle timeout of milliseconds) while deliveries to the
// same addresses keep arriving from every node at random moments. A
// collected activation's release must never take the claim a new activation
// of the address took or re-adopted: every turn runs under its own node's
// claim, no two turns of an address overlap on two nodes, and every
// delivery is accepted and handled exactly once. Seeded; each seed is a
// subtest.
func TestIdleCollectionRacesDeliveries(t *testing.T) {
	t.Parallel()
	seeds := []uint64{1, 2, 3}
	if !natstest.Long() {
		seeds = seeds[:1]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { idleCollectionRace(t, seed) })
	}
}

func idleCollectionRace(t *testing.T, seed uint64) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	mc := steadyMembership
	mc.VerifyInterval = 50 * time.Millisecond // a claim lost behind an activation's back is noticed (and acted on) fast
	var nodes []*Node
	log := &turnLog{running: map[subjects.Address]string{}, handled: map[string]int{}}
	for _, name := range []string{"a", "b", "c"} {
		n, err := NewNode(NodeConfig{Conn: natstest.Connect(t, s), Name: name, Membership: &mc, Host: hub.Config{IdleTimeout: 5 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Register("rec", log.factory(name, seed)); err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	waitMembers(t, 3, nodes...)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if log.kv, err = js.KeyValue(ctx, directory.BucketName(subjects.DefaultPrefix)); err != nil {
		t.Fatal(err)
	}
	const (
		addrs   = 6
		senders = 6
		each    = 150
	)
	var wg sync.WaitGroup
	var failed atomic.Int64
	errs := make(chan error, senders*each)
	for w := range senders {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		from := nodes[w%len(nodes)]
		wg.Go(func() {
			for i := range each {
				to := subjects.Address(fmt.Sprintf("rec/%d", rng.IntN(addrs)))
				if rng.IntN(3) == 0 {
					// A pause around the idle timeout: the activation is
					// collected just before, while, or just after the
					// next delivery claims it.
					time.Sleep(time.Duration(rng.IntN(8000)) * time.Microsecond)
				}
				if _, err := from.Deliver(ctx, Delivery{To: to, ID: fmt.Sprintf("s%d-%d-%d", seed, w, i)}); err != nil {
					failed.Add(1)
					errs <- fmt.Errorf("deliver %s from %s: %w", to, from.ID(), err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := senders*each - int(failed.Load())
	natstest.Eventually(t, 20*time.Second, func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return len(log.handled) == want
	}, "every accepted delivery handled")
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, o := range log.overlaps {
		t.Error(o)
	}
	for _, o := range log.noClaim {
		t.Error(o)
	}
	for id, n := range log.handled {
		if n != 1 {
			t.Errorf("delivery %s handled %d times", id, n)
		}
	}
	var collected int64
	for _, n := range nodes {
		collected += n.Host().Stats().Deactivated
	}
	t.Logf("seed %d: %d turns, %d activations collected", seed, log.turns.Load(), collected)
	if collected == 0 {
		t.Error("no activation was collected: the race was not exercised")
	}
}
