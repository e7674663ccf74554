package mesh

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// isUnsentVerdict reports whether err is the verdict of a delivery whose
// deadline passed before any leg left: resendable Unavailable, never a
// timeout.
func isUnsentVerdict(err error) bool {
	return errors.Is(err, verdict.ErrDeadlineUnsent) && verdict.IsResendable(err) &&
		verdict.Classify(err) == verdict.Unavailable && !errors.Is(err, context.DeadlineExceeded)
}

// TestExpiredDeadlineSendsNothing: a Deliver, DeliverAsync or Request whose
// deadline has already passed when it is called sends no leg and returns
// verdict.ErrDeadlineUnsent — never a timeout, which would tell the caller
// the callee may hold a delivery that was sent after its deadline. One whose
// ctx was cancelled before the call sends nothing either (Failed: the
// caller chose).
func TestExpiredDeadlineSendsNothing(t *testing.T) {
	s := natstest.RunServer(t)
	in := acceptIntake(t, s, "acc", func(id string) []byte { return []byte(id) })
	c := newClient(t, natstest.Connect(t, s), genResolver("acc"))
	for rep := range reps(t, 60) {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
		cancelled := rep%6 >= 3 // a ctx cancelled before the call: Failed (the caller chose), nothing sent
		if cancelled {
			cancel()
			ctx, cancel = context.WithCancel(context.Background())
			cancel()
		}
		id := fmt.Sprintf("late-%d", rep)
		d := Delivery{ID: id, To: subjects.Address(fmt.Sprintf("k/%d", rep%3))}
		var err error
		switch rep % 3 {
		case 0:
			_, err = c.Deliver(ctx, d)
		case 1:
			err = (<-c.DeliverAsync(ctx, d)).Err
		case 2:
			_, err = c.Request(ctx, d)
		}
		cancel()
		// A probe on the same connection: if the late delivery had been
		// published, the intake would have counted it before the probe.
		probe := fmt.Sprintf("probe-%d", rep)
		if _, err := c.Deliver(context.Background(), Delivery{ID: probe, To: d.To}); err != nil {
			t.Fatal(err)
		}
		if cancelled {
			if n := in.count(id); n != 0 || !errors.Is(err, context.Canceled) || verdict.IsTransient(err) || verdict.Classify(err) != verdict.Failed {
				t.Fatalf("rep %d (call %d): cancelled ctx: sent %d legs, verdict %v; want nothing sent, Failed (context.Canceled)", rep, rep%3, n, err)
			}
			continue
		}
		if n := in.count(id); n != 0 || !isUnsentVerdict(err) {
			t.Fatalf("rep %d (call %d): sent %d legs, verdict %v (resendable %v, %v); want nothing sent and ErrDeadlineUnsent",
				rep, rep%3, n, err, verdict.IsResendable(err), verdict.Classify(err))
		}
	}
}

// TestDirectoryOutageResendable: a delivery whose owner cannot be resolved
// because the directory does not answer (its NATS server is down) was never
// sent: its verdict is resendable (directory-unavailable, or
// deadline-unsent once the caller's deadline passed), never a timeout.
func TestDirectoryOutageResendable(t *testing.T) {
	longOnly(t)
	s := natstest.RunServer(t)
	rec := newRecorder()
	nc := natstest.Connect(t, s, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}), nats.MaxReconnects(-1))
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Membership: &mc})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register("rec", rec.factory); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	s.Shutdown()
	// The two deadlines (one past a directory read's bound, one past two)
	// run side by side: the test waits out the longer, not their sum.
	var wg sync.WaitGroup
	for rep := range 2 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rep+1)*3*time.Second)
			_, err := n.Deliver(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/fresh-%d", rep))})
			cancel()
			if !verdict.IsResendable(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
				t.Errorf("rep %d: directory unreachable, nothing sent: %v (resendable %v, %v); want resendable, not a timeout",
					rep, err, verdict.IsResendable(err), verdict.Classify(err))
			}
		})
	}
	wg.Wait()
}

// TestCloseRacesNewDeliveries: Close while other goroutines keep starting
// Deliver, DeliverAsync and Request calls. Every call ends with exactly one
// verdict — accepted (handled once) or verdict.ErrClosing — and nothing
// races (run under -race: a call joining as Close waits for the calls in
// progress must not be a WaitGroup misuse).
func TestCloseRacesNewDeliveries(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	nc := natstest.Connect(t, s)
	for rep := range reps(t, 100) {
		c, err := NewClient(Config{Conn: nc, Resolver: StaticResolver{Node: n.ID()}, Identity: subjects.NodeID{Name: "c", Generation: uint64(rep + 1)}})
		if err != nil {
			t.Fatal(err)
		}
		const callers = 4
		started := make(chan struct{}, callers)
		type out struct {
			id  string
			err error
		}
		outs := make(chan out, 1024)
		done := make(chan struct{})
		var wg sync.WaitGroup
		for g := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					id := fmt.Sprintf("c%d-%d-%d", rep, g, i)
					d := Delivery{ID: id, To: subjects.Address(fmt.Sprintf("rec/c%d", g))}
					var err error
					switch i % 3 {
					case 0:
						_, err = c.Deliver(context.Background(), d)
					case 1:
						err = (<-c.DeliverAsync(context.Background(), d)).Err
					case 2:
						_, err = c.Request(context.Background(), d)
					}
					outs <- out{id, err}
					if i == 0 {
						started <- struct{}{}
					}
					if err != nil {
						return
					}
					select {
					case <-done:
						return
					default:
					}
				}
			}()
		}
		for range callers {
			<-started
		}
		c.Close()
		close(done)
		wg.Wait()
		close(outs)
		for o := range outs {
			if o.err != nil && !errors.Is(o.err, verdict.ErrClosing) && !errors.Is(o.err, verdict.ErrOutcomeUnknown) {
				t.Fatalf("rep %d: %s: %v; want accepted or ErrClosing (a Request accepted before Close: outcome unknown)", rep, o.id, o.err)
			}
			if o.err == nil {
				natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions(o.id) == 1 }, "%s accepted, handled once", o.id)
			}
		}
	}
}

// holdProxy stands between a client and a real node, like faultProxy: the
// client resolves every address to proxy generation hp.<gen>, and the proxy
// forwards each leg, in arrival order, to the real node — except the first
// leg of each delivery named in hold, which it keeps (held) until released.
// Legs to an older generation are dropped: it departed.
type holdProxy struct {
	t    *testing.T
	nc   *nats.Conn
	node *Node
	gen  atomic.Uint64

	fwd atomic.Int64 // legs forwarded to the node

	mu   sync.Mutex
	hold map[string]bool // delivery IDs whose first leg is held
	held []*nats.Msg
	seen map[string]int // legs that reached the proxy, by delivery ID
}

func newHoldProxy(t *testing.T, s *server.Server, node *Node) *holdProxy {
	p := &holdProxy{t: t, nc: natstest.Connect(t, s), node: node, hold: map[string]bool{}, seen: map[string]int{}}
	p.gen.Store(1)
	sub, err := p.nc.Subscribe(subjects.DefaultPrefix.Sub("dlv.hp.>"), p.leg)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := p.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *holdProxy) Resolve(context.Context, subjects.Address) (subjects.NodeID, error) {
	return subjects.NodeID{Name: "hp", Generation: p.gen.Load()}, nil
}

func (p *holdProxy) Invalidate(subjects.Address, subjects.NodeID) {}

// Gone reports whether node is a generation of the proxy that departed:
// the proxy is its clients' cluster view, which knows a departure before
// the client is told (failNode), as a node's membership does.
func (p *holdProxy) Gone(node subjects.NodeID) bool {
	return node.Name == "hp" && node.Generation < p.gen.Load()
}

func (p *holdProxy) leg(m *nats.Msg) {
	d, err := subjects.DefaultPrefix.ParseDelivery(m.Subject)
	if err != nil {
		p.t.Errorf("proxy: %v", err)
		return
	}
	id := m.Header.Get(hub.HeaderID)
	p.mu.Lock()
	p.seen[id]++
	if d.Node.Generation != p.gen.Load() {
		p.mu.Unlock()
		return
	}
	if p.hold[id] {
		delete(p.hold, id)
		p.held = append(p.held, m)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.forward(m)
}

func (p *holdProxy) forward(m *nats.Msg) {
	d, _ := subjects.DefaultPrefix.ParseDelivery(m.Subject)
	fwd := &nats.Msg{Subject: subjects.DefaultPrefix.Delivery(p.node.ID(), d.Addr, d.Stream), Reply: m.Reply, Header: m.Header, Data: m.Data}
	if err := p.nc.PublishMsg(fwd); err != nil {
		p.t.Errorf("proxy forward: %v", err)
	}
	p.fwd.Add(1)
}

// settled reports whether the node answered every leg the proxy forwarded
// and handled everything it accepted.
func (p *holdProxy) settled() bool {
	st := p.node.Host().Stats()
	return st.Accepted+st.Refused+st.DedupeHits >= p.fwd.Load() && st.Queued == 0
}

func (p *holdProxy) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

func (p *holdProxy) sawLeg(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[id]
}

// releaseHeld forwards the held legs (late: a leg delayed in transit) and
// forgets them.
func (p *holdProxy) releaseHeld() {
	p.mu.Lock()
	held := p.held
	p.held = nil
	p.mu.Unlock()
	for _, m := range held {
		p.forward(m)
	}
}

// TestWindowPositionEvents: a window of W deliveries pipelined on one lane
// through a real node; the leg of the delivery at one position (first,
// middle, last) is held in transit, so the deliveries ahead of it are
// accepted and those behind it are refused out of order and wait; then one
// lifecycle event happens. Every delivery gets exactly one verdict, and it
// matches the facts:
//
//	owner departs     the held one is re-resolved and re-sent: all accepted, in order
//	own link drops    the held one is re-sent after the reconnect: all accepted, in order
//	client closes     the held one and those behind it: ErrClosing, none handled
//	its ctx cancelled the held one Failed (context.Canceled), never re-sent; the rest accepted, in order
//	its deadline      the held one a timeout (Failed, not resendable), never re-sent; the rest accepted, in order
//
// Afterwards the held leg is released (delivered late, old epoch): it is
// deduped or refused, never handled a second time or out of order.
func TestWindowPositionEvents(t *testing.T) {
	const window = 5
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	p := newHoldProxy(t, s, n)
	nc := natstest.Connect(t, s, nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1))
	events := []string{"depart", "linkdrop", "close", "cancel", "deadline"}
	run := 0
	for rep := range reps(t, 10) {
		for _, ev := range events {
			for _, pos := range []int{0, window / 2, window - 1} {
				run++
				name := fmt.Sprintf("rep %d %s at %d", rep, ev, pos)
				addr := subjects.Address(fmt.Sprintf("rec/wpe-%d", run))
				c, err := NewClient(Config{Conn: nc, Resolver: p, Identity: subjects.NodeID{Name: "wpe", Generation: uint64(run)}},
					WithWindow(window), WithRetry(RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxRetries: 50}), WithView(p))
				if err != nil {
					t.Fatal(err)
				}
				ids := make([]string, window)
				chans := make([]<-chan Result, window)
				heldCtx, cancelHeld := context.WithCancel(context.Background())
				if ev == "deadline" {
					cancelHeld()
					heldCtx, cancelHeld = context.WithTimeout(context.Background(), 300*time.Millisecond)
				}
				for i := range window {
					ids[i] = fmt.Sprintf("wpe-%d-%d", run, i)
					if i == pos {
						p.mu.Lock()
						p.hold[ids[i]] = true
						p.mu.Unlock()
					}
				}
				refusedBefore := n.Host().Stats().Refused
				for i := range window {
					ctx := context.Background()
					if i == pos {
						ctx = heldCtx
					}
					chans[i] = c.DeliverAsync(ctx, Delivery{ID: ids[i], To: addr, Payload: []byte{byte(i)}})
				}
				// Those ahead of the held one are accepted regardless.
				for i := range pos {
					if r := <-chans[i]; r.Err != nil {
						t.Fatalf("%s: delivery %d ahead of the held one: %v", name, i, r.Err)
					}
				}
				if ev != "deadline" {
					natstest.Eventually(t, 10*time.Second, func() bool { return p.heldCount() == 1 }, "%s: leg held", name)
					// The lane is quiescent: only the held leg is in flight.
					// Those behind it were refused out of order (the first
					// refusal broke the epoch: no more leave), or were never
					// sent — a leg that left alone in its lane (no
					// Mesh-Lane) keeps the others behind it until it settles.
					p.mu.Lock()
					solo := p.held[0].Header.Get(hub.HeaderLane) == ""
					p.mu.Unlock()
					natstest.Eventually(t, 10*time.Second, func() bool {
						refused := n.Host().Stats().Refused - refusedBefore
						return (solo || pos == window-1 || refused >= 1) && c.Saturation().LegsInFlight == 1 &&
							c.countFlights(func(*flight) bool { return true }) == 1
					}, "%s: only the held leg in flight (host %+v, sat %+v)", name, n.Host().Stats(), c.Saturation())
				}
				switch ev {
				case "depart":
					old := subjects.NodeID{Name: "hp", Generation: p.gen.Add(1) - 1}
					c.failNode(old, "test departure")
				case "linkdrop":
					if err := nc.ForceReconnect(); err != nil {
						t.Fatal(err)
					}
				case "close":
					go c.Close()
				case "cancel":
					cancelHeld()
				}
				res := make([]Result, window)
				for i := pos; i < window; i++ {
					res[i] = <-chans[i]
					select {
					case extra := <-chans[i]:
						t.Fatalf("%s: delivery %d: a second verdict %+v", name, i, extra)
					default:
					}
				}
				for i := pos; i < window; i++ {
					err := res[i].Err
					switch {
					case ev == "close":
						if !errors.Is(err, verdict.ErrClosing) || !verdict.IsResendable(err) {
							t.Fatalf("%s: delivery %d: %v; want ErrClosing", name, i, err)
						}
					case i == pos && ev == "cancel":
						if !errors.Is(err, context.Canceled) || verdict.IsTransient(err) || verdict.Classify(err) != verdict.Failed {
							t.Fatalf("%s: the held delivery: %v; want Failed (context.Canceled)", name, err)
						}
					case i == pos && ev == "deadline":
						// Checked against the facts after the probe below.
					case err != nil:
						t.Fatalf("%s: delivery %d: %v; want accepted", name, i, err)
					}
				}
				if ev != "close" {
					c.Close()
				}
				cancelHeld()
				// Everything accepted is handled once, in order.
				natstest.Eventually(t, 10*time.Second, func() bool {
					for i := range window {
						if (i < pos || res[i].Err == nil) && rec.executions(ids[i]) != 1 {
							return false
						}
					}
					return true
				}, "%s: accepted deliveries handled", name)
				if ev == "depart" || ev == "linkdrop" {
					// The held leg arrives late, after its re-send: deduped
					// or refused. (A held leg whose delivery failed stays
					// lost in transit: arriving late, it could be accepted —
					// a cancelled or timed-out leg may run, and a seq-1 leg
					// of an old epoch starts a lane anew; see the report.)
					p.releaseHeld()
				}
				probe := fmt.Sprintf("wpe-%d-probe", run)
				pc := newClient(t, nc, p, WithView(p))
				if _, err := pc.Deliver(context.Background(), Delivery{ID: probe, To: addr}); err != nil {
					t.Fatalf("%s: probe: %v", name, err)
				}
				natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions(probe) == 1 }, "%s: probe handled", name)
				pc.Close()
				if ev == "deadline" {
					// The probe left on the same connection after the held
					// delivery's leg, if it had one: the proxy has seen it.
					err := res[pos].Err
					if p.sawLeg(ids[pos]) > 0 {
						if !errors.Is(err, context.DeadlineExceeded) || verdict.IsResendable(err) || verdict.Classify(err) != verdict.Failed {
							t.Fatalf("%s: the held delivery, its leg in flight at its deadline: %v; want a timeout", name, err)
						}
					} else if !isUnsentVerdict(err) {
						t.Fatalf("%s: the delivery, never sent by its deadline: %v; want ErrDeadlineUnsent", name, err)
					}
				}
				p.mu.Lock()
				p.held = nil
				p.mu.Unlock()
				rec.mu.Lock()
				last := -1
				for _, d := range rec.handled[addr] {
					if d.ID == probe {
						continue
					}
					i := int(d.Payload[0])
					if i <= last {
						t.Errorf("%s: delivery %d handled after %d (inversion or duplicate)", name, i, last)
					}
					last = i
					if res[i].Err != nil && i >= pos {
						t.Errorf("%s: delivery %d failed with %v, yet handled", name, i, res[i].Err)
					}
				}
				rec.mu.Unlock()
			}
		}
	}
}

// TestSlotWaitersRaceEvents: with WithMaxInFlight(k), k = 1..3, k legs hold
// every slot at an intake that does not answer; three deliveries to owner
// X (a proxy in front of a real node) wait for a slot; then X departs
// (before or racing the slots' release), the waiters' deadline passes
// (alone or racing X's departure), or their ctx is cancelled racing the
// release. Each waiter gets one verdict that matches the facts, read on
// the real node: accepted ⇒ handled once; deadline-unsent or any other
// resendable verdict ⇒ never handled; cancelled ⇒ handled at most once;
// nothing else, and nothing handled twice.
func TestSlotWaitersRaceEvents(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	p := newHoldProxy(t, s, n)
	hang := subjects.NodeID{Name: "hang", Generation: 1}
	held := holdIntake(t, s, hang)
	res := ResolverFunc(func(ctx context.Context, addr subjects.Address) (subjects.NodeID, error) {
		if addr.Kind() == "hold" {
			return hang, nil
		}
		return p.Resolve(ctx, addr)
	})
	scenarios := []string{"depart", "depart-racing-release", "deadline", "deadline-racing-depart", "cancel-racing-release"}
	count := map[string]int{}
	for k := 1; k <= 3; k++ {
		c := newClient(t, natstest.Connect(t, s), res, WithMaxInFlight(k), WithView(p),
			WithRetry(RetryPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxRetries: 50}))
		for rep := range reps(t, 70) {
			sc := scenarios[rep%len(scenarios)]
			name := fmt.Sprintf("k=%d rep %d %s", k, rep, sc)
			var holders []<-chan Result
			for j := range k {
				holders = append(holders, c.DeliverAsync(context.Background(), Delivery{To: subjects.Address(fmt.Sprintf("hold/%d-%d-%d", k, rep, j))}))
			}
			natstest.Eventually(t, 10*time.Second, func() bool { return held.count() == k }, "%s: slots held", name)
			x := subjects.NodeID{Name: "hp", Generation: p.gen.Load()}
			depart := func() {
				p.gen.Add(1) // legs to x now go nowhere
				c.failNode(x, "test departure")
			}
			timeout := 30 * time.Second
			if sc == "deadline" || sc == "deadline-racing-depart" {
				timeout = 10 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			var ids []string
			var waiters []<-chan Result
			for j := range 3 {
				id := fmt.Sprintf("w-%d-%d-%d", k, rep, j)
				ids = append(ids, id)
				waiters = append(waiters, c.DeliverAsync(ctx, Delivery{ID: id, To: subjects.Address(fmt.Sprintf("rec/w-%d-%d-%d", k, rep, j))}))
			}
			if timeout > time.Second {
				natstest.Eventually(t, 10*time.Second, func() bool { return c.waiting() == 3 }, "%s: waiting for a slot", name)
			}
			racer := make(chan struct{}) // closed when the racing goroutine is done
			switch sc {
			case "depart":
				depart()
				held.release(hang)
				close(racer)
			case "depart-racing-release":
				go func() { held.release(hang); close(racer) }()
				depart()
			case "deadline-racing-depart":
				go func() {
					<-ctx.Done()
					depart()
					close(racer)
				}()
			case "cancel-racing-release":
				go func() { held.release(hang); close(racer) }()
				cancel()
			default:
				close(racer)
			}
			var outs []Result
			for _, ch := range waiters {
				r := <-ch
				select {
				case extra := <-ch:
					t.Fatalf("%s: a second verdict %+v", name, extra)
				default:
				}
				outs = append(outs, r)
			}
			cancel()
			<-racer // a late release must not answer the next repetition's holders
			held.release(hang)
			for _, ch := range holders {
				if r := <-ch; r.Err != nil {
					t.Fatalf("%s: slot holder: %v", name, r.Err)
				}
			}
			natstest.Eventually(t, 10*time.Second, p.settled, "%s: node settled", name)
			for j, r := range outs {
				err, id := r.Err, ids[j]
				count[sc+" "+verdictName(err)]++
				switch {
				case err == nil:
					natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions(id) == 1 }, "%s: %s accepted, handled once", name, id)
				case verdict.IsResendable(err):
					if sc == "depart" || sc == "depart-racing-release" {
						t.Fatalf("%s: %s: %v; want re-resolved and accepted", name, id, err)
					}
					if (sc == "deadline" || sc == "deadline-racing-depart") && !isUnsentVerdict(err) {
						t.Fatalf("%s: %s: %v; want deadline-unsent", name, id, err)
					}
					if e := rec.executions(id); e != 0 {
						t.Fatalf("%s: %s reported resendable (%v), yet handled %d times", name, id, err, e)
					}
				case sc == "cancel-racing-release" && errors.Is(err, context.Canceled) && verdict.Classify(err) == verdict.Failed:
					if e := rec.executions(id); e > 1 {
						t.Fatalf("%s: %s handled %d times", name, id, e)
					}
				default:
					t.Fatalf("%s: %s: %v (resendable %v, %v)", name, id, err, verdict.IsResendable(err), verdict.Classify(err))
				}
			}
		}
	}
	t.Logf("verdicts: %v", count)
}

func verdictName(err error) string {
	if err == nil {
		return "Accepted"
	}
	return verdict.Classify(err).String() + "/" + verdict.ReasonOf(err).String()
}

// TestIdempotentRequestResentAfterLinkDrop: an Idempotent Request accepted
// and awaiting its response when the sender's own link drops gets the
// resendable disconnect; re-sent by the caller under the same ID after the
// reconnect — while its handler still runs, or after it finished and its
// response was lost — it gets the handler's one response, and the handler
// runs once. A non-idempotent one gets outcome unknown; the response that
// comes after it is counted, never handed to another call.
func TestIdempotentRequestResentAfterLinkDrop(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	gates := sync.Map{} // delivery ID → chan struct{}
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if g, ok := gates.Load(d.ID); ok {
			<-g.(chan struct{})
		}
		return d.Respond([]byte("re:" + d.ID))
	}
	nc := natstest.Connect(t, s, nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1))
	c := newClient(t, nc, StaticResolver{Node: n.ID()})
	for rep := range reps(t, 30) {
		idem := rep%3 != 2
		releaseFirst := rep%3 == 1 // the handler finishes before the re-send
		id := fmt.Sprintf("idem-%d", rep)
		gate := make(chan struct{})
		gates.Store(id, gate)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		ch := make(chan error, 1)
		go func() {
			_, err := c.Request(ctx, Delivery{ID: id, To: "rec/idem", Idempotent: idem})
			ch <- err
		}()
		natstest.Eventually(t, 10*time.Second, func() bool { return c.awaiting() == 1 && rec.executions(id) == 1 }, "rep %d: accepted, handler running", rep)
		if err := nc.ForceReconnect(); err != nil {
			t.Fatal(err)
		}
		err := <-ch
		if !idem {
			if !errors.Is(err, verdict.ErrOutcomeUnknown) || verdict.IsResendable(err) {
				t.Fatalf("rep %d: %v; want outcome unknown", rep, err)
			}
			unmatched := c.Stats().Unmatched
			natstest.Eventually(t, 10*time.Second, nc.IsConnected, "reconnected")
			if err := nc.Flush(); err != nil { // the answer subscription is back on the server
				t.Fatal(err)
			}
			close(gate)
			natstest.Eventually(t, 10*time.Second, func() bool { return c.Stats().Unmatched >= unmatched+1 }, "rep %d: the late response counted (client %+v host %+v)", rep, c.Stats(), n.Host().Stats())
			cancel()
			continue
		}
		if !verdict.IsResendable(err) || verdict.Classify(err) != verdict.ShuttingDown {
			t.Fatalf("rep %d (idempotent): %v; want the resendable disconnect", rep, err)
		}
		natstest.Eventually(t, 10*time.Second, nc.IsConnected, "reconnected")
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if releaseFirst {
			close(gate)
			natstest.Eventually(t, 10*time.Second, func() bool { return n.Host().Stats().Queued == 0 }, "rep %d: handled", rep)
		} else {
			go func() {
				for dl := time.Now().Add(10 * time.Second); c.awaiting() != 1 && time.Now().Before(dl); {
					time.Sleep(time.Millisecond) // the re-send accepted (else the request below fails)
				}
				close(gate)
			}()
		}
		resp, err := c.Request(ctx, Delivery{ID: id, To: "rec/idem", Idempotent: true})
		cancel()
		if err != nil || string(resp.Payload) != "re:"+id {
			t.Fatalf("rep %d: the re-send: %q %v; want the handler's one response", rep, resp.Payload, err)
		}
		if e := rec.executions(id); e != 1 {
			t.Fatalf("rep %d: handler ran %d times", rep, e)
		}
	}
}

// TestIDEdgesEverywhere: delivery IDs at the edges of 1-128 bytes of
// printable ASCII without spaces, through the Go sender, a raw client on a
// node's delivery subject (the intake) and a raw client on the ingress:
// the valid ones are accepted and handled once each (128 bytes, '!' and
// '~', every printable byte), the invalid ones are refused invalid-id
// (Failed, not transient) and handled nowhere (129 bytes, a tab, DEL, a
// space inside, a byte over 0x7E, NUL; only whitespace, which NATS trims to
// an empty value: the ingress refuses it rather than generating an ID that
// the client's re-send under the same ID would not get).
func TestIDEdgesEverywhere(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	raw := natstest.Connect(t, s)
	var printable []byte
	for b := byte(0x21); b <= 0x7e; b++ {
		printable = append(printable, b)
	}
	valid := []string{strings.Repeat("~", 128), "!", "~", string(printable), strings.Repeat("a", 127) + "\x7e"}
	invalid := []string{strings.Repeat("a", 129), "a\tb", "\t", " ", "a\x7f", "\x7f", "a b", "a\x80", "\xff", "ü", "a\x00b", "a\x1f"}
	send := func(via string, id string, k int) error {
		addr := subjects.Address(fmt.Sprintf("rec/%s-%d", via, k))
		switch via {
		case "sender":
			_, err := n.Deliver(context.Background(), Delivery{ID: id, To: addr})
			return err
		case "intake", "ingress":
			subj := subjects.DefaultPrefix.Ingress(addr, "")
			if via == "intake" {
				subj = subjects.DefaultPrefix.Delivery(n.ID(), addr, "")
			}
			m := nats.NewMsg(subj)
			m.Header[hub.HeaderID] = []string{id} // as written: Set would canonicalise nothing, but be exact
			r, err := raw.RequestMsg(m, 20*time.Second)
			if err != nil {
				t.Fatalf("%s %q: %v", via, id, err)
			}
			_, verr := verdict.Decode(r.Header)
			if verr == nil && via == "ingress" && r.Header.Get(hub.HeaderID) != id {
				t.Errorf("ingress %q: reply names ID %q", id, r.Header.Get(hub.HeaderID))
			}
			return verr
		}
		panic(via)
	}
	for _, via := range []string{"sender", "intake", "ingress"} {
		for k, id := range valid {
			if err := send(via, id, k); err != nil {
				t.Errorf("%s: valid ID %q (%d bytes): %v", via, id, len(id), err)
			}
		}
		for k, id := range invalid {
			err := send(via, id, 100+k)
			if !errors.Is(err, verdict.ErrInvalidID) || verdict.IsTransient(err) || verdict.Classify(err) != verdict.Failed {
				t.Errorf("%s: invalid ID %q: %v; want invalid-id", via, id, err)
			}
		}
		// Each valid ID went to every path once. The dedupe key is
		// (caller, ID): the sender's and the intake's copies are in the
		// node's own scope (no Mesh-Caller), so the second is a
		// duplicate; the ingress's is in its outside caller's scope, a
		// delivery of its own.
	}
	for _, id := range valid {
		natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions(id) == 2 }, "ID %q handled twice (once per caller scope)", id)
	}
	for _, id := range invalid {
		if e := rec.executions(id); e != 0 {
			t.Errorf("invalid ID %q handled %d times", id, e)
		}
	}
}

// TestLaneChaos: DeliverAsync pipelines on several lanes through a real
// node (behind holdProxy, so one node sees every leg and dedupes every
// re-send), with the window and the in-flight cap both binding, while a
// chaos goroutine makes the owner generation depart (the proxy moves to a
// new generation) and drops the client's own link, and some deliveries
// are cancelled or have short deadlines. Every delivery gets one verdict;
// accepted ⇒ handled once; resendable ⇒ never handled; cancelled or timed
// out ⇒ handled at most once; nothing else; and no stream handles its
// deliveries out of order.
func TestLaneChaos(t *testing.T) {
	const streams = 4
	per := 300
	if !natstest.Long() {
		per = 60
	}
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	p := newHoldProxy(t, s, n)
	nc := natstest.Connect(t, s, nats.ReconnectWait(5*time.Millisecond), nats.MaxReconnects(-1))
	c := newClient(t, nc, p, WithWindow(8), WithMaxInFlight(6), WithView(p),
		WithRetry(RetryPolicy{Initial: time.Millisecond, Max: 4 * time.Millisecond, MaxRetries: 200}))
	const addr = subjects.Address("rec/chaos")
	stop := make(chan struct{})
	chaosDone := make(chan int)
	go func() {
		events := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				chaosDone <- events
				return
			case <-time.After(7 * time.Millisecond):
			}
			if i%3 == 2 {
				_ = nc.ForceReconnect()
			} else {
				old := subjects.NodeID{Name: "hp", Generation: p.gen.Add(1) - 1}
				c.failNode(old, "chaos")
			}
			events++
		}
	}()
	type out struct {
		id   string
		kind string // "", "cancel", "deadline"
		ch   <-chan Result
		err  error
	}
	outs := make([][]*out, streams)
	var cancels []context.CancelFunc
	for i := range per {
		for st := range streams {
			id := fmt.Sprintf("ch%d-%d", st, i)
			o := &out{id: id}
			ctx := context.Background()
			switch (i*streams + st) % 17 {
			case 5:
				o.kind = "cancel"
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				cancels = append(cancels, cancel)
				go func() {
					time.Sleep(time.Duration(i%5) * time.Millisecond)
					cancel()
				}()
			case 11:
				o.kind = "deadline"
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(1+i%20)*time.Millisecond)
				cancels = append(cancels, cancel)
			}
			pl := []byte{byte(st), byte(i >> 8), byte(i)}
			o.ch = c.DeliverAsync(ctx, Delivery{ID: id, To: addr, Stream: subjects.Stream(fmt.Sprint(st)), Payload: pl})
			outs[st] = append(outs[st], o)
		}
	}
	tally := map[string]int{}
	for st := range streams {
		for _, o := range outs[st] {
			r := <-o.ch
			o.err = r.Err
			select {
			case extra := <-o.ch:
				t.Fatalf("%s: a second verdict %+v", o.id, extra)
			default:
			}
			tally[o.kind+":"+verdictName(o.err)]++
		}
	}
	close(stop)
	events := <-chaosDone
	for _, cancel := range cancels {
		cancel()
	}
	natstest.Eventually(t, 10*time.Second, nc.IsConnected, "reconnected")
	// A probe on the client's connection after everything: the proxy has
	// seen every leg before it, and forwards in order.
	probe := "chaos-probe"
	if _, err := c.Deliver(context.Background(), Delivery{ID: probe, To: "rec/probe"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, p.settled, "node settled")
	var resend []*out
	for st := range streams {
		for _, o := range outs[st] {
			err, e := o.err, rec.executions(o.id)
			switch {
			case err == nil:
				if e != 1 {
					natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions(o.id) == 1 }, "%s accepted, handled once (%d)", o.id, e)
				}
			case verdict.IsResendable(err):
				// Handled at most once: a leg in flight when the link
				// dropped or the owner departed may have been accepted
				// before its deadline passed in back-off. Re-sent below.
				if e > 1 {
					t.Errorf("%s (%s): %v, resendable, handled %d times", o.id, o.kind, err, e)
				}
				if o.kind == "" {
					t.Errorf("%s: %v; want accepted (200 retries)", o.id, err)
				}
				resend = append(resend, o)
			case o.kind == "cancel" && errors.Is(err, context.Canceled),
				o.kind == "deadline" && errors.Is(err, context.DeadlineExceeded):
				if e > 1 {
					t.Errorf("%s (%s): handled %d times", o.id, o.kind, e)
				}
			default:
				t.Errorf("%s (%s): %v (resendable %v, %v)", o.id, o.kind, err, verdict.IsResendable(err), verdict.Classify(err))
			}
		}
	}
	rec.mu.Lock()
	next := make([]int, streams)
	for _, d := range rec.handled[addr] {
		st, i := int(d.Payload[0]), int(d.Payload[1])<<8|int(d.Payload[2])
		if i < next[st] {
			t.Errorf("stream %d: delivery %d handled after %d (inversion or duplicate)", st, i, next[st]-1)
		}
		next[st] = i + 1
	}
	rec.mu.Unlock()
	// "Resendable" means the same delivery may be sent again: re-sent under
	// its ID, each is accepted and handled exactly once in all.
	for _, o := range resend {
		if _, err := c.Deliver(context.Background(), Delivery{ID: o.id, To: addr, Stream: "resend"}); err != nil {
			t.Fatalf("%s: the re-send: %v", o.id, err)
		}
	}
	for _, o := range resend {
		natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions(o.id) == 1 }, "%s re-sent: handled once (%d)", o.id, rec.executions(o.id))
	}
	natstest.Eventually(t, 10*time.Second, p.settled, "node settled")
	for _, o := range resend {
		if e := rec.executions(o.id); e != 1 {
			t.Errorf("%s re-sent: handled %d times", o.id, e)
		}
	}
	t.Logf("%d deliveries, %d chaos events, retries %d, %d re-sent by the caller: %v", streams*per, events, c.Stats().Retries, len(resend), tally)
}

// TestRequestLinkChaos: several callers each send a sequence of Requests on
// their own stream to a real node, half of them Idempotent, while the
// client's own link drops every few milliseconds. Each Request ends with
// one verdict that matches the facts: its own response (handled once);
// outcome unknown for a non-idempotent one accepted before a drop (Failed,
// not resendable; handled once, never re-sent); a resendable verdict only
// for what a re-send under the same ID settles — re-sent by the caller, it
// gets the handler's one response. No stream is handled out of order.
func TestRequestLinkChaos(t *testing.T) {
	const callers = 4
	per := 120
	if !natstest.Long() {
		per = 30
	}
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.Payload[2]%5 == 0 {
			time.Sleep(2 * time.Millisecond) // some responses are awaited when the link drops
		}
		return d.Respond([]byte("re:" + d.ID))
	}
	nc := natstest.Connect(t, s, nats.ReconnectWait(5*time.Millisecond), nats.MaxReconnects(-1))
	c := newClient(t, nc, StaticResolver{Node: n.ID()},
		WithRetry(RetryPolicy{Initial: time.Millisecond, Max: 4 * time.Millisecond, MaxRetries: 200}))
	const addr = subjects.Address("rec/reqchaos")
	stop := make(chan struct{})
	chaosDone := make(chan int)
	go func() {
		drops := 0
		for {
			select {
			case <-stop:
				chaosDone <- drops
				return
			case <-time.After(9 * time.Millisecond):
			}
			_ = nc.ForceReconnect()
			drops++
		}
	}()
	type out struct {
		id   string
		idem bool
		resp Response
		err  error
	}
	outs := make([][]out, callers)
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				o := out{id: fmt.Sprintf("rq%d-%d", g, i), idem: (g+i)%2 == 0}
				o.resp, o.err = c.Request(context.Background(), Delivery{ID: o.id, To: addr, Stream: subjects.Stream(fmt.Sprint(g)),
					Idempotent: o.idem, Payload: []byte{byte(g), byte(i >> 8), byte(i)}})
				outs[g] = append(outs[g], o)
			}
		}()
	}
	wg.Wait()
	close(stop)
	drops := <-chaosDone
	natstest.Eventually(t, 10*time.Second, nc.IsConnected, "reconnected")
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return n.Host().Stats().Queued == 0 }, "node settled")
	tally := map[string]int{}
	var resend []out
	for g := range callers {
		for _, o := range outs[g] {
			tally[fmt.Sprintf("idem=%v %s", o.idem, verdictName(o.err))]++
			switch err := o.err; {
			case err == nil:
				if string(o.resp.Payload) != "re:"+o.id {
					t.Errorf("%s: response %q", o.id, o.resp.Payload)
				}
			case errors.Is(err, verdict.ErrOutcomeUnknown):
				if o.idem || verdict.IsResendable(err) || !verdict.IsTransient(err) || verdict.Classify(err) != verdict.Failed {
					t.Errorf("%s (idempotent %v): %v", o.id, o.idem, err)
				}
			case verdict.IsResendable(err):
				if !o.idem && !errors.Is(err, verdict.ErrDeadlineUnsent) {
					t.Errorf("%s: not idempotent, yet %v", o.id, err)
				}
				resend = append(resend, o)
			default:
				t.Errorf("%s (idempotent %v): %v (resendable %v, %v)", o.id, o.idem, err, verdict.IsResendable(err), verdict.Classify(err))
			}
		}
	}
	for g := range callers {
		for _, o := range outs[g] {
			if o.err == nil || errors.Is(o.err, verdict.ErrOutcomeUnknown) {
				if e := rec.executions(o.id); e != 1 {
					t.Errorf("%s (%v): handled %d times", o.id, o.err, e)
				}
			} else if e := rec.executions(o.id); e > 1 {
				t.Errorf("%s (%v): handled %d times", o.id, o.err, e)
			}
		}
	}
	rec.mu.Lock()
	next := make([]int, callers)
	for _, d := range rec.handled[addr] {
		g, i := int(d.Payload[0]), int(d.Payload[1])<<8|int(d.Payload[2])
		if i < next[g] {
			t.Errorf("stream %d: request %d handled after %d", g, i, next[g]-1)
		}
		next[g] = i + 1
	}
	rec.mu.Unlock()
	for _, o := range resend {
		resp, err := c.Request(context.Background(), Delivery{ID: o.id, To: addr, Stream: "resend", Idempotent: o.idem, Payload: []byte{0, 0, 1}})
		if err != nil || string(resp.Payload) != "re:"+o.id {
			t.Errorf("%s: re-sent after %v: %q %v; want the handler's one response", o.id, o.err, resp.Payload, err)
		}
		if e := rec.executions(o.id); e != 1 {
			t.Errorf("%s re-sent: handled %d times", o.id, e)
		}
	}
	t.Logf("%d requests, %d link drops, %d re-sent by the caller: %v", callers*per, drops, len(resend), tally)
}

// TestPipelineOwnerCrash: a DeliverAsync pipeline on one lane to an
// address owned by b, in a real two-node mesh; b's connection dies
// mid-pipeline (a crash). Every delivery gets one verdict: accepted (by b
// before the crash, or by a after the takeover) or none other; what a
// accepted it handles once, in lane order; what b accepted is never
// handled by a. (A delivery b ran while its link was going, whose Accepted
// reply was lost, is re-sent to a: the documented window of a crash,
// DESIGN §6; counted, not failed.)
func TestPipelineOwnerCrash(t *testing.T) {
	longOnly(t)
	for rep := range reps(t, 3) {
		s := natstest.RunServer(t)
		recA, recB := newRecorder(), newRecorder()
		a, _ := clusterNode(t, s, "a", recA)
		b, bConn := clusterNode(t, s, "b", recB)
		waitMembers(t, 2, a, b)
		var target subjects.Address
		for i := 0; ; i++ {
			target = subjects.Address(fmt.Sprintf("rec/crash%d-%d", rep, i))
			if n, _ := directory.Place(target, []subjects.NodeID{a.ID(), b.ID()}); n == b.ID() {
				break
			}
		}
		const total = 400
		var chans []<-chan Result
		for i := range total {
			chans = append(chans, a.DeliverAsync(context.Background(), Delivery{ID: fmt.Sprintf("pc%d-%d", rep, i), To: target, Payload: []byte{byte(i >> 8), byte(i)}}))
			if i == total/4 {
				natstest.Eventually(t, 10*time.Second, func() bool { return recB.total() > 0 }, "b handling")
				bConn.Close()
			}
		}
		byNode := map[string]int{}
		for i, ch := range chans {
			r := <-ch
			if r.Err != nil {
				t.Fatalf("rep %d: delivery %d: %v (resendable %v); want re-resolved and accepted", rep, i, r.Err, verdict.IsResendable(r.Err))
			}
			byNode[r.Node.Name]++
			id := r.ID
			switch r.Node {
			case a.ID():
				natstest.Eventually(t, 10*time.Second, func() bool { return recA.executions(id) == 1 }, "rep %d: %s accepted by a, handled once", rep, id)
			case b.ID():
				// Accepted by b: never re-sent, so never handled by a; b
				// ran it once, or it was lost with b's queue.
				if recA.executions(id) != 0 || recB.executions(id) > 1 {
					t.Errorf("rep %d: %s accepted by b, handled %d times by a, %d by b", rep, id, recA.executions(id), recB.executions(id))
				}
			default:
				t.Errorf("rep %d: %s accepted by %s", rep, id, r.Node)
			}
		}
		twice := 0
		for i := range total {
			id := fmt.Sprintf("pc%d-%d", rep, i)
			if recA.executions(id)+recB.executions(id) > 1 {
				twice++
			}
		}
		recA.mu.Lock()
		last := -1
		for _, d := range recA.handled[target] {
			i := int(d.Payload[0])<<8 | int(d.Payload[1])
			if i <= last {
				t.Errorf("rep %d: a handled %d after %d", rep, i, last)
			}
			last = i
		}
		recA.mu.Unlock()
		t.Logf("rep %d: accepted by %v; handled by b %d, by a %d; %d handled on both (the crash window)", rep, byNode, recB.total(), recA.total(), twice)
		b.Close()
	}
}

// TestIngressOwnerCrash: a raw nats.go client sends Requests through the
// ingress (served by a) to an address owned by b; b accepts them all, its
// handler holding each; then b's connection dies. Each raw client gets one
// reply that states the facts: Failed/outcome-unknown (the handler may have
// run), or ShuttingDown/departed for one marked Mesh-Idempotent — at once,
// not at its timeout. A plain delivery sent afterwards is accepted by a.
func TestIngressOwnerCrash(t *testing.T) {
	s := natstest.RunServer(t)
	recA, recB := newRecorder(), newRecorder()
	a, _ := clusterNode(t, s, "a", recA)
	bConn := natstest.Connect(t, s)
	mc := fastMembership
	b, err := NewNode(NodeConfig{Conn: bConn, Name: "b", Membership: &mc, DisableIngress: true})
	if err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	defer close(block)
	recB.fn = func(ctx context.Context, d *hub.Delivery) error {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil
	}
	if err := b.Register("rec", recB.factory); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	waitMembers(t, 2, a, b)
	var target subjects.Address
	for i := 0; ; i++ {
		target = subjects.Address(fmt.Sprintf("rec/ing%d", i))
		if n, _ := directory.Place(target, []subjects.NodeID{a.ID(), b.ID()}); n == b.ID() {
			break
		}
	}
	raw := natstest.Connect(t, s)
	const reqs = 12
	type reply struct {
		i   int
		msg *nats.Msg
		err error
	}
	replies := make(chan reply, reqs)
	for i := range reqs {
		go func() {
			m := nats.NewMsg(subjects.DefaultPrefix.Ingress(target, subjects.Stream(fmt.Sprint(i))))
			m.Header.Set(hub.HeaderID, fmt.Sprintf("ing-%d", i))
			m.Header.Set(hub.HeaderExpectResponse, "true")
			if i%2 == 1 {
				m.Header.Set(hub.HeaderIdempotent, "true")
			}
			r, err := raw.RequestMsg(m, 30*time.Second)
			replies <- reply{i, r, err}
		}()
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return b.Host().Stats().Accepted == reqs }, "all accepted by b")
	bConn.Close()
	for range reqs {
		r := <-replies
		if r.err != nil {
			t.Fatalf("request %d: %v; want a reply stating the facts", r.i, r.err)
		}
		v, reason := r.msg.Header.Get(verdict.HeaderVerdict), r.msg.Header.Get(verdict.HeaderReason)
		want, wantReason := "Failed", "outcome-unknown"
		if r.i%2 == 1 {
			want, wantReason = "ShuttingDown", "departed"
		}
		if v != want || reason != wantReason {
			t.Errorf("request %d (idempotent %v): %s/%s %q; want %s/%s", r.i, r.i%2 == 1, v, reason, r.msg.Header.Get(verdict.HeaderMessage), want, wantReason)
		}
	}
	m := nats.NewMsg(subjects.DefaultPrefix.Ingress(target, ""))
	m.Header.Set(hub.HeaderID, "ing-after")
	r, err := raw.RequestMsg(m, 30*time.Second)
	if err != nil || r.Header.Get(verdict.HeaderVerdict) != "Accepted" || r.Header.Get(verdict.HeaderNode) != a.ID().String() {
		t.Fatalf("after the crash: %v %v", r, err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return recA.executions("ing-after") == 1 }, "handled by a")
}
