package hub

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestIdleCollectionReleasesEveryClaim: one collection that finds many
// idle activations deactivates them several at a time — each hub's
// Deactivate runs once and each claim is released by its own token — and
// every address activates again (claiming anew) on its next delivery,
// over three rounds of collection.
func TestIdleCollectionReleasesEveryClaim(t *testing.T) {
	t.Parallel()
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

// TestIdleCollectionOnInjectedClock: idle collection runs on the host's
// clock (Config.Clock) — the janitor's ticker, the activation's last use
// and the agenda's times — so an activation idle for an hour of a fake
// clock's time is collected without waiting an hour, and one idle for less
// than the timeout on that clock is not, however long the test runs. The
// fake clock starts a century ahead, so a last use stamped by the real clock
// would read long idle at once.
func TestIdleCollectionOnInjectedClock(t *testing.T) {
	const idle = time.Hour // the janitor ticks every quarter: 15 min
	fc := clockwork.NewFakeClockAt(time.Now().AddDate(100, 0, 0))
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	g := newGateClaims(subjects.NodeID{Name: "a", Generation: 1})
	h, _ := claimHost(t, nc, g, Config{IdleTimeout: idle, Clock: fc})
	var deact atomic.Int64
	if err := h.Register("idle", func(_ context.Context, addr subjects.Address) (Hub, error) {
		return deactivatorHub{addr: addr, onDeactivate: func(subjects.Address) { deact.Add(1) }}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-send(nc, g.node, "idle/1", "d1", "x"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return h.Stats().Handled == 1 }, "the delivery handled")
	// The janitor's ticker is the clock's one waiter.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fc.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the janitor's ticker never waited on the injected clock: %v", err)
	}
	// Idle for a minute less than the timeout: a collection (here run by
	// the test, synchronously) leaves it.
	fc.Advance(idle - time.Minute)
	h.collectIdle(fc.Now().Add(-idle))
	if n := deact.Load(); n != 0 || h.Stats().Activations != 1 {
		t.Fatalf("collected after %v idle of a %v timeout (deactivated %d, %d activations)", idle-time.Minute, idle, n, h.Stats().Activations)
	}
	// Past the timeout and the janitor's next tick: the janitor collects it.
	fc.Advance(idle / 4)
	natstest.Eventually(t, 10*time.Second, func() bool {
		return deact.Load() == 1 && h.Stats().Activations == 0 && g.heldCount() == 0
	}, "the activation collected by the janitor on the fake clock and its claim released")
}

// deactivatorHub accepts everything and reports its Deactivate.
type deactivatorHub struct {
	addr         subjects.Address
	onDeactivate func(subjects.Address)
}

func (deactivatorHub) Handle(context.Context, *Delivery) error { return nil }

func (d deactivatorHub) Deactivate(context.Context) { d.onDeactivate(d.addr) }

// TestIdleCollectionAgenda: an activation is collected only once it has
// been idle for the idle timeout, whatever kept it from being idle before —
// deliveries arriving more often than the timeout, an explicit hold, a
// pinned hub, a turn or a build lasting several timeouts — and then it is
// collected (the janitor's agenda requeues it rather than forgetting it).
// Not parallel: "used more often than the idle timeout" is judged on the
// real clock, with 100 ms between uses.
func TestIdleCollectionAgenda(t *testing.T) {
	const idle = 100 * time.Millisecond
	const watch = 6 * idle // how long "not collected meanwhile" is watched
	type env struct {
		nc      *nats.Conn
		h       *Host
		g       *gateClaims
		mu      sync.Mutex
		deact   map[subjects.Address]int
		pinned  atomic.Bool
		release chan struct{} // ends a "block" turn or a "slowbuild" build
	}
	setup := func(t *testing.T) *env {
		s := natstest.RunServer(t)
		e := &env{deact: map[subjects.Address]int{}, release: make(chan struct{})}
		e.nc = natstest.Connect(t, s)
		e.g = newGateClaims(subjects.NodeID{Name: "a", Generation: 1})
		e.h, _ = claimHost(t, e.nc, e.g, Config{IdleTimeout: idle})
		on := func(a subjects.Address) {
			e.mu.Lock()
			e.deact[a]++
			e.mu.Unlock()
		}
		reg := func(kind string, f Factory) {
			if err := e.h.Register(kind, f); err != nil {
				t.Fatal(err)
			}
		}
		reg("idle", func(_ context.Context, addr subjects.Address) (Hub, error) {
			return deactivatorHub{addr: addr, onDeactivate: on}, nil
		})
		reg("pin", func(_ context.Context, addr subjects.Address) (Hub, error) {
			return pinnedHub{deactivatorHub{addr: addr, onDeactivate: on}, &e.pinned}, nil
		})
		reg("block", func(_ context.Context, addr subjects.Address) (Hub, error) {
			return blockHub{deactivatorHub{addr: addr, onDeactivate: on}, e.release}, nil
		})
		reg("slowbuild", func(ctx context.Context, addr subjects.Address) (Hub, error) {
			select {
			case <-e.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return deactivatorHub{addr: addr, onDeactivate: on}, nil
		})
		return e
	}
	collected := func(e *env, addr subjects.Address) int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.deact[addr]
	}
	notCollectedFor := func(t *testing.T, e *env, addr subjects.Address, d time.Duration, busy func(i int)) {
		t.Helper()
		for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
			if busy != nil {
				busy(i)
			}
			if c := collected(e, addr); c != 0 {
				t.Fatalf("%s collected while it was not idle", addr)
			}
			time.Sleep(idle / 8)
		}
	}
	collectedOnce := func(t *testing.T, e *env, addr subjects.Address) {
		t.Helper()
		natstest.Eventually(t, 10*time.Second, func() bool { return collected(e, addr) == 1 && e.g.heldCount() == 0 },
			"%s collected and its claim released", addr)
	}
	deliver := func(t *testing.T, e *env, addr subjects.Address, id string) {
		t.Helper()
		if err := <-send(e.nc, e.g.node, addr, id, "x"); err != nil {
			t.Fatalf("%s %s: %v", addr, id, err)
		}
	}

	t.Run("used more often than the idle timeout", func(t *testing.T) {
		e := setup(t)
		addr := subjects.Address("idle/busy")
		notCollectedFor(t, e, addr, watch, func(i int) {
			if i%2 == 0 { // every idle/4
				deliver(t, e, addr, fmt.Sprintf("d%d", i))
			}
		})
		collectedOnce(t, e, addr)
	})
	t.Run("held", func(t *testing.T) {
		e := setup(t)
		addr := subjects.Address("idle/held")
		release, err := e.h.Activate(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		deliver(t, e, addr, "d1")
		notCollectedFor(t, e, addr, watch, nil)
		release()
		collectedOnce(t, e, addr)
	})
	t.Run("held twice, released in turn", func(t *testing.T) {
		e := setup(t)
		addr := subjects.Address("idle/held2")
		r1, err := e.h.Activate(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := e.h.Activate(context.Background(), addr)
		if err != nil {
			t.Fatal(err)
		}
		r1()
		notCollectedFor(t, e, addr, watch, nil)
		r2()
		collectedOnce(t, e, addr)
	})
	t.Run("pinned", func(t *testing.T) {
		e := setup(t)
		e.pinned.Store(true)
		addr := subjects.Address("pin/1")
		deliver(t, e, addr, "d1")
		notCollectedFor(t, e, addr, watch, nil)
		e.pinned.Store(false)
		collectedOnce(t, e, addr)
	})
	t.Run("a turn longer than the idle timeout", func(t *testing.T) {
		e := setup(t)
		addr := subjects.Address("block/1")
		deliver(t, e, addr, "d1") // accepted; its turn blocks
		notCollectedFor(t, e, addr, watch, nil)
		close(e.release)
		collectedOnce(t, e, addr)
	})
	t.Run("a build longer than the idle timeout", func(t *testing.T) {
		e := setup(t)
		addr := subjects.Address("slowbuild/1")
		deliver(t, e, addr, "d1") // accepted on the parked build
		notCollectedFor(t, e, addr, watch, nil)
		close(e.release)
		collectedOnce(t, e, addr)
	})
}

// pinnedHub is pinned while *pinned holds.
type pinnedHub struct {
	deactivatorHub
	pinned *atomic.Bool
}

func (p pinnedHub) Pinned() bool { return p.pinned.Load() }

// blockHub's turns wait for release.
type blockHub struct {
	deactivatorHub
	release chan struct{}
}

func (b blockHub) Handle(ctx context.Context, _ *Delivery) error {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return nil
}
