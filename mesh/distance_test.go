package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/latency"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestStarvedIntakeTimesOutOnce: the destination's link is so slow that
// every leg times out, although its hub accepts and handles each delivery.
// The handler runs each delivery exactly once — not 7 times — and the
// sender gets Failed after one timeout, never resendable.
func TestStarvedIntakeTimesOutOnce(t *testing.T) {
	const legTimeout = 100 * time.Millisecond
	s := natstest.RunServer(t)
	p, err := latency.Start(s.Addr().String(), legTimeout) // each way
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	slowConn := natstest.ConnectURL(t, p.URL())
	n, err := NewNode(NodeConfig{Conn: slowConn, Name: "starved"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	rec := newRecorder()
	_ = n.Register("rec", rec.factory)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if err := slowConn.Flush(); err != nil { // the subscription is in place
		t.Fatal(err)
	}
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithLegTimeout(legTimeout), WithClock(newFakeClock()))
	start := time.Now()
	r, err := c.Deliver(context.Background(), Delivery{To: "rec/x"})
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || verdict.Classify(err) != verdict.Failed || verdict.IsResendable(err) || !verdict.IsTransient(err) {
		t.Fatalf("Deliver = %v; want a leg timeout: transient, not resendable, Failed", err)
	}
	if r.Attempts != 1 || c.Stats().Retries != 0 {
		t.Fatalf("attempts %d, retries %d: a timed-out delivery was re-sent — the callee may still hold it", r.Attempts, c.Stats().Retries)
	}
	if elapsed > 10*legTimeout {
		t.Errorf("Failed after %v; want about one leg timeout", elapsed)
	}
	// The hub did get it, once. A second delivery on the same lane with
	// patience is handled after it: had the first been re-sent, its copies
	// would be handled before.
	patient := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithLegTimeout(5*time.Second))
	if _, err := patient.Deliver(context.Background(), Delivery{ID: "after", To: "rec/x"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.executions("after") == 1 }, "second delivery handled")
	if got := rec.executions(r.ID); got != 1 {
		t.Errorf("the timed-out delivery ran %d times, want exactly 1", got)
	}
}

// TestDistantStreamsOverlap: to a destination about 2 ms away, 64 distinct
// streams reach at least 32 legs in flight at once, and one stream never
// has more than 1. Legs are counted on the wire, by a NATS connection that
// sees every request and reply in the server's order.
func TestDistantStreamsOverlap(t *testing.T) {
	const streams, perStream = 64, 30
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "near")
	p, err := latency.Start(s.Addr().String(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	var mu sync.Mutex
	replyStream := map[string]string{} // request reply subject -> stream
	open := map[string]int{}           // legs in flight per stream
	total, maxTotal, maxPerStream := 0, 0, 0
	monitor := natstest.Connect(t, s)
	sub, err := monitor.Subscribe(">", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if d, err := subjects.DefaultPrefix.ParseDelivery(m.Subject); err == nil {
			st := string(d.Stream)
			replyStream[m.Reply] = st
			open[st]++
			total++
			maxTotal = max(maxTotal, total)
			maxPerStream = max(maxPerStream, open[st])
			return
		}
		if st, ok := replyStream[m.Subject]; ok {
			delete(replyStream, m.Subject)
			open[st]--
			total--
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = monitor.Flush()

	c := newClient(t, natstest.ConnectURL(t, p.URL()), StaticResolver{Node: n.ID()})
	var wg sync.WaitGroup
	for st := 0; st < streams; st++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perStream; i++ {
				if _, err := c.Deliver(context.Background(), Delivery{To: "rec/far", Stream: subjects.Stream(fmt.Sprint(st))}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	natstest.Eventually(t, 10*time.Second, func() bool { return rec.total() == streams*perStream }, "all handled")
	natstest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total == 0
	}, "monitor saw every reply")
	mu.Lock()
	defer mu.Unlock()
	t.Logf("legs in flight on the wire: max %d across streams, max %d in one stream; sender peak %d", maxTotal, maxPerStream, c.Saturation().PeakInFlight)
	if maxTotal < 32 {
		t.Errorf("max legs in flight %d, want ≥ 32", maxTotal)
	}
	if maxPerStream != 1 {
		t.Errorf("max legs in flight in one stream %d, want 1", maxPerStream)
	}
}
