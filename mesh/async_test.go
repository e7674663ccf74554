package mesh

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// holdingSpy is a fake node generation spy.1 that answers every leg
// Accepted, except that while holding it keeps the replies back until
// released.
type holdingSpy struct {
	node subjects.NodeID
	sub  *nats.Subscription

	mu       sync.Mutex
	holding  bool
	passSolo bool // while holding, still accept a leg without hub.HeaderLane (a lane's solo leg) at once
	held     []*nats.Msg
	legs     int
}

func newHoldingSpy(t *testing.T, s *server.Server) *holdingSpy {
	p := &holdingSpy{node: subjects.NodeID{Name: "spy", Generation: 1}, holding: true}
	nc := natstest.Connect(t, s)
	sub, err := nc.Subscribe(subjects.DefaultPrefix.NodeSubscription(p.node), func(m *nats.Msg) {
		p.mu.Lock()
		p.legs++
		if p.holding && !(p.passSolo && m.Header.Get(hub.HeaderLane) == "") {
			p.held = append(p.held, m)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		accept(m)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = nc.Flush()
	p.sub = sub
	return p
}

func accept(m *nats.Msg) {
	r := nats.NewMsg(m.Reply)
	r.Header.Set(verdict.HeaderVerdict, "Accepted")
	_ = m.RespondMsg(r)
}

func (p *holdingSpy) count() (legs, held int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.legs, len(p.held)
}

// release answers the held legs and every later one at once.
func (p *holdingSpy) release() {
	p.mu.Lock()
	held := p.held
	p.held, p.holding = nil, false
	p.mu.Unlock()
	for _, m := range held {
		accept(m)
	}
}

// TestDeliverAsyncGoroutines: DeliverAsync deliveries queued in a lane have
// no goroutine until they may send (async.go): 2 000 of them on one lane
// whose window (8) is full cost about 8 goroutines, not 2 000; released,
// every one gets exactly one Result, accepted. Over several rounds.
func TestDeliverAsyncGoroutines(t *testing.T) {
	s := natstest.RunServer(t)
	for round := range 3 {
		spy := newHoldingSpy(t, s)
		// The first delivery may go as the lane's solo leg (alone in it
		// when it publishes: lane.go), which holds the lane until it
		// settles; answered, the rest are pipelined in the window.
		spy.mu.Lock()
		spy.passSolo = true
		spy.mu.Unlock()
		c, err := NewClient(Config{Conn: natstest.Connect(t, s), Resolver: StaticResolver{Node: spy.node}}, WithWindow(8))
		if err != nil {
			t.Fatal(err)
		}
		g0 := runtime.NumGoroutine()
		const n = 2000
		res := make([]<-chan Result, n)
		for i := range res {
			res[i] = c.DeliverAsync(context.Background(), Delivery{To: "x/async", Payload: []byte{byte(i)}})
		}
		natstest.Eventually(t, 10*time.Second, func() bool { _, h := spy.count(); return h == 8 }, "8 legs held: %v", lazyCount(spy.count))
		if g := runtime.NumGoroutine() - g0; g > 8+8 {
			t.Fatalf("round %d: %d deliveries queued behind a full window of 8 run %d goroutines", round, n, g)
		}
		spy.release()
		for i, ch := range res {
			if r := <-ch; r.Err != nil {
				t.Fatalf("round %d: delivery %d: %v", round, i, r.Err)
			}
			select {
			case r := <-ch:
				t.Fatalf("round %d: delivery %d: a second result %+v", round, i, r)
			default:
			}
		}
		if legs, _ := spy.count(); legs != n {
			t.Fatalf("round %d: %d legs for %d deliveries", round, legs, n)
		}
		c.Close()
		_ = spy.sub.Unsubscribe()
	}
}

// TestDeliverAsyncQueuedDeadline: a DeliverAsync queued behind a lane that
// does not move (window 1, its first leg's reply held) reports its
// deadline when it passes — verdict.ErrDeadlineUnsent, resendable, nothing
// sent — not when the lane moves; and one cancelled while queued reports
// the cancellation (Failed).
func TestDeliverAsyncQueuedDeadline(t *testing.T) {
	s := natstest.RunServer(t)
	spy := newHoldingSpy(t, s)
	c, err := NewClient(Config{Conn: natstest.Connect(t, s), Resolver: StaticResolver{Node: spy.node}}, WithWindow(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	first := c.DeliverAsync(context.Background(), Delivery{To: "x/stuck"})
	natstest.Eventually(t, 10*time.Second, func() bool { _, h := spy.count(); return h == 1 }, "first leg held")
	var timed, cancelled []<-chan Result
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%5)*time.Millisecond)
		t.Cleanup(cancel)
		timed = append(timed, c.DeliverAsync(ctx, Delivery{To: "x/stuck"}))
		cctx, ccancel := context.WithCancel(context.Background())
		cancelled = append(cancelled, c.DeliverAsync(cctx, Delivery{To: "x/stuck"}))
		ccancel()
	}
	for i, ch := range timed {
		r := <-ch // the first leg is still held
		if !errors.Is(r.Err, verdict.ErrDeadlineUnsent) || !verdict.IsResendable(r.Err) {
			t.Fatalf("queued delivery %d past its deadline: %v, want ErrDeadlineUnsent", i, r.Err)
		}
	}
	for i, ch := range cancelled {
		r := <-ch
		if !errors.Is(r.Err, context.Canceled) || verdict.IsTransient(r.Err) {
			t.Fatalf("queued delivery %d cancelled: %v, want context.Canceled (Failed)", i, r.Err)
		}
	}
	if legs, _ := spy.count(); legs != 1 {
		t.Fatalf("%d legs sent; only the first may be", legs)
	}
	spy.release()
	if r := <-first; r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := <-c.DeliverAsync(context.Background(), Delivery{To: "x/stuck"}); r.Err != nil {
		t.Fatalf("after the lane moved: %v", r.Err)
	}
}

// TestDeliverAsyncQueuedClose: Close with DeliverAsync deliveries queued
// behind a stuck lane ends them all with verdict.ErrClosing and returns.
func TestDeliverAsyncQueuedClose(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	spy := newHoldingSpy(t, s)
	c, err := NewClient(Config{Conn: natstest.Connect(t, s), Resolver: StaticResolver{Node: spy.node}}, WithWindow(1))
	if err != nil {
		t.Fatal(err)
	}
	res := []<-chan Result{c.DeliverAsync(context.Background(), Delivery{To: "x/close"})}
	natstest.Eventually(t, 10*time.Second, func() bool { _, h := spy.count(); return h == 1 }, "first leg held")
	for range 50 {
		res = append(res, c.DeliverAsync(context.Background(), Delivery{To: "x/close"}))
	}
	c.Close()
	for i, ch := range res {
		if r := <-ch; !errors.Is(r.Err, verdict.ErrClosing) {
			t.Fatalf("delivery %d: %v, want ErrClosing", i, r.Err)
		}
	}
	if r := <-c.DeliverAsync(context.Background(), Delivery{To: "x/close"}); !errors.Is(r.Err, verdict.ErrClosing) {
		t.Fatalf("after Close: %v", r.Err)
	}
	spy.release()
}

type lazyCount func() (int, int)

func (l lazyCount) String() string { a, b := l(); return fmt.Sprintf("legs %d, held %d", a, b) }
