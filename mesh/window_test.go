package mesh

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// fault is what the proxy does to the first leg of one delivery.
type fault uint8

const (
	faultNone        fault = iota
	faultRefuse            // refuse it resendable (shutting-down): retried, keeps its place
	faultRefuseFinal       // refuse it for good (inbox-full): it fails alone
	faultDrop              // swallow it: its leg times out, it fails alone, never re-sent
	faultLoseReply         // forward it, lose the reply: handled, its leg times out
	faultDepart            // its owner generation departs before accepting it
	faultEvict             // the address is deactivated first (its inbox empty): the intake's lane state is gone
	numFaults
)

var faultNames = [numFaults]string{"none", "refuse", "refuse-final", "drop", "lose-reply", "depart", "evict"}

// faultProxy stands between a client and a real node: the client resolves
// every address to a proxy generation px.<gen>; the proxy forwards each leg,
// in arrival order, to the real node (whose intake checks the lanes), unless
// the leg's delivery has a fault to apply to its first leg.
type faultProxy struct {
	t      *testing.T
	nc     *nats.Conn
	node   *Node
	gen    atomic.Uint64
	client atomic.Pointer[Client]
	fwd    int64 // legs forwarded (only the proxy's goroutine touches it)

	mu     sync.Mutex
	faults map[string]fault // by delivery ID, removed when applied
	log    map[string][]string
}

func (p *faultProxy) note(id, what string) {
	p.mu.Lock()
	if p.log == nil {
		p.log = map[string][]string{}
	}
	p.log[id] = append(p.log[id], what)
	p.mu.Unlock()
}

func newFaultProxy(t *testing.T, nc *nats.Conn, node *Node) *faultProxy {
	p := &faultProxy{t: t, nc: nc, node: node, faults: map[string]fault{}}
	p.gen.Store(1)
	sub, err := nc.Subscribe(subjects.DefaultPrefix.Sub("dlv.px.>"), p.leg)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return p
}

// Gone reports whether node is a generation of the proxy that departed:
// the proxy is its client's cluster view (WithView), which knows a
// departure before the client is told (failNode, faultDepart), as a node's
// membership does.
func (p *faultProxy) Gone(node subjects.NodeID) bool {
	return node.Name == "px" && node.Generation < p.gen.Load()
}

func (p *faultProxy) Resolve(context.Context, subjects.Address) (subjects.NodeID, error) {
	return subjects.NodeID{Name: "px", Generation: p.gen.Load()}, nil
}

func (p *faultProxy) Invalidate(subjects.Address, subjects.NodeID) {}

func (p *faultProxy) set(id string, f fault) {
	p.mu.Lock()
	p.faults[id] = f
	p.mu.Unlock()
}

func (p *faultProxy) refuse(m *nats.Msg, err error) {
	r := nats.NewMsg(m.Reply)
	verdict.Encode(r.Header, err, "px.0")
	_ = m.RespondMsg(r)
}

// leg runs on the proxy's subscription goroutine: legs are forwarded in the
// order they arrived.
func (p *faultProxy) leg(m *nats.Msg) {
	d, err := subjects.DefaultPrefix.ParseDelivery(m.Subject)
	if err != nil {
		p.t.Errorf("proxy: %v", err)
		return
	}
	id := m.Header.Get(hub.HeaderID)
	if d.Node.Generation != p.gen.Load() {
		p.note(id, "gone "+m.Header.Get(hub.HeaderLane))
		return // a departed generation: gone, answers nothing
	}
	p.mu.Lock()
	f := p.faults[id]
	delete(p.faults, id)
	p.mu.Unlock()
	p.note(id, "fwd "+m.Header.Get(hub.HeaderLane)+" "+faultNames[f])
	fwd := &nats.Msg{Subject: subjects.DefaultPrefix.Delivery(p.node.ID(), d.Addr, d.Stream), Reply: m.Reply, Header: m.Header, Data: m.Data}
	switch f {
	case faultRefuse:
		p.refuse(m, verdict.New(verdict.ReasonHubShuttingDown, "proxy: refused once"))
		return
	case faultRefuseFinal:
		p.refuse(m, verdict.New(verdict.ReasonInboxFull, "proxy: refused for good"))
		return
	case faultDrop:
		return
	case faultLoseReply:
		fwd.Reply = p.nc.NewInbox() // nobody listens
	case faultDepart:
		old := d.Node
		p.gen.Add(1)
		c := p.client.Load()
		go c.failNode(old, "proxy departure")
		return
	case faultEvict:
		// Nothing queued (the proxy is the only way in, and it waits):
		// deactivating fails nothing late, it only drops the lane state.
		for {
			st := p.node.Host().Stats()
			if st.Accepted+st.Refused+st.DedupeHits >= p.fwd && st.Queued == 0 {
				break // every forwarded leg answered, none queued
			}
			time.Sleep(time.Millisecond)
		}
		p.node.Host().Deactivate(d.Addr)
	}
	if err := p.nc.PublishMsg(fwd); err != nil {
		p.t.Errorf("proxy forward: %v", err)
	}
	p.fwd++
}

// lateSet records the late verdicts a client received, by delivery ID.
type lateSet struct {
	mu sync.Mutex
	m  map[string]error
}

func (l *lateSet) add(lv LateVerdict) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]error{}
	}
	l.m[lv.ID] = lv.Err
	l.mu.Unlock()
}

func (l *lateSet) get(id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[id]
}

// windowOutcome is what one delivery of the window tests ended with.
type windowOutcome struct {
	id  string
	f   fault
	err error
}

// checkWindowed checks the handled deliveries of every stream against the
// verdicts: no stream handled out of order (0 inversions), nothing handled
// twice (0 duplicates), everything accepted handled (0 lost), nothing
// refused or unsent handled; a timed-out delivery may have been handled
// (the callee may hold it), in its place.
func checkWindowed(t *testing.T, rec *recorder, addr subjects.Address, outs [][]windowOutcome, lates *lateSet, px *faultProxy) (accepted, failed, timeouts int) {
	t.Helper()
	byID := map[string]windowOutcome{}
	for _, st := range outs {
		for _, o := range st {
			if o.err == nil {
				if lerr := lates.get(o.id); lerr != nil {
					o.err = lerr // accepted, then failed late (deactivated first): not handled
				}
			}
			byID[o.id] = o
			switch {
			case o.err == nil:
				accepted++
			case errors.Is(o.err, context.DeadlineExceeded) || errors.Is(o.err, nats.ErrTimeout):
				timeouts++
			default:
				failed++
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec.mu.Lock()
		var missing []string
		for id, o := range byID {
			if o.err == nil {
				if lerr := lates.get(id); lerr != nil {
					// Its late verdict came after the first look (the
					// answer subscription may lag on a loaded machine).
					o.err = lerr
					byID[id] = o
					accepted--
					failed++
					continue
				}
			}
			if o.err == nil && rec.count[id] == 0 {
				missing = append(missing, id+" ("+faultNames[o.f]+")")
			}
		}
		rec.mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			if px != nil {
				px.mu.Lock()
				for _, id := range missing {
					id, _, _ = strings.Cut(id, " ")
					t.Logf("%s: %v", id, px.log[id])
				}
				px.mu.Unlock()
			}
			if px != nil {
				t.Logf("host %+v client %+v", px.node.Host().Stats(), px.client.Load().Stats())
			}
			t.Fatalf("accepted, never handled (lost): %v", missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	next := make([]int, len(outs))
	for _, d := range rec.handled[addr] {
		st, i := int(binary.BigEndian.Uint32(d.Payload)), int(binary.BigEndian.Uint32(d.Payload[4:]))
		if i < next[st] {
			t.Errorf("inversion or duplicate on stream %d: delivery %d handled after %d", st, i, next[st]-1)
		}
		next[st] = i + 1
	}
	for id, o := range byID {
		n := rec.count[id]
		switch {
		case n > 1:
			t.Errorf("delivery %s (fault %s) handled %d times", id, faultNames[o.f], n)
		case o.err == nil && n != 1:
			t.Errorf("delivery %s (fault %s) accepted, handled %d times (lost)", id, faultNames[o.f], n)
		case o.err != nil && n != 0 && !errors.Is(o.err, context.DeadlineExceeded) && !errors.Is(o.err, nats.ErrTimeout):
			t.Errorf("delivery %s (fault %s) failed with %v, yet handled", id, faultNames[o.f], o.err)
		}
	}
	return accepted, failed, timeouts
}

// TestWindowFaults: bursts of one window pipelined on each of several
// lanes to one address, with a fault at the first, a middle and the last
// position of the window, every fault kind at every position: refusals
// (resendable and final), timeouts (swallowed leg, lost reply), owner
// departures, and an intake whose lane state was evicted (the activation
// deactivated). Every delivery gets one verdict; 0 inversions, 0
// duplicates handled, 0 lost.
// laneDepth is the number of deliveries in lane key (0: no lane).
func (c *Client) laneDepth(key LaneKey) int {
	c.lanesMu.Lock()
	l := c.lanes[key]
	c.lanesMu.Unlock()
	if l == nil {
		return 0
	}
	return l.depth()
}

// cachedFaultProxy is a faultProxy whose owner is known without blocking
// (cachedResolver): the client stages its legs and the lane publishes them.
type cachedFaultProxy struct{ *faultProxy }

func (p cachedFaultProxy) Cached(subjects.Address) (subjects.NodeID, bool) {
	return subjects.NodeID{Name: "px", Generation: p.gen.Load()}, true
}

// TestWindowFaults runs every fault at every position of a window, with
// legs sent by their callers (held: the resolver blocks) and with legs
// staged and published by the lane (staged).
// Not parallel: its legs time out after 300 ms.
func TestWindowFaults(t *testing.T) {
	t.Run("held", func(t *testing.T) { windowFaults(t, false, false) })
	t.Run("staged", func(t *testing.T) { windowFaults(t, true, false) })
	t.Run("staged-callers", func(t *testing.T) { windowFaults(t, true, true) })
}

// windowFaults: with callers, each delivery is a Deliver on a goroutine of
// its own (joining the lane in a known order: the next starts once the lane
// holds the one before), so legs beyond the window are staged too.
func windowFaults(t *testing.T, staged, callers bool) {
	const window, streams = 8, 3
	bursts := 7 * int(numFaults-1) // every fault at each of 3 positions, repeated
	if !natstest.Long() {
		bursts = int(numFaults - 1)
	}
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	p := newFaultProxy(t, natstest.Connect(t, s), n)
	lates := &lateSet{}
	var res Resolver = p
	if staged {
		res = cachedFaultProxy{p}
	}
	c := newClient(t, natstest.Connect(t, s), res, WithWindow(window), WithLegTimeout(300*time.Millisecond),
		WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}), WithLateVerdicts(lates.add), WithView(p))
	p.client.Store(c)
	const addr = subjects.Address("rec/win")
	outs := make([][]windowOutcome, streams)
	var wg sync.WaitGroup
	for st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range bursts {
				var chans []<-chan Result
				var burst []windowOutcome
				for i := range window {
					seq := b*window + i
					id := fmt.Sprintf("s%d-%d", st, seq)
					f := faultNone
					pos := [3]int{0, window / 2, window - 1}[b%3]
					if i == pos && st == b%streams {
						f = fault(1 + (b/3)%int(numFaults-1))
					}
					if f != faultNone {
						p.set(id, f)
					}
					pl := make([]byte, 8)
					binary.BigEndian.PutUint32(pl, uint32(st))
					binary.BigEndian.PutUint32(pl[4:], uint32(seq))
					d := Delivery{ID: id, To: addr, Stream: subjects.Stream(fmt.Sprint(st)), Payload: pl}
					if callers {
						ch := make(chan Result, 1)
						before := c.laneDepth(laneKeyOf(&d))
						go func() {
							r, err := c.Deliver(context.Background(), d)
							ch <- Result{Receipt: r, Err: err}
						}()
						for c.laneDepth(laneKeyOf(&d)) <= before && len(ch) == 0 {
							runtime.Gosched() // polls: joined its lane (or done already)
						}
						chans = append(chans, ch)
					} else {
						chans = append(chans, c.DeliverAsync(context.Background(), d))
					}
					burst = append(burst, windowOutcome{id: id, f: f})
				}
				for i, ch := range chans {
					r := <-ch
					burst[i].err = r.Err
					select {
					case extra := <-ch:
						t.Errorf("%s: a second verdict %+v", burst[i].id, extra)
					default:
					}
					switch f := burst[i].f; {
					case f == faultRefuseFinal && !errors.Is(r.Err, verdict.ErrInboxFull):
						t.Errorf("%s (refuse-final): %v", burst[i].id, r.Err)
					case (f == faultDrop || f == faultLoseReply) && r.Err != nil && !errors.Is(r.Err, context.DeadlineExceeded):
						// nil: a departure on another lane interrupted its
						// leg before the timeout; re-sent, it was accepted.
						t.Errorf("%s (%s): %v, want its leg's timeout", burst[i].id, faultNames[f], r.Err)
					case (f == faultNone || f == faultRefuse || f == faultDepart || f == faultEvict) && r.Err != nil &&
						!errors.Is(r.Err, context.DeadlineExceeded): // a loaded machine may time a leg out
						t.Errorf("%s (%s): %v", burst[i].id, faultNames[f], r.Err)
					}
				}
				outs[st] = append(outs[st], burst...)
			}
		}()
	}
	wg.Wait()
	acc, failed, timeouts := checkWindowed(t, rec, addr, outs, lates, p)
	t.Logf("%d deliveries: %d accepted, %d failed, %d timed out; retries %d", streams*bursts*window, acc, failed, timeouts, c.Stats().Retries)
	if sat := c.Saturation(); sat.Lanes != 0 {
		t.Errorf("lanes remain after all work: %+v", sat)
	}
}

// TestWindowPipelined: thousands of deliveries pipelined with DeliverAsync
// on a few lanes, the window full all the time, the client's own link
// dropped mid-window now and then: 0 inversions, 0 duplicates handled, 0
// lost. (Evictions are TestWindowFaults' and TestLaneSequence's: a
// deactivation with a full inbox fails deliveries late, and a late verdict
// can lose the race with the acceptance that names its key.)
func TestWindowPipelined(t *testing.T) {
	const streams, per = 4, 1500
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	nc := natstest.Connect(t, s, nats.ReconnectWait(5*time.Millisecond), nats.MaxReconnects(-1))
	lates := &lateSet{}
	c := newClient(t, nc, StaticResolver{Node: n.ID()}, WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 50}),
		WithLateVerdicts(lates.add))
	const addr = subjects.Address("rec/pipe")
	// One delivery first: the client learns the node's answer key from its
	// Accepted reply. (A late verdict that overtakes the very first
	// acceptance from a generation cannot be verified and is dropped as
	// forged — a limit of the answer binding, not of the lanes.)
	if _, err := c.Deliver(context.Background(), Delivery{To: "rec/warm"}); err != nil {
		t.Fatal(err)
	}
	outs := make([][]windowOutcome, streams)
	chans := make([][]<-chan Result, streams)
	for i := range per {
		for st := range streams {
			pl := make([]byte, 8)
			binary.BigEndian.PutUint32(pl, uint32(st))
			binary.BigEndian.PutUint32(pl[4:], uint32(i))
			id := fmt.Sprintf("p%d-%d", st, i)
			chans[st] = append(chans[st], c.DeliverAsync(context.Background(), Delivery{ID: id, To: addr, Stream: subjects.Stream(fmt.Sprint(st)), Payload: pl}))
			outs[st] = append(outs[st], windowOutcome{id: id})
		}
		if i%500 == 250 {
			_ = nc.ForceReconnect()
		}
	}
	for st := range streams {
		for i, ch := range chans[st] {
			r := <-ch
			outs[st][i].err = r.Err
			if r.Err != nil && !errors.Is(r.Err, context.DeadlineExceeded) {
				t.Errorf("%s: %v", outs[st][i].id, r.Err)
			}
		}
	}
	acc, failed, timeouts := checkWindowed(t, rec, addr, outs, lates, nil)
	t.Logf("%d deliveries: %d accepted, %d failed, %d timed out; retries %d", streams*per, acc, failed, timeouts, c.Stats().Retries)
}
