package mesh

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestOrderWithRefusals: 64 streams × 200 deliveries to one address,
// pipelined with DeliverAsync, with refusals (NATS no responders from a
// departed generation) injected on the first attempt of random deliveries:
// 0 inversions in any stream, 0 duplicate executions, exactly one verdict
// per delivery.
func TestOrderWithRefusals(t *testing.T) {
	const streams, perStream = 64, 200
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	// The resolver sends a random fifth of attempts to a departed
	// generation; the sender must retry those on their lane.
	rng := rand.New(rand.NewPCG(1, 2))
	var rngMu sync.Mutex
	res := &countingResolver{fn: func(int, subjects.Address) subjects.NodeID {
		rngMu.Lock()
		defer rngMu.Unlock()
		if rng.IntN(5) == 0 {
			return ghost
		}
		return n.ID()
	}}
	// Retries enough that a delivery refused on all of them is
	// impossible in practice (0.2^51): this test is about order, and the
	// default ladder's 7 attempts would all meet a refusal for about 1 in
	// 78 000 deliveries.
	// Every refusal makes the deliveries behind it in the window be
	// refused out of order and sent again: 12 800 deliveries queued at once
	// need more than the default 30 s on a loaded machine under -race.
	c := newClient(t, natstest.Connect(t, s), res, WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 50}), WithRequestTimeout(5*time.Minute))

	ctx := context.Background()
	results := make([][]<-chan Result, streams)
	for st := 0; st < streams; st++ {
		for i := 0; i < perStream; i++ {
			p := make([]byte, 8)
			binary.BigEndian.PutUint32(p, uint32(st))
			binary.BigEndian.PutUint32(p[4:], uint32(i))
			results[st] = append(results[st], c.DeliverAsync(ctx, Delivery{
				To: "rec/one", Stream: subjects.Stream(fmt.Sprintf("s%d", st)), Payload: p,
			}))
		}
	}
	verdicts := 0
	for st := range results {
		for i, ch := range results[st] {
			r := <-ch
			verdicts++
			if r.Err != nil {
				t.Fatalf("stream %d delivery %d: %v", st, i, r.Err)
			}
			select {
			case extra := <-ch:
				t.Fatalf("second verdict for stream %d delivery %d: %+v", st, i, extra)
			default:
			}
		}
	}
	if verdicts != streams*perStream {
		t.Fatalf("verdicts = %d", verdicts)
	}
	if c.Stats().Retries == 0 {
		t.Fatalf("no refusal was injected; the test proves nothing")
	}
	natstest.Eventually(t, 20*time.Second, func() bool { return rec.total() >= streams*perStream }, "all handled")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	next := make([]uint32, streams)
	inversions := 0
	for _, d := range rec.handled["rec/one"] {
		st, i := binary.BigEndian.Uint32(d.Payload), binary.BigEndian.Uint32(d.Payload[4:])
		if i != next[st] {
			inversions++
		}
		next[st] = i + 1
	}
	for id, k := range rec.count {
		if k != 1 {
			t.Errorf("delivery %s executed %d times", id, k)
		}
	}
	if inversions != 0 || len(rec.handled["rec/one"]) != streams*perStream {
		t.Errorf("inversions = %d, handled = %d", inversions, len(rec.handled["rec/one"]))
	}
	t.Logf("retries injected: %d", c.Stats().Retries)
}

// TestRetryHoldsLane: a delivery backing off on its lane holds its place —
// the next delivery on it (refused too: its leg left in the same window)
// waits behind it — while other lanes finish meanwhile.
func TestRetryHoldsLane(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	clock := newGatedClock()
	var mu sync.Mutex
	refuse := true
	// The held lane's owner is a departed generation until the test says.
	res := ResolverFunc(func(_ context.Context, addr subjects.Address) (subjects.NodeID, error) {
		mu.Lock()
		defer mu.Unlock()
		if addr == "rec/held" && refuse {
			return ghost, nil
		}
		return n.ID(), nil
	})
	c := newClient(t, natstest.Connect(t, s), res, WithClock(clock))
	ctx := context.Background()
	first := c.DeliverAsync(ctx, Delivery{ID: "held-1", To: "rec/held"})
	second := c.DeliverAsync(ctx, Delivery{ID: "held-2", To: "rec/held"})
	natstest.Eventually(t, 5*time.Second, func() bool { return len(clock.recorded()) >= 1 }, "first delivery backing off")
	for i := 0; i < 10; i++ {
		if _, err := c.Deliver(ctx, Delivery{To: "rec/other", Stream: subjects.Stream(fmt.Sprint(i))}); err != nil {
			t.Fatalf("other lane: %v", err)
		}
	}
	if _, err := c.Deliver(ctx, Delivery{To: "rec/free", Stream: "x"}); err != nil {
		t.Fatalf("another destination: %v", err)
	}
	if sat := c.Saturation(); sat.DeepestDepth != 2 || sat.Deepest != (LaneKey{Addr: "rec/held"}) {
		t.Errorf("saturation %+v: want the held lane 2 deep", sat)
	}
	select {
	case r := <-second:
		t.Fatalf("second delivery finished while the first held the lane: %+v", r)
	default:
	}
	if rec.executions("held-2") != 0 {
		t.Fatalf("second delivery overtook the first")
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	clock.open()
	if r := <-first; r.Err != nil || r.Attempts != 2 {
		t.Fatalf("first: %+v", r)
	}
	if r := <-second; r.Err != nil || r.Attempts < 1 {
		t.Fatalf("second: %+v", r)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.executions("held-2") == 1 }, "second handled")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if h := rec.handled["rec/held"]; len(h) != 2 || h[0].ID != "held-1" || h[1].ID != "held-2" {
		t.Errorf("held lane handled out of order")
	}
	if sat := c.Saturation(); sat.Lanes != 0 {
		t.Errorf("lanes remain after all work: %+v", sat)
	}
}

// TestTurnsOneAtATime: a hub never runs two deliveries at once, and runs
// them in acceptance order, even from many concurrent senders.
func TestTurnsOneAtATime(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	var running, maxRunning int
	var mu sync.Mutex
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		mu.Lock()
		running++
		maxRunning = max(maxRunning, running)
		mu.Unlock()
		for i := 0; i < 1000; i++ {
			_ = i * i
		}
		mu.Lock()
		running--
		mu.Unlock()
		return nil
	}
	var wg sync.WaitGroup
	for st := 0; st < 16; st++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if _, err := n.Deliver(context.Background(), Delivery{To: "rec/x", Stream: subjects.Stream(fmt.Sprint(st))}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	natstest.Eventually(t, 10*time.Second, func() bool { return rec.total() == 800 }, "all handled")
	mu.Lock()
	defer mu.Unlock()
	if maxRunning != 1 {
		t.Errorf("max concurrent handlers = %d, want 1", maxRunning)
	}
}

// TestSoloLegWithoutLaneHeader pins the leg sent alone in its lane (lane.go,
// docs/protocol.md §3.4): sequential deliveries carry no Mesh-Lane; in a
// burst the first leg goes alone and nothing of the lane is published until
// its reply came, then the rest (queued meanwhile) are pipelined as seq 1,
// 2, … of a new epoch. (Deliveries queued before the lane's first leg leaves are
// pipelined from the first leg on, TestOrderWithRefusals.) Over several
// rounds.
func TestSoloLegWithoutLaneHeader(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	spy := subjects.NodeID{Name: "spy", Generation: 1}
	type leg struct{ lane string }
	var (
		mu      sync.Mutex
		legs    []leg
		hold    = make(chan struct{}) // the first leg's reply waits for it while holding
		holding bool
	)
	snc := natstest.Connect(t, s)
	sub, err := snc.Subscribe(subjects.DefaultPrefix.NodeSubscription(spy), func(m *nats.Msg) {
		mu.Lock()
		legs = append(legs, leg{lane: m.Header.Get(hub.HeaderLane)})
		h, ch := holding, hold
		holding = false
		mu.Unlock()
		if h {
			<-ch
		}
		r := nats.NewMsg(m.Reply)
		r.Header.Set(verdict.HeaderVerdict, "Accepted")
		_ = m.RespondMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = snc.Flush()
	c, err := NewClient(Config{Conn: natstest.Connect(t, s), Resolver: StaticResolver{Node: spy}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := context.Background()
	for round := range 5 {
		mu.Lock()
		legs = nil
		mu.Unlock()
		for i := range 10 {
			if _, err := c.Deliver(ctx, Delivery{To: "x/solo", Payload: []byte{byte(i)}}); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		for i, l := range legs {
			if l.lane != "" {
				t.Fatalf("round %d: sequential leg %d carries Mesh-Lane %q", round, i, l.lane)
			}
		}
		legs, holding = nil, true
		hold = make(chan struct{})
		mu.Unlock()
		const burst = 8
		res := make([]<-chan Result, burst)
		res[0] = c.DeliverAsync(ctx, Delivery{To: "x/solo", Payload: []byte{0}})
		natstest.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(legs) >= 1 }, "first leg of the burst")
		for i := 1; i < burst; i++ {
			res[i] = c.DeliverAsync(ctx, Delivery{To: "x/solo", Payload: []byte{byte(i)}})
		}
		// The first leg's reply is held: nothing else of the lane may be
		// in flight.
		if n, _, _ := sub.Pending(); n > 1 || c.inFlight.Load() != 1 { // n counts the held one
			t.Fatalf("round %d: while the first leg's reply is held, %d legs pending at the node (the held one included) and %d in flight", round, n, c.inFlight.Load())
		}
		mu.Lock()
		close(hold)
		mu.Unlock()
		for i, ch := range res {
			if r := <-ch; r.Err != nil {
				t.Fatalf("round %d: burst delivery %d: %v", round, i, r.Err)
			}
		}
		mu.Lock()
		if len(legs) != burst {
			t.Fatalf("round %d: %d legs for %d deliveries: %+v", round, len(legs), burst, legs)
		}
		if legs[0].lane != "" {
			t.Fatalf("round %d: the burst's first leg carries Mesh-Lane %q", round, legs[0].lane)
		}
		// The rest: runs of one epoch each, seq 1, 2, … in arrival order;
		// a leg whose goroutine came late, when everything ahead had
		// settled, went alone again (no header), and a new epoch follows.
		var epoch string
		var next uint64
		seen := map[string]bool{}
		for i, l := range legs[1:] {
			if l.lane == "" {
				epoch, next = "", 0
				continue
			}
			e, seq, err := hub.ParseLane(l.lane)
			switch {
			case err != nil:
				t.Fatalf("round %d: burst leg %d: %v", round, i+1, err)
			case seq == 1 && !seen[e]:
				epoch, next, seen[e] = e, 2, true
			case e == epoch && seq == next:
				next++
			default:
				t.Fatalf("round %d: burst leg %d: Mesh-Lane %q after epoch %q seq %d", round, i+1, l.lane, epoch, next-1)
			}
		}
		mu.Unlock()
	}
}
