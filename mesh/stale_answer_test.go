package mesh

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// fakeNode answers legs on its delivery subject as the hub would — Accepted
// with its answer key — except while hold is set: then it keeps the leg
// unanswered (a frozen process with the leg in its socket buffer).
type fakeNode struct {
	id   subjects.NodeID
	key  string
	nc   *nats.Conn
	mu   sync.Mutex
	hold bool
	held []*nats.Msg
}

func startFakeNode(t *testing.T, nc *nats.Conn, id subjects.NodeID, key string) *fakeNode {
	t.Helper()
	f := &fakeNode{id: id, key: key, nc: nc}
	if _, err := nc.Subscribe(string(subjects.DefaultPrefix)+".dlv."+id.Name+"."+id.String()[len(id.Name)+1:]+".>", func(m *nats.Msg) {
		f.mu.Lock()
		if f.hold {
			f.held = append(f.held, m)
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		r := nats.NewMsg(m.Reply)
		verdict.Encode(r.Header, nil, id.String())
		r.Header.Set(hub.HeaderAnswerKey, key)
		_ = nc.PublishMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// lateVerdict publishes a genuine late verdict of f for id to answerTo.
func (f *fakeNode) lateVerdict(t *testing.T, answerTo, id string) {
	t.Helper()
	m := nats.NewMsg(answerTo)
	m.Header.Set(hub.HeaderID, id)
	m.Header.Set(hub.HeaderAnswer, hub.AnswerVerdict)
	m.Header.Set(hub.HeaderAnswerToken, hub.AnswerTokenOf(f.key, id))
	verdict.Encode(m.Header, verdict.New(verdict.ReasonHubShuttingDown, "deactivated before handling"), f.id.String())
	if err := f.nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
}

// TestAnswerFromAbandonedLeg (found by the nemesis, issue 21, seed 2107): a
// leg in flight to a generation that departs gets the resendable departed
// verdict and is re-sent to another generation, which accepts it. When the
// departed generation wakes and answers the leg it still held (a genuine
// late verdict: its token is right), the sender drops it: only the
// generation whose acceptance it took answers the delivery (DESIGN §5). The
// accepting generation's late verdict still reaches the caller.
func TestAnswerFromAbandonedLeg(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	x := startFakeNode(t, natstest.Connect(t, s), subjects.NodeID{Name: "x", Generation: 1}, "key-x")
	y := startFakeNode(t, natstest.Connect(t, s), subjects.NodeID{Name: "y", Generation: 1}, "key-y")
	var mu sync.Mutex
	late := map[string][]error{}
	owner := x.id
	var ownerMu sync.Mutex
	res := &countingResolver{fn: func(int, subjects.Address) subjects.NodeID {
		ownerMu.Lock()
		defer ownerMu.Unlock()
		return owner
	}}
	c := newClient(t, natstest.Connect(t, s), res, WithRetry(RetryPolicy{MaxRetries: 3, Initial: time.Millisecond, Max: time.Millisecond}), WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		late[v.ID] = append(late[v.ID], v.Err)
		mu.Unlock()
	}))
	ctx := context.Background()
	for round := range 20 {
		ownerMu.Lock()
		owner = x.id
		ownerMu.Unlock()
		// x accepts one delivery: the client learns its answer key.
		if _, err := c.Deliver(ctx, Delivery{To: "rec/warm"}); err != nil {
			t.Fatal(err)
		}
		x.mu.Lock()
		x.hold = true
		x.mu.Unlock()
		id := "abandoned-" + string(rune('a'+round))
		done := make(chan error, 1)
		go func() {
			r, err := c.Deliver(ctx, Delivery{To: "rec/a", ID: id})
			if err == nil && r.Node != y.id {
				err = fmt.Errorf("accepted by %v, want y", r.Node)
			}
			done <- err
		}()
		natstest.Eventually(t, 5*time.Second, func() bool { x.mu.Lock(); defer x.mu.Unlock(); return len(x.held) == 1 }, "leg held by x")
		ownerMu.Lock()
		owner = y.id
		ownerMu.Unlock()
		c.failNode(x.id, "test: x departed")
		if err := <-done; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		stale := c.Stats().StaleAnswers
		x.lateVerdict(t, c.answerTo(), id) // x wakes and answers the leg it held
		natstest.Eventually(t, 5*time.Second, func() bool { return c.Stats().StaleAnswers == stale+1 }, "x's answer not dropped as stale")
		y.lateVerdict(t, c.answerTo(), id) // the accepting generation's answer is taken
		natstest.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(late[id]) == 1 }, "y's late verdict not delivered")
		mu.Lock()
		if n := len(late[id]); n != 1 {
			t.Fatalf("round %d: %d late verdicts for %s, want only y's", round, n, id)
		}
		mu.Unlock()
		x.mu.Lock()
		x.hold, x.held = false, nil
		x.mu.Unlock()
	}
}

// TestAbandonedThenAcceptedBySameGeneration (found by a hostile tester): a
// leg abandoned at generation x (x reported departed while it held the
// leg), whose delivery is then re-sent under the same ID to x — alive after
// all — and accepted there: x's genuine late verdict for that acceptance
// reaches the caller. The abandonment is forgotten once x accepts the ID.
func TestAbandonedThenAcceptedBySameGeneration(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	x := startFakeNode(t, natstest.Connect(t, s), subjects.NodeID{Name: "x", Generation: 1}, "key-x")
	var mu sync.Mutex
	var late []error
	res := &countingResolver{fn: func(int, subjects.Address) subjects.NodeID { return x.id }}
	c := newClient(t, natstest.Connect(t, s), res, WithRetry(RetryPolicy{MaxRetries: -1}), WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		late = append(late, v.Err)
		mu.Unlock()
	}))
	ctx := context.Background()
	if _, err := c.Deliver(ctx, Delivery{To: "rec/warm"}); err != nil {
		t.Fatal(err)
	}
	x.mu.Lock()
	x.hold = true
	x.mu.Unlock()
	id := "same-gen-resend"
	done := make(chan error, 1)
	go func() { _, err := c.Deliver(ctx, Delivery{To: "rec/a", ID: id}); done <- err }()
	natstest.Eventually(t, 5*time.Second, func() bool { x.mu.Lock(); defer x.mu.Unlock(); return len(x.held) == 1 }, "leg held by x")
	c.failNode(x.id, "test: x thought departed")
	if err := <-done; !verdict.IsResendable(err) {
		t.Fatalf("abandoned leg: %v, want resendable", err)
	}
	x.mu.Lock()
	x.hold, x.held = false, nil
	x.mu.Unlock()
	if r, err := c.Deliver(ctx, Delivery{To: "rec/a", ID: id}); err != nil || r.Node != x.id {
		t.Fatalf("re-send: %v %v", r.Node, err)
	}
	x.lateVerdict(t, c.answerTo(), id) // the accepting generation's genuine late verdict
	natstest.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(late) == 1 }, "late verdict of the accepting generation not delivered (stale drops %d)", c.Stats().StaleAnswers)
}

// TestAnswerBeforeAbandonment (found by a hostile tester): a plain
// delivery's leg is in flight to x, which holds it (its acceptance reply
// is lost or late); x sends a genuine late verdict for the delivery while
// the sender still waits for the leg's reply; then x is reported departed,
// the leg is abandoned, and the delivery is re-sent to y, which accepts it.
// x's verdict arrived before the sender gave the leg up, so the abandonment
// record did not catch it: it was reported to the caller although y, not
// x, holds the delivery. An answer for a leg still in flight is held until
// the leg's outcome decides it: dropped as stale when the leg is abandoned
// (or refused), reported when that generation accepts the leg. Both
// orders of the verdict and the acceptance, 10 rounds each.
func TestAnswerBeforeAbandonment(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	x := startFakeNode(t, natstest.Connect(t, s), subjects.NodeID{Name: "x", Generation: 1}, "key-x")
	y := startFakeNode(t, natstest.Connect(t, s), subjects.NodeID{Name: "y", Generation: 1}, "key-y")
	var mu sync.Mutex
	late := map[string][]error{}
	owner := x.id
	var ownerMu sync.Mutex
	res := &countingResolver{fn: func(int, subjects.Address) subjects.NodeID {
		ownerMu.Lock()
		defer ownerMu.Unlock()
		return owner
	}}
	c := newClient(t, natstest.Connect(t, s), res, WithRetry(RetryPolicy{MaxRetries: 3, Initial: time.Millisecond, Max: time.Millisecond}), WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		late[v.ID] = append(late[v.ID], v.Err)
		mu.Unlock()
	}))
	ctx := context.Background()
	// heldEarly reports whether the flight of id to x holds an answer.
	heldEarly := func(id string) bool {
		c.fl.mu.Lock()
		defer c.fl.mu.Unlock()
		for f := range c.fl.byNode[x.id] {
			f.mu.Lock()
			n := len(f.early)
			mine := f.id == id
			f.mu.Unlock()
			if mine && n > 0 {
				return true
			}
		}
		return false
	}
	for round := range 20 {
		abandon := round%2 == 0
		ownerMu.Lock()
		owner = x.id
		ownerMu.Unlock()
		if _, err := c.Deliver(ctx, Delivery{To: "rec/warm"}); err != nil { // the client learns x's key
			t.Fatal(err)
		}
		x.mu.Lock()
		x.hold = true
		x.mu.Unlock()
		id := fmt.Sprintf("early-%d", round)
		done := make(chan Receipt, 1)
		go func() {
			r, err := c.Deliver(ctx, Delivery{To: "rec/a", ID: id})
			if err != nil {
				t.Errorf("round %d: %v", round, err)
			}
			done <- r
		}()
		natstest.Eventually(t, 5*time.Second, func() bool { x.mu.Lock(); defer x.mu.Unlock(); return len(x.held) == 1 }, "leg held by x")
		x.lateVerdict(t, c.answerTo(), id) // before the leg's outcome
		natstest.Eventually(t, 5*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return heldEarly(id) || len(late[id]) > 0
		}, "x's answer not seen")
		mu.Lock()
		if n := len(late[id]); n != 0 {
			t.Fatalf("round %d: x's verdict reported while its leg was still in flight: %v", round, late[id])
		}
		mu.Unlock()
		x.mu.Lock()
		held := x.held
		x.hold, x.held = false, nil
		x.mu.Unlock()
		if abandon {
			stale := c.Stats().StaleAnswers
			ownerMu.Lock()
			owner = y.id
			ownerMu.Unlock()
			c.failNode(x.id, "test: x departed")
			if r := <-done; r.Node != y.id {
				t.Fatalf("round %d: accepted by %v, want y", round, r.Node)
			}
			natstest.Eventually(t, 5*time.Second, func() bool { return c.Stats().StaleAnswers == stale+1 }, "x's held answer not dropped as stale")
			y.lateVerdict(t, c.answerTo(), id)
		} else {
			// x answers the leg after all: it accepted, so its verdict stands.
			r := nats.NewMsg(held[0].Reply)
			verdict.Encode(r.Header, nil, x.id.String())
			r.Header.Set(hub.HeaderAnswerKey, x.key)
			if err := x.nc.PublishMsg(r); err != nil {
				t.Fatal(err)
			}
			if r := <-done; r.Node != x.id {
				t.Fatalf("round %d: accepted by %v, want x", round, r.Node)
			}
		}
		natstest.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(late[id]) == 1 }, "the accepting generation's late verdict not delivered")
		mu.Lock()
		if n := len(late[id]); n != 1 {
			t.Fatalf("round %d: %d late verdicts, want the accepting generation's only", round, n)
		}
		mu.Unlock()
	}
}
