package mesh

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// recorder is a hub kind that records what it handled, per address.
type recorder struct {
	mu      sync.Mutex
	handled map[subjects.Address][]*hub.Delivery
	count   map[string]int // executions by delivery ID
	fn      func(ctx context.Context, d *hub.Delivery) error
}

func newRecorder() *recorder {
	return &recorder{handled: map[subjects.Address][]*hub.Delivery{}, count: map[string]int{}}
}

func (r *recorder) factory(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
	return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
		r.mu.Lock()
		r.handled[d.To] = append(r.handled[d.To], d)
		r.count[d.ID]++
		fn := r.fn
		r.mu.Unlock()
		if fn != nil {
			return fn(ctx, d)
		}
		return nil
	}), nil
}

func (r *recorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.count {
		n += v
	}
	return n
}

func (r *recorder) executions(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count[id]
}

// testNode starts a one-node mesh on s with a recorder registered for kind
// "rec", and returns it.
func testNode(t *testing.T, s *server.Server, name string, opts ...Option) (*Node, *recorder) {
	t.Helper()
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: name}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	if err := n.Register("rec", rec.factory); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, rec
}

// fakeClock is clockwork's fake clock whose timers (the retry ladder's
// back-offs) are recorded and fire at once, the clock advanced by their
// duration (virtual time), as do its After channels (a re-sent Request's
// waits). A gated one (newGatedClock) holds them until open, which then
// fires them and every later one at once.
type fakeClock struct {
	*clockwork.FakeClock
	mu      sync.Mutex
	sleeps  []time.Duration
	instant bool
}

func newFakeClock() *fakeClock { return &fakeClock{FakeClock: clockwork.NewFakeClock(), instant: true} }

func newGatedClock() *fakeClock { return &fakeClock{FakeClock: clockwork.NewFakeClock()} }

func (f *fakeClock) NewTimer(d time.Duration) clockwork.Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sleeps = append(f.sleeps, d)
	t := f.FakeClock.NewTimer(d)
	if f.instant {
		f.FakeClock.Advance(d)
	}
	return t
}

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.FakeClock.After(d)
	if f.instant {
		f.FakeClock.Advance(d)
	}
	return ch
}

// open fires every held timer and makes later ones fire at once.
func (f *fakeClock) open() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instant = true
	f.FakeClock.Advance(24 * time.Hour)
}

func (f *fakeClock) recorded() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}

// countingResolver counts Resolve and Invalidate calls and delegates to fn.
type countingResolver struct {
	mu          sync.Mutex
	resolves    int
	invalidated []subjects.NodeID
	fn          func(call int, addr subjects.Address) subjects.NodeID
}

func (r *countingResolver) Resolve(_ context.Context, addr subjects.Address) (subjects.NodeID, error) {
	r.mu.Lock()
	r.resolves++
	call := r.resolves
	r.mu.Unlock()
	return r.fn(call, addr), nil
}

func (r *countingResolver) Invalidate(_ subjects.Address, n subjects.NodeID) {
	r.mu.Lock()
	r.invalidated = append(r.invalidated, n)
	r.mu.Unlock()
}

func newClient(t *testing.T, nc *nats.Conn, res Resolver, opts ...Option) *Client {
	t.Helper()
	c, err := NewClient(Config{Conn: nc, Resolver: res}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var ghost = subjects.NodeID{Name: "ghost", Generation: 1}

// longOnly skips t unless NATSMESH_LONG=1 (CI's long step runs this
// package so): a test of tens of seconds of waiting or churn, whose
// property a shorter test of the quick suite also pins, kept out of the
// README's go test -race ./... so that it fits five minutes cold.
func longOnly(t *testing.T) {
	t.Helper()
	if !natstest.Long() {
		t.Skipf("long test: run it with NATSMESH_LONG=1 go test -race -run '^%s$' ./mesh (CI does)", t.Name())
	}
}
