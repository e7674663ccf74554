package mesh

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// reps is how many times a racing pairing is repeated: n with
// NATSMESH_LONG=1 (CI's long step runs this package so), a third of it in
// the README's quick suite (go test -race ./..., which must fit five
// minutes cold on two cores), a tenth with -short; never fewer than five,
// and never more than n (a pairing repeated 3 times in the long suite ran
// 5 times in the quick one).
func reps(t *testing.T, n int) int {
	switch {
	case natstest.Long():
		return n
	case testing.Short():
		return min(n, max(n/10, 5))
	default:
		return min(n, max(n/3, 5))
	}
}

// routeResolver routes each address by a function of the address and how
// many times it was resolved.
type routeResolver struct {
	mu    sync.Mutex
	calls map[subjects.Address]int
	fn    func(addr subjects.Address, call int) subjects.NodeID
}

func newRouteResolver(fn func(addr subjects.Address, call int) subjects.NodeID) *routeResolver {
	return &routeResolver{calls: map[subjects.Address]int{}, fn: fn}
}

func (r *routeResolver) Resolve(_ context.Context, addr subjects.Address) (subjects.NodeID, error) {
	r.mu.Lock()
	r.calls[addr]++
	call := r.calls[addr]
	r.mu.Unlock()
	return r.fn(addr, call), nil
}

func (r *routeResolver) Invalidate(subjects.Address, subjects.NodeID) {}

func (r *routeResolver) resolved(addr subjects.Address) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[addr]
}

// TestSlotDepartureRace is the smallest input: with one slot,
// delivery 1 holds it at a node that does not answer; delivery 2, addressed
// to owner X, waits for the slot (or, in some repetitions, is in flight to
// X); X departs. Delivery 2 held nothing at X: it must get the resendable
// departed verdict, be re-resolved and accepted by the survivor — never
// Failed. The departure races the slot's release in half the repetitions.
func TestSlotDepartureRace(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	surv, _ := testNode(t, s, "surv")
	hang := subjects.NodeID{Name: "hang", Generation: 1}
	held := holdIntake(t, s, hang)
	res := newRouteResolver(func(addr subjects.Address, call int) subjects.NodeID {
		var rep, which int
		fmt.Sscanf(string(addr), "rec/d%d-%d", &which, &rep)
		switch {
		case which == 1:
			return hang
		case call == 1:
			return subjects.NodeID{Name: "x", Generation: uint64(rep + 1)}
		}
		return surv.ID()
	})
	c := newClient(t, natstest.Connect(t, s), res, WithMaxInFlight(1), WithRetry(RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond}))
	for rep := range reps(t, 200) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		d1 := c.DeliverAsync(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/d1-%d", rep))})
		natstest.Eventually(t, 10*time.Second, func() bool { return held.count() == 1 }, "delivery 1 holds the slot")
		a2 := subjects.Address(fmt.Sprintf("rec/d2-%d", rep))
		d2 := c.DeliverAsync(ctx, Delivery{To: a2})
		natstest.Eventually(t, 10*time.Second, func() bool { return res.resolved(a2) == 1 }, "delivery 2 resolved X")
		x := subjects.NodeID{Name: "x", Generation: uint64(rep + 1)}
		if rep%2 == 0 {
			c.failNode(x, "test departure")
			held.release(hang)
		} else {
			go held.release(hang)
			c.failNode(x, "test departure")
		}
		r1, r2 := <-d1, <-d2
		cancel()
		if r1.Err != nil {
			t.Fatalf("rep %d: delivery 1: %v", rep, r1.Err)
		}
		if r2.Err != nil {
			t.Fatalf("rep %d: delivery 2 waiting for the slot to departed X: %v (resendable %v, %v); want re-resolved and accepted by the survivor",
				rep, r2.Err, verdict.IsResendable(r2.Err), verdict.Classify(r2.Err))
		}
		if r2.Node != surv.ID() || r2.Attempts < 2 {
			t.Fatalf("rep %d: delivery 2 receipt %+v; want accepted by %s after a re-resolve", rep, r2.Receipt, surv.ID())
		}
	}
}

// acceptingIntake answers every delivery to any generation of node name
// Accepted at once, naming the generation from the subject, and — if
// respond is set — sends respond's payload as the response afterwards. It
// counts what it accepted.
type acceptingIntake struct {
	mu       sync.Mutex
	accepted map[string]int
	respond  func(id string) []byte // nil: never respond
	after    func(node subjects.NodeID)
}

func acceptIntake(t *testing.T, s *server.Server, name string, respond func(id string) []byte) *acceptingIntake {
	t.Helper()
	in := &acceptingIntake{accepted: map[string]int{}, respond: respond}
	nc := natstest.Connect(t, s)
	if _, err := nc.Subscribe(string(subjects.DefaultPrefix)+".dlv."+name+".>", func(m *nats.Msg) {
		d, err := subjects.DefaultPrefix.ParseDelivery(m.Subject)
		if err != nil {
			t.Errorf("intake: %v", err)
			return
		}
		id := m.Header.Get(hub.HeaderID)
		in.mu.Lock()
		in.accepted[id]++
		in.mu.Unlock()
		r := nats.NewMsg(m.Reply)
		verdict.Encode(r.Header, nil, d.Node.String())
		key := "key-of-" + d.Node.String()
		r.Header.Set(hub.HeaderAnswerKey, key)
		_ = m.RespondMsg(r)
		if in.respond != nil {
			a := nats.NewMsg(m.Header.Get(hub.HeaderAnswerTo))
			a.Header.Set(hub.HeaderID, id)
			a.Header.Set(hub.HeaderAnswer, hub.AnswerResponse)
			a.Header.Set(hub.HeaderAnswerToken, hub.AnswerTokenOf(key, id))
			verdict.Encode(a.Header, nil, d.Node.String())
			a.Data = in.respond(id)
			_ = nc.PublishMsg(a)
		}
		if in.after != nil {
			in.after(d.Node)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return in
}

func (in *acceptingIntake) count(id string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.accepted[id]
}

// genResolver sends address "k/<n>" to generation n of name.
func genResolver(name string) Resolver {
	return newRouteResolver(func(addr subjects.Address, _ int) subjects.NodeID {
		var n uint64
		fmt.Sscanf(string(addr), "k/%d", &n)
		return subjects.NodeID{Name: name, Generation: n + 1}
	})
}

// TestSlotDeadline: a delivery whose deadline passes while it waits for an
// in-flight slot held nothing anywhere: resendable Unavailable
// (verdict.ErrDeadlineUnsent), never a timeout — also when its owner's
// departure races the deadline.
func TestSlotDeadline(t *testing.T) {
	s := natstest.RunServer(t)
	hang := subjects.NodeID{Name: "hang", Generation: 1}
	held := holdIntake(t, s, hang)
	res := newRouteResolver(func(addr subjects.Address, call int) subjects.NodeID {
		if addr == "rec/hold" {
			return hang
		}
		var rep uint64
		fmt.Sscanf(string(addr), "rec/w%d", &rep)
		return subjects.NodeID{Name: "x", Generation: rep + 1}
	})
	c := newClient(t, natstest.Connect(t, s), res, WithMaxInFlight(1), WithRetry(RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond}))
	d1 := c.DeliverAsync(context.Background(), Delivery{To: "rec/hold"})
	natstest.Eventually(t, 10*time.Second, func() bool { return held.count() == 1 }, "delivery 1 holds the slot")
	for rep := range reps(t, 200) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		addr := subjects.Address(fmt.Sprintf("rec/w%d", rep))
		if rep%2 == 1 {
			go func() {
				<-ctx.Done()
				c.failNode(subjects.NodeID{Name: "x", Generation: uint64(rep + 1)}, "racing the deadline")
			}()
		}
		_, err := c.Deliver(ctx, Delivery{To: addr})
		cancel()
		if !errors.Is(err, verdict.ErrDeadlineUnsent) || !verdict.IsResendable(err) || verdict.Classify(err) != verdict.Unavailable || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rep %d: %v; want the deadline passed with nothing sent (resendable Unavailable, not a timeout)", rep, err)
		}
	}
	held.release(hang)
	if r := <-d1; r.Err != nil {
		t.Fatal(r.Err)
	}
}

// TestLaneDeadline: a delivery whose deadline passes while it waits behind
// its lane's head (the window is full: 1 here) was never sent: resendable
// Unavailable, not a timeout.
func TestLaneDeadline(t *testing.T) {
	s := natstest.RunServer(t)
	hang := subjects.NodeID{Name: "hang", Generation: 1}
	held := holdIntake(t, s, hang)
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: hang}, WithWindow(1))
	d1 := c.DeliverAsync(context.Background(), Delivery{To: "rec/lane"})
	natstest.Eventually(t, 10*time.Second, func() bool { return held.count() == 1 }, "delivery 1 holds the lane")
	for rep := range reps(t, 200) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		_, err := c.Deliver(ctx, Delivery{To: "rec/lane"})
		cancel()
		if !errors.Is(err, verdict.ErrDeadlineUnsent) || !verdict.IsResendable(err) || verdict.Classify(err) != verdict.Unavailable {
			t.Fatalf("rep %d: %v; want resendable Unavailable", rep, err)
		}
	}
	held.release(hang)
	if r := <-d1; r.Err != nil {
		t.Fatal(r.Err)
	}
}

// TestSlotClosing: closing the client while one delivery is in flight and
// another waits for the slot ends both at once with verdict.ErrClosing
// (ShuttingDown, resendable by another process), also when the waiting
// delivery's owner departs at the same moment.
func TestSlotClosing(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	hang := subjects.NodeID{Name: "hang", Generation: 1}
	held := holdIntake(t, s, hang)
	x := subjects.NodeID{Name: "x", Generation: 1}
	res := newRouteResolver(func(addr subjects.Address, _ int) subjects.NodeID {
		if addr == "rec/hold" {
			return hang
		}
		return x
	})
	nc := natstest.Connect(t, s)
	for rep := range reps(t, 100) {
		c, err := NewClient(Config{Conn: nc, Resolver: res}, WithMaxInFlight(1))
		if err != nil {
			t.Fatal(err)
		}
		before := held.count()
		d1 := c.DeliverAsync(context.Background(), Delivery{To: "rec/hold"})
		natstest.Eventually(t, 10*time.Second, func() bool { return held.count() == before+1 }, "delivery 1 holds the slot")
		d2 := c.DeliverAsync(context.Background(), Delivery{To: "rec/wait"})
		natstest.Eventually(t, 10*time.Second, func() bool { return c.waiting() == 1 }, "delivery 2 waits for the slot")
		if rep%2 == 1 {
			go c.failNode(x, "racing Close")
		}
		c.Close()
		for i, r := range []Result{<-d1, <-d2} {
			if !errors.Is(r.Err, verdict.ErrClosing) || !verdict.IsResendable(r.Err) || verdict.Classify(r.Err) != verdict.ShuttingDown {
				t.Fatalf("rep %d delivery %d: %v; want ErrClosing (ShuttingDown)", rep, i+1, r.Err)
			}
		}
	}
}

// TestBackoffDeparture: a delivery backing off after its owner refused it
// is re-resolved at once when that owner departs; without a departure its
// deadline passing in back-off is resendable Unavailable.
func TestBackoffDeparture(t *testing.T) {
	s := natstest.RunServer(t)
	surv, _ := testNode(t, s, "surv")
	refuser := natstest.Connect(t, s)
	if _, err := refuser.Subscribe(string(subjects.DefaultPrefix)+".dlv.x.>", func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		verdict.Encode(r.Header, verdict.New(verdict.ReasonHubShuttingDown, "draining"), "")
		_ = m.RespondMsg(r)
	}); err != nil {
		t.Fatal(err)
	}
	res := newRouteResolver(func(addr subjects.Address, call int) subjects.NodeID {
		var rep uint64
		fmt.Sscanf(string(addr), "rec/b%d", &rep)
		if call == 1 || rep%2 == 1 {
			return subjects.NodeID{Name: "x", Generation: rep + 1}
		}
		return surv.ID()
	})
	clock := newGatedClock() // back-offs last until their ctx ends
	c := newClient(t, natstest.Connect(t, s), res, WithClock(clock))
	inBackoff := 0
	for rep := range reps(t, 200) {
		addr := subjects.Address(fmt.Sprintf("rec/b%d", rep))
		x := subjects.NodeID{Name: "x", Generation: uint64(rep + 1)}
		if rep%2 == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			ch := c.DeliverAsync(ctx, Delivery{To: addr})
			natstest.Eventually(t, 10*time.Second, func() bool { return c.backingOff() == 1 }, "backing off")
			c.failNode(x, "test departure")
			r := <-ch
			cancel()
			if r.Err != nil || r.Node != surv.ID() || r.Attempts != 2 {
				t.Fatalf("rep %d: %+v %v; want re-resolved at once and accepted by the survivor", rep, r.Receipt, r.Err)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := c.Deliver(ctx, Delivery{To: addr})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && !verdict.IsResendable(err) && strings.Contains(err.Error(), "attempt 1") {
			continue // other facts: the deadline passed with the first leg in flight (a loaded machine)
		}
		if !errors.Is(err, verdict.ErrDeadlineUnsent) || !verdict.IsResendable(err) || verdict.Classify(err) != verdict.Unavailable {
			t.Fatalf("rep %d: %v; want resendable Unavailable", rep, err)
		}
		inBackoff++
	}
	if inBackoff == 0 {
		t.Errorf("no repetition reached its deadline in back-off")
	}
}

// TestAcceptedRequestDeparture: a Request accepted by an owner that departs
// before its response fails at once with verdict.ErrOutcomeUnknown (Failed,
// transient, not resendable) — never the resendable departed verdict, which
// would run the handler twice — unless it is Idempotent (then the departed
// verdict, ShuttingDown). The departure races the caller's deadline in a
// third of the repetitions: the verdict stays non-resendable.
func TestAcceptedRequestDeparture(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	in := acceptIntake(t, s, "acc", nil)
	c := newClient(t, natstest.Connect(t, s), genResolver("acc"))
	for rep := range reps(t, 300) {
		idem := rep%2 == 1
		racing := rep%3 == 2
		timeout := 20 * time.Second
		if racing {
			timeout = 5 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		node := subjects.NodeID{Name: "acc", Generation: uint64(rep + 1)}
		id := fmt.Sprintf("req-%d", rep)
		ch := make(chan error, 1)
		go func() {
			_, err := c.Request(ctx, Delivery{ID: id, To: subjects.Address(fmt.Sprintf("k/%d", rep)), Idempotent: idem})
			ch <- err
		}()
		if racing {
			<-ctx.Done()
		} else {
			natstest.Eventually(t, 10*time.Second, func() bool { return in.count(id) == 1 && c.awaiting() == 1 }, "accepted")
		}
		c.failNode(node, "test departure")
		err := <-ch
		cancel()
		if n := in.count(id); n == 0 && racing {
			// A loaded machine: the deadline passed before it was sent
			// (resendable), or with the leg in flight (a timeout).
			unsent := errors.Is(err, verdict.ErrDeadlineUnsent) && verdict.IsResendable(err)
			timedOut := errors.Is(err, context.DeadlineExceeded) && !verdict.IsResendable(err) && verdict.Classify(err) == verdict.Failed
			if !unsent && !timedOut {
				t.Fatalf("rep %d: not accepted, yet %v", rep, err)
			}
			continue
		} else if n != 1 {
			t.Fatalf("rep %d: sent %d times", rep, n)
		}
		switch {
		case racing && errors.Is(err, context.DeadlineExceeded):
			if verdict.IsResendable(err) || verdict.Classify(err) != verdict.Failed {
				t.Fatalf("rep %d: timeout %v reads resendable", rep, err)
			}
		case racing && errors.Is(err, verdict.ErrDeadlineUnsent):
			// The departure cancelled the leg before its Accepted reply
			// was read (the sender never learned of the acceptance: the
			// at-least-once window of a departure, DESIGN §6), then the
			// deadline passed before a re-send.
			if !strings.Contains(err.Error(), "departed") || !verdict.IsResendable(err) {
				t.Fatalf("rep %d: %v", rep, err)
			}
		case idem:
			if !errors.Is(err, verdict.ErrDeparted) || errors.Is(err, verdict.ErrOutcomeUnknown) || !verdict.IsResendable(err) || verdict.Classify(err) != verdict.ShuttingDown {
				t.Fatalf("rep %d (idempotent): %v; want the departed verdict", rep, err)
			}
		default:
			if !errors.Is(err, verdict.ErrOutcomeUnknown) || verdict.IsResendable(err) || !verdict.IsTransient(err) || verdict.Classify(err) != verdict.Failed {
				t.Fatalf("rep %d: %v; want outcome unknown (Failed, not resendable)", rep, err)
			}
		}
	}
}

// TestResponseDepartureRace: the owner accepts, responds and departs at
// once, so its response races the departure. Each Request ends with exactly
// one verdict: its own response; outcome unknown (accepted, then departed);
// or — when the departure cancelled the leg before its Accepted reply was
// read — the resendable departed verdict. Every response that lost the race
// is counted (unmatched; forged or stale when its acceptance was never read),
// never handed to another call.
func TestResponseDepartureRace(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	in := acceptIntake(t, s, "acc", func(id string) []byte { return []byte("re:" + id) })
	c := newClient(t, natstest.Connect(t, s), genResolver("acc"), WithRetry(RetryPolicy{MaxRetries: -1}))
	in.after = func(node subjects.NodeID) { c.failNode(node, "racing the response") }
	n := reps(t, 300)
	var answered, unknown, departed int
	for rep := range n {
		id := fmt.Sprintf("r-%d", rep)
		resp, err := c.Request(context.Background(), Delivery{ID: id, To: subjects.Address(fmt.Sprintf("k/%d", rep))})
		switch {
		case err == nil:
			if string(resp.Payload) != "re:"+id {
				t.Fatalf("rep %d: response %q for another call", rep, resp.Payload)
			}
			answered++
		case errors.Is(err, verdict.ErrOutcomeUnknown):
			if verdict.IsResendable(err) {
				t.Fatalf("rep %d: %v reads resendable", rep, err)
			}
			unknown++
		case errors.Is(err, verdict.ErrDeparted) && verdict.IsResendable(err):
			departed++
		default:
			t.Fatalf("rep %d: %v", rep, err)
		}
	}
	// A response whose acceptance reply was never read cannot be verified
	// (its generation's answer key is unknown): it counts as forged; once
	// the key is known, as stale — the sender gave that leg up
	// (abandonedLegs), so its generation does not answer the delivery.
	natstest.Eventually(t, 10*time.Second, func() bool {
		st := c.Stats()
		return st.Unmatched >= int64(unknown) && st.Unmatched+st.ForgedAnswers+st.StaleAnswers == int64(unknown+departed)
	}, "late responses counted: %d unknown + %d departed, %+v", unknown, departed, c.Stats())
	t.Logf("%d answered, %d outcome unknown, %d departed before the reply was read; %d unmatched responses", answered, unknown, departed, c.Stats().Unmatched)
}

// TestLinkDropFailsAwaitedRequests: when the sender's own link drops, an
// accepted Request awaiting its response fails at once with outcome unknown
// (or, Idempotent, with the resendable disconnect), not at its deadline;
// deliveries after the reconnect flow normally.
func TestLinkDropFailsAwaitedRequests(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	release := make(chan struct{})
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.Type == "block" {
			<-release
		}
		return nil
	}
	defer close(release)
	nc := natstest.Connect(t, s, nats.ReconnectWait(10*time.Millisecond))
	c := newClient(t, nc, StaticResolver{Node: n.ID()})
	for rep := range reps(t, 20) {
		idem := rep%2 == 1
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		ch := make(chan error, 1)
		go func() {
			_, err := c.Request(ctx, Delivery{To: "rec/x", Type: "block", Idempotent: idem})
			ch <- err
		}()
		natstest.Eventually(t, 10*time.Second, func() bool { return c.awaiting() == 1 }, "accepted")
		dropped := time.Now()
		if err := nc.ForceReconnect(); err != nil {
			t.Fatal(err)
		}
		err := <-ch
		took := time.Since(dropped)
		cancel()
		if idem {
			if !errors.Is(err, nats.ErrDisconnected) || !verdict.IsResendable(err) || verdict.Classify(err) != verdict.ShuttingDown {
				t.Fatalf("rep %d (idempotent): %v; want the resendable disconnect", rep, err)
			}
		} else if !errors.Is(err, verdict.ErrOutcomeUnknown) || verdict.IsResendable(err) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rep %d: %v; want outcome unknown, not a timeout", rep, err)
		}
		if rep == 0 {
			t.Logf("awaited request failed %v after the link dropped", took)
		}
		natstest.Eventually(t, 10*time.Second, nc.IsConnected, "reconnected")
		resp, err := c.Request(context.Background(), Delivery{To: "rec/after"})
		if err != nil || resp.Node != n.ID() {
			t.Fatalf("rep %d: after the reconnect: %+v %v", rep, resp, err)
		}
	}
}

// TestCloseFailsAwaitedRequest: closing the client fails an accepted
// Request at once with outcome unknown (Idempotent: ErrClosing).
func TestCloseFailsAwaitedRequest(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	acceptIntake(t, s, "acc", nil)
	nc := natstest.Connect(t, s)
	for rep := range reps(t, 50) {
		c, err := NewClient(Config{Conn: nc, Resolver: genResolver("acc")})
		if err != nil {
			t.Fatal(err)
		}
		idem := rep%2 == 1
		ch := make(chan error, 1)
		go func() {
			_, err := c.Request(context.Background(), Delivery{To: "k/1", Idempotent: idem})
			ch <- err
		}()
		natstest.Eventually(t, 10*time.Second, func() bool { return c.awaiting() == 1 }, "accepted")
		c.Close()
		err = <-ch
		if idem {
			if !errors.Is(err, verdict.ErrClosing) || errors.Is(err, verdict.ErrOutcomeUnknown) {
				t.Fatalf("rep %d (idempotent): %v", rep, err)
			}
		} else if !errors.Is(err, verdict.ErrOutcomeUnknown) || verdict.IsResendable(err) {
			t.Fatalf("rep %d: %v; want outcome unknown", rep, err)
		}
	}
}

// TestCountsFinalOutcome: the counters record each delivery once by its
// final outcome — a Request whose handler failed is Failed, one whose
// response never came is a Timeout — and acceptance apart.
func TestCountsFinalOutcome(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	release := make(chan struct{})
	defer close(release)
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		switch d.Type {
		case "fail":
			return errors.New("no")
		case "block":
			<-release
		}
		return nil
	}
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()})
	ctx := context.Background()
	if _, err := c.Deliver(ctx, Delivery{To: "rec/a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Request(ctx, Delivery{To: "rec/b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Request(ctx, Delivery{To: "rec/c", Type: "fail"}); !errors.Is(err, verdict.ErrHandler) {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Request(tctx, Delivery{To: "rec/d", Type: "block"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if _, err := c.Deliver(ctx, Delivery{To: "rec/e", ID: "has space"}); !errors.Is(err, verdict.ErrInvalidID) {
		t.Fatal(err)
	}
	st := c.Stats()
	want := map[string]int64{"Accepted": 2, "Failed": 2, "Timeout": 1, "ShuttingDown": 0, "Unavailable": 0, "Ignored": 0}
	for k, v := range want {
		if st.ByVerdict[k] != v {
			t.Errorf("ByVerdict[%s] = %d, want %d (%+v)", k, st.ByVerdict[k], v, st)
		}
	}
	if st.Accepted != 4 || st.Failed != 3 {
		t.Errorf("accepted %d (want 4: every acceptance), failed %d (want 3: handler error, timeout, invalid ID)", st.Accepted, st.Failed)
	}
}

// TestDeliveryIDs: the sender refuses IDs that NATS header trimming could
// merge, before anything is sent; generated IDs are valid.
func TestDeliveryIDs(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	ctx := context.Background()
	for _, id := range []string{"a ", " a", "a b", "a\r\n", "a\tb", "é", string(make([]byte, 129)), "x\x00"} {
		_, err := n.Deliver(ctx, Delivery{To: "rec/x", ID: id})
		if !errors.Is(err, verdict.ErrInvalidID) || !errors.Is(err, verdict.ErrBadRequest) || verdict.IsTransient(err) {
			t.Errorf("ID %q: %v; want ErrInvalidID", id, err)
		}
		_, err = n.Request(ctx, Delivery{To: "rec/x", ID: id})
		if !errors.Is(err, verdict.ErrInvalidID) {
			t.Errorf("Request ID %q: %v; want ErrInvalidID", id, err)
		}
	}
	for _, id := range []string{"a", "~!#$%&'()*+,-./:;<=>?@[]^_`{|}", fmt.Sprintf("%0128d", 7)} {
		if _, err := n.Deliver(ctx, Delivery{To: "rec/x", ID: id}); err != nil {
			t.Errorf("ID %q: %v", id, err)
		}
	}
	for range 100 {
		r, err := n.Deliver(ctx, Delivery{To: "rec/y"})
		if err != nil || hub.ValidateID(r.ID) != nil {
			t.Fatalf("generated ID %q: %v", r.ID, err)
		}
	}
	if rec.total() > 103 {
		t.Errorf("invalid IDs were handled")
	}
}

// TestIngressRefusesInvalidID: the ingress refuses a Mesh-Id that is not
// printable ASCII without spaces with Failed/invalid-id, handling nothing.
func TestIngressRefusesInvalidID(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	_, rec := testNode(t, s, "a")
	plain := natstest.Connect(t, s)
	for _, id := range []string{"a b", "a\tb", "é-id", fmt.Sprintf("%0129d", 1)} {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("rec/x", ""))
		m.Header.Set(hub.HeaderID, id)
		r, err := plain.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, verr := verdict.Decode(r.Header)
		if !errors.Is(verr, verdict.ErrInvalidID) || r.Header.Get(verdict.HeaderReason) != "invalid-id" || verdict.Classify(verr) != verdict.Failed {
			t.Errorf("ingress ID %q: %v (%v)", id, verr, r.Header)
		}
	}
	if rec.total() != 0 {
		t.Errorf("%d handled", rec.total())
	}
}

// TestRepeatedDepartureNoticeKeepsLadder: one departure reaches the client
// as several notices (the advisory, the registry expiry, the takeover). The
// first cuts the back-off of a delivery that met the departed owner short
// (re-resolve now); once the owner is known gone, the later notices must
// not each spend an attempt of the ladder at once — they did, and a
// Deliver then returned ShuttingDown to its caller within two seconds of a
// departure instead of waiting for the takeover.
func TestRepeatedDepartureNoticeKeepsLadder(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	x := subjects.NodeID{Name: "x", Generation: 1} // nobody subscribes: no responders
	res := newRouteResolver(func(subjects.Address, int) subjects.NodeID { return x })
	clock := newGatedClock() // back-offs last until the gate opens
	// The cluster view, which knows x gone from the first notice on, as a
	// node's does.
	view := newGoneView()
	c := newClient(t, natstest.Connect(t, s), res, WithClock(clock), WithView(view))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch := c.DeliverAsync(ctx, Delivery{To: "rec/r"})
	sleeps := func() int { return len(clock.recorded()) }
	natstest.Eventually(t, 10*time.Second, func() bool { return c.backingOff() == 1 && sleeps() == 1 }, "first back-off")
	view.depart(c, x, "disconnected") // cuts it short: the next attempt meets x known gone
	natstest.Eventually(t, 10*time.Second, func() bool { return c.backingOff() == 1 && sleeps() == 2 }, "second back-off")
	for range 5 {
		view.depart(c, x, "expired") // the same departure again
	}
	if n := c.countFlights(func(f *flight) bool { return f.backoff && !f.woken }); n != 1 {
		t.Fatalf("a repeated notice cut the back-off short (%d flights still backing off undisturbed)", n)
	}
	if n := sleeps(); n != 2 {
		t.Fatalf("%d back-offs after repeated notices of one departure, want 2", n)
	}
	clock.open()
	r := <-ch
	if !errors.Is(r.Err, verdict.ErrDeparted) || !verdict.IsResendable(r.Err) || r.Attempts != 7 {
		t.Fatalf("%+v %v; want the whole ladder (7 attempts), departed", r.Receipt, r.Err)
	}
}
