package membership

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) add(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) find(t EventType, n subjects.NodeID) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Type == t && e.Member.Node == n {
			return e, true
		}
	}
	return Event{}, false
}

func join(t *testing.T, nc *nats.Conn, name string, cfg Config) *Membership {
	t.Helper()
	cfg.Conn, cfg.Name = nc, name
	if cfg.Kinds == nil {
		cfg.Kinds = []string{"echo"}
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat, cfg.TTL = 100*time.Millisecond, 400*time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, cfg)
	if err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	t.Cleanup(m.Close)
	return m
}

func TestJoinLeaveExpire(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	watcher := join(t, natstest.Connect(t, s), "w", Config{})
	var rec recorder
	watcher.OnEvent(rec.add)

	a := join(t, natstest.Connect(t, s), "a", Config{Kinds: []string{"echo", "kv"}})
	natstest.Eventually(t, 5*time.Second, func() bool { return watcher.Alive(a.Self().Node) }, "a joined")
	if got := watcher.Hosting("kv"); len(got) != 1 || got[0] != a.Self().Node {
		t.Errorf("Hosting(kv) = %v", got)
	}
	if _, ok := rec.find(Joined, a.Self().Node); !ok {
		t.Error("no joined event")
	}
	// Graceful leave: seen at once.
	if err := a.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 2*time.Second, func() bool { _, ok := rec.find(Left, a.Self().Node); return ok }, "left event")
	if watcher.Alive(a.Self().Node) {
		t.Error("a still alive after leaving")
	}
	// Crash (no leave, no heartbeat): expired within about the TTL.
	b := join(t, natstest.Connect(t, s), "b", Config{})
	natstest.Eventually(t, 5*time.Second, func() bool { return watcher.Alive(b.Self().Node) }, "b joined")
	stopped := time.Now()
	b.Close()
	natstest.Eventually(t, 5*time.Second, func() bool { _, ok := rec.find(Expired, b.Self().Node); return ok }, "expired event")
	t.Logf("expiry detected %v after the last heartbeat stopped (TTL 400ms)", time.Since(stopped))
}

// TestSupersede: a node restarted with the same name before its TTL: the old
// generation is retired at once, and it learns it lost its registration.
func TestSupersede(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	watcher := join(t, natstest.Connect(t, s), "w", Config{})
	var rec recorder
	watcher.OnEvent(rec.add)
	old := join(t, natstest.Connect(t, s), "same", Config{Heartbeat: time.Second, TTL: 10 * time.Second})
	natstest.Eventually(t, 5*time.Second, func() bool { return watcher.Alive(old.Self().Node) }, "old joined")
	start := time.Now()
	fresh := join(t, natstest.Connect(t, s), "same", Config{Heartbeat: time.Second, TTL: 10 * time.Second, Replace: true})
	if fresh.Self().Node.Generation <= old.Self().Node.Generation {
		t.Fatalf("generation %d not above %d", fresh.Self().Node.Generation, old.Self().Node.Generation)
	}
	natstest.Eventually(t, 2*time.Second, func() bool { _, ok := rec.find(Superseded, old.Self().Node); return ok }, "superseded")
	t.Logf("supersession seen %v after the new generation joined (TTL 10s)", time.Since(start))
	select {
	case <-old.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the superseded generation did not learn it was lost")
	}
	if !old.Superseded() {
		t.Error("the old generation does not know it was superseded")
	}
	if old.Confirmed() || !fresh.Confirmed() {
		t.Error("Confirmed wrong")
	}
}

// TestGenerationsIncrease: generations are strictly increasing per name even
// when registrations race.
func TestGenerationsIncrease(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	var last uint64
	for i := 0; i < 5; i++ {
		m := join(t, nc, "n", Config{})
		g := m.Self().Node.Generation
		if g <= last {
			t.Fatalf("generation %d after %d", g, last)
		}
		last = g
		m.Close()
	}
}
