package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// fakeClock is an injectable clock for the breaker: it moves only when told.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// countOf returns k's count in the current window.
func (b *breaker) countOf(k breakerKey) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts[k]
}

// size returns the number of keys counted in the current window.
func (b *breaker) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.counts)
}

// mapID identifies the counters map, to tell a reused map from a new one.
func (b *breaker) mapID() uintptr {
	b.mu.Lock()
	defer b.mu.Unlock()
	return reflect.ValueOf(b.counts).Pointer()
}

// allowN offers n deliveries of k and returns how many passed.
func allowN(b *breaker, k breakerKey, n int) (ok int) {
	for range n {
		if a, _ := b.allow(k); a {
			ok++
		}
	}
	return ok
}

func TestBreakerWindow(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	b := newBreaker(3, clk.now)
	k := breakerKey{Sender: "s.1", Target: "echo/a", Type: "t", Stream: "x"}
	for i := range 3 {
		if ok, tripped := b.allow(k); !ok || tripped {
			t.Fatalf("delivery %d within the rate: ok %v tripped %v", i, ok, tripped)
		}
	}
	if ok, tripped := b.allow(k); ok || !tripped {
		t.Fatalf("first delivery over the rate: ok %v tripped %v, want refused and tripped", ok, tripped)
	}
	if ok, tripped := b.allow(k); ok || tripped {
		t.Fatalf("second delivery over the rate: ok %v tripped %v, want refused, not tripped again", ok, tripped)
	}
	// Each field of the key separates it from k.
	for _, other := range []breakerKey{
		{Sender: "s.2", Target: k.Target, Type: k.Type, Stream: k.Stream},
		{Sender: k.Sender, Target: "echo/b", Type: k.Type, Stream: k.Stream},
		{Sender: k.Sender, Target: k.Target, Type: "u", Stream: k.Stream},
		{Sender: k.Sender, Target: k.Target, Type: k.Type, Stream: ""},
	} {
		if n := allowN(b, other, 3); n != 3 {
			t.Errorf("key %+v passed %d of 3 while %+v is refused", other, n, k)
		}
	}
	// Still the same window one nanosecond before its end.
	clk.advance(time.Second - time.Nanosecond)
	if ok, _ := b.allow(k); ok {
		t.Fatal("refused key passed before its window ended")
	}
	// The next window starts every counter from zero.
	clk.advance(time.Nanosecond)
	if n := allowN(b, k, 4); n != 3 {
		t.Fatalf("next window passed %d of 4, want 3", n)
	}
	if b.size() != 1 {
		t.Errorf("%d keys counted in the new window, want 1 (idle keys cost nothing)", b.size())
	}
	// After idle windows a key starts fresh too.
	clk.advance(5 * time.Second)
	if n := allowN(b, k, 1); n != 1 || b.countOf(k) != 1 || b.size() != 1 {
		t.Errorf("after idling: passed %d, count %d, keys %d", n, b.countOf(k), b.size())
	}
}

// TestBreakerMemoryBound: a window's keys are dropped when the next window
// starts; a map that held many keys is replaced rather than kept at its peak
// size, a small one is reused.
func TestBreakerMemoryBound(t *testing.T) {
	clk := newFakeClock()
	b := newBreaker(1, clk.now)
	small := b.mapID()
	b.allow(breakerKey{Sender: "a.1"})
	clk.advance(time.Second)
	b.allow(breakerKey{Sender: "a.1"})
	if b.mapID() != small {
		t.Error("a small map was not reused")
	}
	for i := range breakerKeep + 10 {
		b.allow(breakerKey{Sender: "a.1", Stream: subjects.Stream(strconv.Itoa(i))})
	}
	if b.size() != breakerKeep+11 {
		t.Fatalf("%d keys counted, want %d", b.size(), breakerKeep+11)
	}
	clk.advance(time.Second)
	b.allow(breakerKey{Sender: "a.1"})
	if b.size() != 1 || b.mapID() == small {
		t.Errorf("after a burst of keys: %d keys, map replaced %v", b.size(), b.mapID() != small)
	}
}

// TestBreakerAllocs: checking a key already counted in the window, or one
// re-entering a reused map, allocates nothing.
func TestBreakerAllocs(t *testing.T) {
	clk := newFakeClock()
	b := newBreaker(1<<30, clk.now)
	k := breakerKey{Sender: "a.1", Target: "echo/a", Type: "t", Stream: "s"}
	b.allow(k)
	if n := testing.AllocsPerRun(1000, func() { b.allow(k) }); n != 0 {
		t.Errorf("allow of a counted key: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { clk.advance(time.Second); b.allow(k) }); n != 0 {
		t.Errorf("allow in a fresh window of a reused map: %v allocations", n)
	}
}

// TestBreakerKey: the key reads the delivery's fields, its stream through
// subjects.StreamIdentity (as the sender's lane key does); clients that give
// no sender share one key per target, type and stream.
func TestBreakerKey(t *testing.T) {
	t.Parallel()
	d := &Delivery{Sender: "n.2", To: "echo/a", Type: "t", Stream: "s", ID: "x", From: "echo/z", Attempt: 3}
	want := breakerKey{Sender: "n.2", Target: "echo/a", Type: "t", Stream: subjects.StreamIdentity("s")}
	if k := keyOf(d); k != want {
		t.Errorf("keyOf = %+v, want %+v", k, want)
	}
	a, b := &Delivery{To: "echo/a", ID: "1"}, &Delivery{To: "echo/a", ID: "2", Attempt: 2}
	if keyOf(a) != keyOf(b) || keyOf(a).Sender != "" {
		t.Errorf("anonymous senders do not share a key: %+v %+v", keyOf(a), keyOf(b))
	}
}

func TestBreakerConfig(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	nc := natstest.Connect(t, s)
	node := subjects.NodeID{Name: "b", Generation: 1}
	for _, c := range []struct {
		rate, want int
	}{{0, DefaultBreakerRate}, {7, 7}, {-1, 0}} {
		h, err := New(Config{Conn: nc, Node: node, BreakerRate: c.rate})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		if h.breaker != nil {
			got = h.breaker.rate
		}
		if got != c.want {
			t.Errorf("BreakerRate %d: breaker rate %d, want %d (0: off)", c.rate, got, c.want)
		}
	}
}

// TestWireStormBreaker: one key flooding the intake is refused Ignored for
// everything over the rate in its window, while deliveries of other keys to
// the same address — another stream of the same sender, another sender on
// the same stream — sent at the same time are all accepted and handled
// while the flood is still being refused. The refused key is accepted again
// in the next window. The clock is frozen, so the window never turns on its
// own and the counts are exact.
func TestWireStormBreaker(t *testing.T) {
	t.Parallel()
	const (
		rate     = 50
		minFlood = 500
		maxFlood = 200_000 // the other keys were starved if the flood gets here
		inFlight = 64      // flood requests outstanding at once
		perOther = 20
		target   = subjects.Address("echo/storm")
	)
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	nc := natstest.Connect(t, s)
	h, err := New(Config{Conn: nc, Node: subjects.NodeID{Name: "h", Generation: 5}, BreakerRate: rate, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	h.breaker = newBreaker(rate, clk.now)

	var (
		mu            sync.Mutex // guards the flood's answers below
		acceptedIDs   []string
		unexpected    []string
		refused       int
		replies       int
		refusedAtDone = -1 // flood refusals when the last other delivery was handled
	)
	var othersHandled, floodHandled atomic.Int64
	err = h.Register("echo", func(ctx context.Context, addr subjects.Address) (Hub, error) {
		return HandlerFunc(func(ctx context.Context, d *Delivery) error {
			if d.Sender == "flood.1" && d.Stream == "storm" {
				floodHandled.Add(1)
			} else if othersHandled.Add(1) == 2*perOther {
				mu.Lock()
				refusedAtDone = refused
				mu.Unlock()
			}
			return nil
		}), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)

	delivery := func(id, sender string, stream subjects.Stream) *nats.Msg {
		m := nats.NewMsg(subjects.DefaultPrefix.Delivery(h.Node(), target, stream))
		m.Header.Set(HeaderID, id)
		m.Header.Set(HeaderType, "tick")
		m.Header.Set(HeaderAnswerTo, "mesh.v1.ans."+sender)
		return m
	}

	// The flood: pipelined requests of one key, each with its own reply
	// subject so the answer can be matched to its delivery ID.
	firstRefusal := make(chan struct{})
	slots := make(chan struct{}, inFlight)
	inbox := nats.NewInbox()
	rsub, err := nc.Subscribe(inbox+".*", func(r *nats.Msg) {
		id := "f-" + r.Subject[strings.LastIndexByte(r.Subject, '.')+1:]
		_, verr := verdict.Decode(r.Header)
		mu.Lock()
		replies++
		switch {
		case verr == nil:
			acceptedIDs = append(acceptedIDs, id)
		case errors.Is(verr, verdict.ErrStormBreaker) && !verdict.IsTransient(verr) && verdict.Classify(verr) == verdict.Ignored:
			if refused == 0 {
				close(firstRefusal)
			}
			refused++
		default:
			unexpected = append(unexpected, fmt.Sprintf("%s: %v", id, verr))
		}
		mu.Unlock()
		<-slots
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = rsub.SetPendingLimits(-1, -1)

	sent := 0
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		for ; sent < maxFlood; sent++ {
			if sent >= minFlood && othersHandled.Load() == 2*perOther {
				break
			}
			slots <- struct{}{}
			m := delivery(fmt.Sprintf("f-%d", sent), "flood.1", "storm")
			m.Reply = fmt.Sprintf("%s.%d", inbox, sent)
			if err := nc.PublishMsg(m); err != nil {
				t.Errorf("flood publish: %v", err)
				return
			}
		}
	}()

	// The other keys start once the breaker is open for the flood.
	select {
	case <-firstRefusal:
	case <-time.After(10 * time.Second):
		t.Fatal("the flood was never refused")
	}
	var wg sync.WaitGroup
	for _, o := range []struct {
		sender string
		stream subjects.Stream
	}{{"flood.1", "calm"}, {"calm.1", "storm"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perOther {
				r, err := nc.RequestMsg(delivery(fmt.Sprintf("%s-%s-%d", o.sender, o.stream, i), o.sender, o.stream), 5*time.Second)
				if err != nil {
					t.Errorf("%s/%s: %v", o.sender, o.stream, err)
					return
				}
				if _, verr := verdict.Decode(r.Header); verr != nil {
					t.Errorf("%s/%s delivery %d refused: %v", o.sender, o.stream, i, verr)
				}
			}
		}()
	}
	wg.Wait()
	// The flood goes on until the other keys are handled: it ends only
	// after them, unless they are starved (then it reaches maxFlood).
	<-floodDone
	natstest.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return replies == sent
	}, "flood replies")
	if sent >= maxFlood {
		t.Fatalf("the flood sent %d without the other keys being handled: they were starved", sent)
	}

	mu.Lock()
	t.Logf("flood: %d sent, %d accepted, %d refused (%d of them refused before the other %d deliveries were all handled)",
		sent, len(acceptedIDs), refused, refusedAtDone, 2*perOther)
	if len(unexpected) > 0 {
		t.Errorf("unexpected flood answers: %v", unexpected[:min(5, len(unexpected))])
	}
	if len(acceptedIDs) != rate || refused != sent-rate {
		t.Errorf("flood: %d accepted, %d refused of %d, want %d accepted, the rest refused", len(acceptedIDs), refused, sent, rate)
	}
	if refusedAtDone < 1 {
		t.Errorf("the other keys were not all handled while the flood was refused (refusals then: %d)", refusedAtDone)
	}
	dupID := acceptedIDs[0]
	mu.Unlock()

	natstest.Eventually(t, 10*time.Second, func() bool { return floodHandled.Load() == rate }, "flood handled %d", floodHandled.Load())
	st := h.Stats()
	if st.BreakerRefusals != int64(sent-rate) || st.Refused != st.BreakerRefusals || st.Accepted != int64(rate+2*perOther) {
		t.Errorf("stats %+v", st)
	}

	// A duplicate of an accepted flood delivery is answered Accepted again
	// (dedupe comes before the breaker), though its key is still over.
	dup := delivery(dupID, "flood.1", "storm")
	if r, err := nc.RequestMsg(dup, 5*time.Second); err != nil {
		t.Fatal(err)
	} else if _, verr := verdict.Decode(r.Header); verr != nil {
		t.Errorf("duplicate of accepted %s: %v", dupID, verr)
	}
	// A new delivery of the flood key is still refused in this window, and
	// the refusal names the key and the rate.
	r, err := nc.RequestMsg(delivery("f-late", "flood.1", "storm"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, verr := verdict.Decode(r.Header)
	if !errors.Is(verr, verdict.ErrStormBreaker) || !strings.Contains(verr.Error(), `"flood.1"`) || !strings.Contains(verr.Error(), string(target)) ||
		!strings.Contains(verr.Error(), `"tick"`) || !strings.Contains(verr.Error(), `"storm"`) || !strings.Contains(verr.Error(), "50 deliveries/s") {
		t.Errorf("over the rate: %v", verr)
	}

	// The next window accepts the key again.
	clk.advance(time.Second)
	r, err = nc.RequestMsg(delivery("f-next", "flood.1", "storm"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, verr := verdict.Decode(r.Header); verr != nil {
		t.Errorf("next window: %v", verr)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return floodHandled.Load() == rate+1 }, "flood handled in the next window")
	if st := h.Stats(); st.DedupeHits != 1 || st.BreakerRefusals != int64(sent-rate+1) {
		t.Errorf("final stats %+v", st)
	}
}

// TestBreakerSkipsWindowedLegs: the legs of a windowed lane past its
// epoch's first (Mesh-Lane, in sequence) are not counted by the storm
// breaker — a healthy pipelined lane is never refused Ignored however fast
// it goes — while the first leg of every epoch is, like a leg without
// Mesh-Lane: in one frozen window, the lane's first leg, legs that each
// claim a fresh epoch (a client trying to pass as a windowed lane) and
// plain legs share the rate; a leg out of sequence is refused
// out-of-order.
func TestBreakerSkipsWindowedLegs(t *testing.T) {
	t.Parallel()
	const rate = 5
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	nc := natstest.Connect(t, s)
	h, err := New(Config{Conn: nc, Node: subjects.NodeID{Name: "h", Generation: 6}, BreakerRate: rate, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	h.breaker = newBreaker(rate, clk.now) // frozen: one window throughout
	var handled atomic.Int64
	if err := h.Register("echo", func(ctx context.Context, addr subjects.Address) (Hub, error) {
		return HandlerFunc(func(ctx context.Context, d *Delivery) error { handled.Add(1); return nil }), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	send := func(id, lane string) error {
		t.Helper()
		m := nats.NewMsg(subjects.DefaultPrefix.Delivery(h.Node(), "echo/win", "s"))
		m.Header.Set(HeaderID, id)
		m.Header.Set(HeaderAnswerTo, "mesh.v1.ans.fast.1")
		if lane != "" {
			m.Header.Set(HeaderLane, lane)
		}
		r, err := nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, verr := verdict.Decode(r.Header)
		return verr
	}
	const windowed = 20 * rate
	for i := 1; i <= windowed; i++ { // the first counts: 1 of rate
		if err := send(fmt.Sprintf("w-%d", i), fmt.Sprintf("ep1/%d", i)); err != nil {
			t.Fatalf("windowed leg %d of %d (rate %d): %v", i, windowed, rate, err)
		}
	}
	if err := send("w-gap", "ep1/999"); !errors.Is(err, verdict.ErrOutOfOrder) {
		t.Fatalf("windowed leg out of sequence: %v, want out-of-order", err)
	}
	var accepted, refused int
	count := func(name string, i int, err error) {
		t.Helper()
		switch {
		case err == nil:
			accepted++
		case errors.Is(err, verdict.ErrStormBreaker) && verdict.Classify(err) == verdict.Ignored:
			refused++
		default:
			t.Fatalf("%s leg %d: %v", name, i, err)
		}
	}
	for i := 0; i < 2*rate; i++ { // each claims a fresh epoch: counted
		count("fresh-epoch", i, send(fmt.Sprintf("e-%d", i), fmt.Sprintf("fresh%d/1", i)))
	}
	for i := 0; i < 2*rate; i++ {
		count("plain", i, send(fmt.Sprintf("p-%d", i), ""))
	}
	if accepted != rate-1 || refused != 4*rate-(rate-1) {
		t.Errorf("counted legs in the window: %d accepted, %d refused; want %d and %d (the lane's first leg took one, its others none)", accepted, refused, rate-1, 4*rate-(rate-1))
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return handled.Load() == int64(windowed+accepted) }, "every accepted delivery handled")
}
