package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// holdingIntake is a real NATS responder on a node generation's delivery
// subject that holds every request until released, then answers Accepted:
// an intake that is slow to answer.
type holdingIntake struct {
	mu   sync.Mutex
	held []*nats.Msg
}

func (h *holdingIntake) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

func (h *holdingIntake) release(node subjects.NodeID) {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, m := range held {
		r := nats.NewMsg(m.Reply)
		verdict.Encode(r.Header, nil, node.String())
		_ = m.RespondMsg(r)
	}
}

// holdIntake subscribes a holdingIntake on node's delivery subject.
func holdIntake(t *testing.T, s *server.Server, node subjects.NodeID) *holdingIntake {
	t.Helper()
	intake := &holdingIntake{}
	nc := natstest.Connect(t, s)
	if _, err := nc.Subscribe(subjects.DefaultPrefix.NodeSubscription(node), func(m *nats.Msg) {
		intake.mu.Lock()
		intake.held = append(intake.held, m)
		intake.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	// The subscription is live on the server before the first leg: else a
	// loaded machine meets no responders, retries, and the counts move.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return intake
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(s.b.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestSaturationEpisodes: one structured log line per episode when legs in
// flight cross the threshold, latched until they fall back; every field
// carries the state at the crossing (breadth and the deepest lane).
func TestSaturationEpisodes(t *testing.T) {
	s := natstest.RunServer(t)
	slow := subjects.NodeID{Name: "slow", Generation: 1}
	intake := holdIntake(t, s, slow)
	var logs syncBuffer
	// Stop-and-wait (window 1), so that the lane 4 deep has one leg in
	// flight and three waiting.
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: slow}, WithWindow(1),
		WithSaturationThreshold(4), WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))

	burst := func() []<-chan Result {
		var rs []<-chan Result
		for i := 0; i < 6; i++ {
			rs = append(rs, c.DeliverAsync(context.Background(), Delivery{To: subjects.Address(fmt.Sprintf("k/%d", i))}))
		}
		for i := 0; i < 3; i++ { // three more behind k/0: a lane 4 deep
			rs = append(rs, c.DeliverAsync(context.Background(), Delivery{To: "k/0"}))
		}
		return rs
	}
	wait := func(rs []<-chan Result) {
		for len(rs) > 0 {
			select {
			case r := <-rs[0]:
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				rs = rs[1:]
			case <-time.After(5 * time.Millisecond):
				intake.release(slow)
			}
		}
	}
	rs := burst()
	natstest.Eventually(t, 5*time.Second, func() bool { return intake.count() == 6 }, "6 legs held")
	// A snapshot, not a barrier: the legs behind k/0 join its lane as their
	// callers get there, so the state is polled for.
	var sat Saturation
	if !natstest.Poll(5*time.Second, func() bool {
		sat = c.Saturation()
		return sat.LegsInFlight == 6 && sat.Lanes == 6 && sat.Destinations == 6 && sat.DeepestDepth == 4 && sat.Deepest.Addr == "k/0" && sat.Saturated && sat.Episode == 1
	}) {
		t.Errorf("saturation %+v", sat)
	}
	lines := logs.lines("mesh sender saturated")
	if len(lines) != 1 {
		t.Fatalf("%d log lines in the first episode, want 1", len(lines))
	}
	// The line shows the state at the crossing: the burst may still be
	// joining its lanes then (the 4th leg can leave before the 6th lane
	// exists), so lanes lie between the legs in flight and 6, and each lane
	// here is its own destination.
	l := lines[0]
	legs, lanes := l["legs_in_flight"].(float64), l["lanes"].(float64)
	if l["episode"] != 1.0 || legs < 4 || l["max_in_flight"] != 256.0 || lanes < legs || lanes > 6 || l["destinations"] != lanes {
		t.Errorf("log line %v", l)
	}
	wait(rs)
	// A lane is removed once its last leg's verdict is out, i.e. just after
	// the caller may have read it.
	if !natstest.Poll(5*time.Second, func() bool {
		sat = c.Saturation()
		return !sat.Saturated && sat.LegsInFlight == 0 && sat.Lanes == 0 && sat.PeakInFlight == 6
	}) {
		t.Errorf("after the burst: %+v", sat)
	}
	rs = burst()
	natstest.Eventually(t, 5*time.Second, func() bool { return intake.count() == 6 }, "6 legs held again")
	wait(rs)
	if lines := logs.lines("mesh sender saturated"); len(lines) != 2 || lines[1]["episode"] != 2.0 {
		t.Errorf("second episode: %v", lines)
	}
}

// TestInFlightCap: legs in flight never exceed the cap; callers beyond it
// wait, bounded by their ctx.
func TestInFlightCap(t *testing.T) {
	s := natstest.RunServer(t)
	slow := subjects.NodeID{Name: "slow", Generation: 1}
	intake := holdIntake(t, s, slow)
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: slow}, WithMaxInFlight(3), WithSaturationThreshold(0))
	var rs []<-chan Result
	for i := 0; i < 5; i++ {
		rs = append(rs, c.DeliverAsync(context.Background(), Delivery{To: subjects.Address(fmt.Sprintf("k/%d", i))}))
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return intake.count() == 3 }, "3 legs held")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Deliver(ctx, Delivery{To: "k/extra"})
	if !errors.Is(err, verdict.ErrDeadlineUnsent) || !verdict.IsResendable(err) || verdict.Classify(err) != verdict.Unavailable {
		t.Errorf("a caller over the cap: %v; want its deadline passed before anything was sent (resendable Unavailable)", err)
	}
	if got := intake.count(); got != 3 || c.Saturation().LegsInFlight != 3 {
		t.Errorf("held %d, in flight %d; want 3", got, c.Saturation().LegsInFlight)
	}
	for _, ch := range rs {
		for done := false; !done; {
			select {
			case r := <-ch:
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				done = true
			case <-time.After(5 * time.Millisecond):
				intake.release(slow)
			}
		}
	}
	if p := c.Saturation().PeakInFlight; p != 3 {
		t.Errorf("peak in flight %d, want 3", p)
	}
}

// TestSaturationStaleObservation: concurrent changes of the legs-in-flight
// count report to the episode latch in any order; one that reports a count
// already gone (its goroutine was preempted between its change and the
// report) must not close an open episode while the count is still up —
// it did once on a loaded machine, and the same burst logged a second
// episode (TestSaturationEpisodes in a cold run).
func TestSaturationStaleObservation(t *testing.T) {
	t.Parallel()
	c, logs := latchClient(t)
	c.inFlight.Store(4)
	c.observeInFlight(4)
	c.observeInFlight(2) // stale: the count is 4
	c.inFlight.Store(5)
	c.observeInFlight(5)
	if n := len(logs.lines("mesh sender saturated")); n != 1 || !c.Saturation().Saturated {
		t.Fatalf("%d episodes logged (open %v), want 1 still open", n, c.Saturation().Saturated)
	}
	c.inFlight.Store(2)
	c.observeInFlight(2)
	if c.Saturation().Saturated {
		t.Fatal("the episode did not close at half the threshold")
	}
	c.inFlight.Store(4)
	c.observeInFlight(4)
	if n := len(logs.lines("mesh sender saturated")); n != 2 {
		t.Fatalf("%d episodes logged, want 2", n)
	}
	c.inFlight.Store(0)
}

// TestSaturationStaleOpen: the mirror of TestSaturationStaleObservation —
// a late report of a count already gone (high) must not open a second
// episode once the burst's episode closed (a hostile review).
func TestSaturationStaleOpen(t *testing.T) {
	t.Parallel()
	c, logs := latchClient(t)
	c.inFlight.Store(4)
	c.observeInFlight(4) // the episode opens
	c.inFlight.Store(5)  // the fifth leg's change; its report comes late
	c.inFlight.Store(1)  // the others are answered
	c.observeInFlight(1) // the episode closes
	c.observeInFlight(5) // the fifth leg's late report: one leg is in flight
	if n := len(logs.lines("mesh sender saturated")); n != 1 {
		t.Errorf("%d episodes logged for one burst, want 1", n)
	}
	c.inFlight.Store(0)
	c.observeInFlight(0)
}

// latchClient is a client with a saturation threshold of 4 whose log the
// test reads, for driving its episode latch (observeInFlight) by hand.
func latchClient(t *testing.T) (*Client, *syncBuffer) {
	s := natstest.RunServer(t)
	logs := &syncBuffer{}
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: subjects.NodeID{Name: "x", Generation: 1}},
		WithSaturationThreshold(4), WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	return c, logs
}
