package mesh

// Adversarial tests of windowed lanes (DESIGN §4, docs/protocol.md §3.4):
// shapes the other window tests do not take — windows of 1, 2, 3, 32 and
// 64 with lanes deeper than the window, Deliver, DeliverAsync,
// DeliverAsyncFunc and Request mixed on one lane, faults made by the real
// intake (hub.Config.Fence refusing or stalling the k-th leg it reads, a
// tiny inbox, a low storm breaker), more lanes than an activation keeps
// state for, cancellations and deadlines at every position, Close in the
// middle of a window, duplicate IDs, empty and oversized payloads — each
// checked for the window's properties: one verdict per call, a delivery
// reported Accepted handled exactly once, a lane's deliveries handled in
// call order, nothing refused or unsent handled, a timeout never re-sent,
// no lane or goroutine left behind.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
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

// bkQuiet discards the logs of the breaker tests (saturation episodes,
// breaker trips: expected here).
var bkQuiet = slog.New(slog.DiscardHandler)

// bkKind is how a call of the breaker tests is made.
type bkKind uint8

const (
	bkAsync     bkKind = iota // DeliverAsync
	bkAsyncFunc               // DeliverAsyncFunc
	bkDeliver                 // Deliver, blocking the lane's caller
	bkRequest                 // Request, blocking the lane's caller
)

var bkKindNames = [...]string{"async", "async-func", "deliver", "request"}

// bkCall is one call of a breaker test and what became of it.
type bkCall struct {
	id      string
	lane    int // index of its lane (address, stream) in the test
	idx     int // its place in its lane's call order
	kind    bkKind
	note    string // what the test did to it ("cancel", "deadline", ...)
	payload []byte

	verdicts atomic.Int32 // verdicts received: must end at 1
	done     chan struct{}
	err      error
}

func (c *bkCall) settle(err error) {
	if c.verdicts.Add(1) != 1 {
		return // counted: the checker reports it
	}
	c.err = err
	close(c.done)
}

// bkPayload is a call's payload: its lane and place, then filler.
func bkPayload(lane, idx, size int) []byte {
	p := make([]byte, max(8, size))
	binary.BigEndian.PutUint32(p, uint32(lane))
	binary.BigEndian.PutUint32(p[4:], uint32(idx))
	return p
}

// bkHash is a deterministic pseudo-random number for a test's choices.
func bkHash(parts ...any) uint32 {
	h := fnv.New32a()
	fmt.Fprint(h, parts...)
	return h.Sum32()
}

// bkSend makes call k on c and settles it when its verdict comes. The
// blocking kinds (Deliver, Request) return only then; the others at once.
func bkSend(ctx context.Context, c *Client, k *bkCall, d Delivery) {
	switch k.kind {
	case bkAsync:
		ch := c.DeliverAsync(ctx, d)
		go func() {
			r := <-ch
			k.settle(r.Err)
			select {
			case extra := <-ch:
				k.verdicts.Add(1)
				_ = extra
			default:
			}
		}()
	case bkAsyncFunc:
		c.DeliverAsyncFunc(ctx, d, func(r Result) { k.settle(r.Err) })
	case bkDeliver:
		_, err := c.Deliver(ctx, d)
		k.settle(err)
	case bkRequest:
		_, err := c.Request(ctx, d)
		k.settle(err)
	}
}

func bkTimeout(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// bkRules says which outcomes a breaker test allows.
type bkRules struct {
	// mayHold: a failure after which the delivery may have been handled
	// (once): a leg in flight when the client closed, its link dropped, or
	// its caller cancelled. Timeouts always may.
	mayHold func(k *bkCall) bool
	// lates are the late verdicts received, by ID (accepted, then failed).
	lates *lateSet
}

// bkCheck waits for every call's verdict and checks the window's
// properties against what the recorder handled; lanes[i] is lane i's
// address. It returns a tally of outcomes.
func bkCheck(t *testing.T, rec *recorder, lanes []subjects.Address, calls [][]*bkCall, rules bkRules) map[string]int {
	t.Helper()
	byID := map[string]*bkCall{}
	tally := map[string]int{}
	for _, lane := range calls {
		for _, k := range lane {
			select {
			case <-k.done:
			case <-time.After(60 * time.Second):
				t.Fatalf("%s (%s, lane %d #%d): no verdict", k.id, bkKindNames[k.kind], k.lane, k.idx)
			}
			byID[k.id] = k
		}
	}
	accepted := func(k *bkCall) bool {
		if k.err != nil {
			return false
		}
		if rules.lates != nil && rules.lates.get(k.id) != nil {
			return false
		}
		return true
	}
	// Everything accepted is handled (its turn may still be running).
	natstest.Eventually(t, 20*time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for id, k := range byID {
			if accepted(k) && rec.count[id] == 0 {
				return false
			}
		}
		return true
	}, "every accepted delivery handled")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, k := range byID {
		if n := k.verdicts.Load(); n != 1 {
			t.Errorf("%s (%s, lane %d #%d): %d verdicts", k.id, bkKindNames[k.kind], k.lane, k.idx, n)
		}
		n := rec.count[k.id]
		name := verdictName(k.err)
		if k.err == nil && rules.lates != nil && rules.lates.get(k.id) != nil {
			name = "late:" + verdictName(rules.lates.get(k.id))
		}
		tally[k.note+":"+bkKindNames[k.kind]+":"+name]++
		switch {
		case n > 1:
			t.Errorf("%s (%s %s, lane %d #%d): handled %d times (%v)", k.id, bkKindNames[k.kind], k.note, k.lane, k.idx, n, k.err)
		case accepted(k) && n != 1:
			t.Errorf("%s (%s %s): accepted, handled %d times", k.id, bkKindNames[k.kind], k.note, n)
		case !accepted(k) && n == 1 && !bkTimeout(k.err) && (rules.mayHold == nil || !rules.mayHold(k)):
			t.Errorf("%s (%s %s, lane %d #%d): failed (%v), yet handled", k.id, bkKindNames[k.kind], k.note, k.lane, k.idx, k.err)
		}
		if n == 1 && k.err != nil && verdict.IsResendable(k.err) && (rules.mayHold == nil || !rules.mayHold(k)) {
			t.Errorf("%s (%s %s): resendable verdict %v, yet handled", k.id, bkKindNames[k.kind], k.note, k.err)
		}
	}
	// Call order, lane by lane, among those handled (a call is known by
	// its ID), and every payload handled as it was sent.
	next := make([]int, len(calls))
	inversions, corrupt := 0, 0
	seenAddr := map[subjects.Address]bool{}
	for _, addr := range lanes {
		if seenAddr[addr] {
			continue
		}
		seenAddr[addr] = true
		for _, d := range rec.handled[addr] {
			k := byID[d.ID]
			if k == nil || lanes[k.lane] != addr {
				continue
			}
			if !bytes.Equal(d.Payload, k.payload) {
				corrupt++
				if corrupt <= 10 {
					t.Errorf("%s: handled with a payload of %d bytes, sent %d (changed)", k.id, len(d.Payload), len(k.payload))
				}
			}
			if k.idx < next[k.lane] {
				inversions++
				if inversions <= 10 {
					t.Errorf("lane %d: #%d handled after #%d (inversion or duplicate)", k.lane, k.idx, next[k.lane]-1)
				}
			}
			next[k.lane] = k.idx + 1
		}
	}
	if inversions > 10 {
		t.Errorf("%d inversions in all", inversions)
	}
	if corrupt > 10 {
		t.Errorf("%d payloads changed in all", corrupt)
	}
	return tally
}

// bkSettled waits until c holds no lane and no leg, and the host has
// nothing queued.
func bkSettled(t *testing.T, c *Client, h *hub.Host) {
	t.Helper()
	natstest.Eventually(t, 20*time.Second, func() bool {
		s := c.Saturation()
		return s.Lanes == 0 && s.LegsInFlight == 0 && h.Stats().Queued == 0
	}, "client and host settled: %+v, %+v", lazy(func() any { return c.Saturation() }), lazy(func() any { return h.Stats() }))
}

type lazy func() any

func (l lazy) String() string { return fmt.Sprintf("%+v", l()) }

// bkGoroutines waits until the goroutine count is back to at most base +
// slack (nothing leaked), and dumps the stacks if it is not.
func bkGoroutines(t *testing.T, base, slack int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for runtime.NumGoroutine() > base+slack {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines, %d before: leak?\n%s", runtime.NumGoroutine(), base, buf[:n])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// intakeFaults is a hub.Config.Fence (with a TurnFence that lets every
// turn run, so that it is asked on the intake only) that makes the real intake refuse or
// stall legs by their arrival order: the n-th leg read is refused
// resendable (shutting-down), refused for good (inbox-full) or held longer
// than the client's leg timeout, as plan(n) says. The refusals are the
// intake's own, before its lane check (which they therefore do not
// advance), and a stall delays every leg behind it on the intake, as a
// slow node would.
type intakeFaults struct {
	n     atomic.Int64
	stall time.Duration
	plan  func(n int64) fault

	refused, final, stalled atomic.Int64
}

func (f *intakeFaults) fence() error {
	n := f.n.Add(1)
	if f.plan == nil {
		return nil
	}
	switch f.plan(n) {
	case faultRefuse:
		f.refused.Add(1)
		return verdict.New(verdict.ReasonHubShuttingDown, "intake fault: refused once")
	case faultRefuseFinal:
		f.final.Add(1)
		return verdict.New(verdict.ReasonInboxFull, "intake fault: refused for good")
	case faultDrop:
		f.stalled.Add(1)
		time.Sleep(f.stall) // the fault itself: a stalled intake
	}
	return nil
}

// bkNode starts a node "b" on nc with the recorder kind and host config hc.
func bkNode(t *testing.T, nc *nats.Conn, hc hub.Config) (*Node, *recorder) {
	t.Helper()
	return bkNamedNode(t, nc, "b", hc)
}

// bkNamedNode is bkNode with a name.
func bkNamedNode(t *testing.T, nc *nats.Conn, name string, hc hub.Config) (*Node, *recorder) {
	t.Helper()
	return bkStartNode(t, NodeConfig{Conn: nc, Name: name, Host: hc})
}

// bkStartNode starts a node of cfg (quiet, without control and ingress)
// hosting a recorder as kind rec, closed when t ends.
func bkStartNode(t *testing.T, cfg NodeConfig, opts ...Option) (*Node, *recorder) {
	t.Helper()
	cfg.DisableControl, cfg.DisableIngress, cfg.Logger = true, true, bkQuiet
	n, err := NewNode(cfg, opts...)
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
	t.Cleanup(func() { _ = n.Close() })
	return n, rec
}

// bkLanes drives calls on lanes: one goroutine per lane makes its calls in
// order, kinds and notes chosen by pick; ctxFor gives each call's context.
func bkLanes(c *Client, lanes []subjects.Address, streams []subjects.Stream, depth int, payload func(lane, idx int) []byte,
	pick func(lane, idx int) bkKind, ctxFor func(k *bkCall) context.Context, prefix string) [][]*bkCall {
	calls := make([][]*bkCall, len(lanes))
	for l := range lanes {
		for i := range depth {
			calls[l] = append(calls[l], &bkCall{id: fmt.Sprintf("%s-%d-%d", prefix, l, i), lane: l, idx: i, kind: pick(l, i), done: make(chan struct{})})
		}
	}
	var wg sync.WaitGroup
	for l := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, k := range calls[l] {
				ctx := context.Background()
				if ctxFor != nil {
					ctx = ctxFor(k)
				}
				k.payload = payload(l, k.idx)
				bkSend(ctx, c, k, Delivery{ID: k.id, To: lanes[l], Stream: streams[l], Payload: k.payload})
			}
		}()
	}
	wg.Wait()
	return calls
}

// mixedKinds: mostly DeliverAsync and DeliverAsyncFunc, with blocking
// Deliver and Request calls among them.
func mixedKinds(seed string) func(lane, idx int) bkKind {
	return func(lane, idx int) bkKind {
		switch h := bkHash(seed, lane, idx) % 100; {
		case h < 55:
			return bkAsync
		case h < 80:
			return bkAsyncFunc
		case h < 90:
			return bkDeliver
		default:
			return bkRequest
		}
	}
}

// TestBreakerIntakeFaults: lanes deeper than the window (windows 1, 2, 3,
// 32, 64; several lanes of one address and one of another), every kind of
// call mixed on each lane, while the real intake refuses legs resendable
// and for good and stalls past the leg timeout at pseudo-random positions
// of the windows. One verdict each; accepted handled once; 0 inversions;
// refused never handled; and since nothing here loses a reply, the intake
// never sees an accepted delivery again (0 dedupe hits): nothing accepted
// or timed out was re-sent.
func TestBreakerIntakeFaults(t *testing.T) {
	for _, w := range []int{1, 2, 3, 32, 64} {
		t.Run(fmt.Sprintf("window%d", w), func(t *testing.T) {
			depth := max(5*w, 60)
			if !natstest.Long() {
				depth = max(2*w, 20)
			}
			s := natstest.RunServer(t)
			faults := &intakeFaults{stall: 450 * time.Millisecond}
			seed := fmt.Sprint("intake", w)
			faults.plan = func(n int64) fault {
				switch h := bkHash(seed, n) % 1000; {
				case h < 40:
					return faultRefuse
				case h < 60:
					return faultRefuseFinal
				case h < 63 && n < 3000:
					return faultDrop
				}
				return faultNone
			}
			n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{Fence: faults.fence, TurnFence: func() error { return nil }})
			nc := natstest.Connect(t, s)
			base := runtime.NumGoroutine()
			lates := &lateSet{}
			c, err := NewClient(Config{Conn: nc, Resolver: StaticResolver{Node: n.ID()}},
				WithWindow(w), WithLegTimeout(300*time.Millisecond), WithClock(newFakeClock()),
				WithRetry(RetryPolicy{MaxRetries: 20}), WithLateVerdicts(lates.add), WithLogger(bkQuiet))
			if err != nil {
				t.Fatal(err)
			}
			lanes := []subjects.Address{"rec/x", "rec/x", "rec/x", "rec/y"}
			streams := []subjects.Stream{"", "s1", "s.two", ""}
			calls := bkLanes(c, lanes, streams, depth, func(l, i int) []byte { return bkPayload(l, i, 0) }, mixedKinds(seed), nil, fmt.Sprint("if", w))
			tally := bkCheck(t, rec, lanes, calls, bkRules{lates: lates})
			bkSettled(t, c, n.Host())
			hs := n.Host().Stats()
			if hs.DedupeHits != 0 {
				t.Errorf("the intake saw %d accepted deliveries again: something accepted or timed out was re-sent (%+v)", hs.DedupeHits, hs)
			}
			for _, lane := range calls {
				for _, k := range lane {
					if k.err != nil && !bkTimeout(k.err) && !errors.Is(k.err, verdict.ErrInboxFull) {
						t.Errorf("%s (%s): %v; want accepted, a timeout or the final refusal", k.id, bkKindNames[k.kind], k.err)
					}
				}
			}
			c.Close()
			bkGoroutines(t, base, 3)
			t.Logf("window %d: %d calls; intake: %d legs read, %d refused resendable, %d for good, %d stalls; client %+v; %v",
				w, len(lanes)*depth, faults.n.Load(), faults.refused.Load(), faults.final.Load(), faults.stalled.Load(), c.Stats(), tally)
		})
	}
}

// TestBreakerOverload: windows of 32 and 64 on several lanes of one
// address into a tiny inbox behind a slow handler, and into a low storm
// breaker: refusals (inbox-full, storm-breaker: Ignored, never re-sent)
// fall anywhere in the windows. Each fails alone; the rest is handled once,
// in call order. (The breaker counts only legs outside a windowed lane:
// here it can refuse a lane's lone legs, the first of each burst, and must
// leave its windowed legs alone.)
func TestBreakerOverload(t *testing.T) {
	for _, tc := range []struct {
		name  string
		w     int
		depth int
		hc    hub.Config
		slow  bool
	}{
		{"inbox3-window32", 32, 192, hub.Config{InboxSize: 3}, true},
		{"inbox1-window64", 64, 128, hub.Config{InboxSize: 1}, true},
		{"breaker-window32", 32, 192, hub.Config{BreakerRate: 150}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t)
			n, rec := bkNode(t, natstest.Connect(t, s), tc.hc)
			if tc.slow {
				var turns atomic.Int64
				rec.mu.Lock()
				rec.fn = func(ctx context.Context, d *hub.Delivery) error {
					if turns.Add(1)%7 == 0 {
						runtime.Gosched()
						time.Sleep(200 * time.Microsecond) // a slow handler: the fault under test
					}
					return nil
				}
				rec.mu.Unlock()
			}
			lates := &lateSet{}
			c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithWindow(tc.w),
				WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}), WithLateVerdicts(lates.add), WithLogger(bkQuiet))
			lanes := []subjects.Address{"rec/o", "rec/o", "rec/o"}
			streams := []subjects.Stream{"a", "b", "c"}
			depth := tc.depth
			calls := bkLanes(c, lanes, streams, depth, func(l, i int) []byte { return bkPayload(l, i, 0) },
				func(l, i int) bkKind { return bkKind(bkHash(tc.name, l, i) % 2) }, nil, tc.name)
			tally := bkCheck(t, rec, lanes, calls, bkRules{lates: lates})
			bkSettled(t, c, n.Host())
			for _, lane := range calls {
				for _, k := range lane {
					if k.err != nil && !errors.Is(k.err, verdict.ErrInboxFull) && !errors.Is(k.err, verdict.ErrStormBreaker) && !bkTimeout(k.err) {
						t.Errorf("%s: %v", k.id, k.err)
					}
				}
			}
			if hs := n.Host().Stats(); hs.DedupeHits != 0 {
				t.Errorf("%d dedupe hits: an accepted delivery was re-sent", hs.DedupeHits)
			}
			t.Logf("%s: %d calls, host %+v, %v", tc.name, len(lanes)*depth, n.Host().Stats().RefusedByReason, tally)
		})
	}
}

// TestBreakerEvictedLanes: more lanes of one address than an activation
// keeps state for (maxLaneStates), each pipelining a window, so that the
// intake evicts the state of lanes whose windows are in flight: their next
// legs are refused out of order and re-sent in a new epoch. Nothing is
// lost, handled twice or out of order, and every lane makes progress.
func TestBreakerEvictedLanes(t *testing.T) {
	streams, depth := 1200, 6
	if !natstest.Long() {
		streams = 1100
	}
	s := natstest.RunServer(t)
	n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{InboxSize: streams * depth})
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithWindow(4), WithMaxInFlight(4096),
		WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}), WithLogger(bkQuiet))
	lanes := make([]subjects.Address, streams)
	sts := make([]subjects.Stream, streams)
	for i := range lanes {
		lanes[i], sts[i] = "rec/evict", subjects.Stream(fmt.Sprint("st", i))
	}
	calls := bkLanes(c, lanes, sts, depth, func(l, i int) []byte { return bkPayload(l, i, 0) },
		func(l, i int) bkKind { return bkAsync + bkKind(i%2) }, nil, "ev")
	tally := bkCheck(t, rec, lanes, calls, bkRules{})
	for _, lane := range calls {
		for _, k := range lane {
			if k.err != nil && !bkTimeout(k.err) {
				t.Errorf("%s: %v", k.id, k.err)
			}
		}
	}
	bkSettled(t, c, n.Host())
	hs := n.Host().Stats()
	if hs.DedupeHits != 0 {
		t.Errorf("%d dedupe hits: an accepted delivery was re-sent", hs.DedupeHits)
	}
	t.Logf("%d lanes × %d: host refused %v; %v", streams, depth, hs.RefusedByReason, tally)
}

// TestBreakerCallerEnds: a lane pipelined with the caller's context
// cancelled, expiring, or already done at the first, a middle and the last
// position of each window (windows 1, 2, 32, and 64 with only 5 legs in
// flight allowed, so that calls also end while waiting for a slot), and
// Client.Close in the
// middle of deep windows. One verdict each; a delivery that got a
// resendable verdict (deadline before sending, ErrClosing) was never
// handled unless its leg was in flight when Close interrupted it; a
// cancelled or expired one handled at most once; the rest handled once,
// in call order; no lane or goroutine left.
func TestBreakerCallerEnds(t *testing.T) {
	for _, tc := range []struct{ w, slots int }{{1, 256}, {2, 256}, {32, 256}, {64, 5}} {
		w := tc.w
		t.Run(fmt.Sprintf("window%d-slots%d", w, tc.slots), func(t *testing.T) {
			s := natstest.RunServer(t)
			n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{})
			nc := natstest.Connect(t, s)
			base := runtime.NumGoroutine()
			c, err := NewClient(Config{Conn: nc, Resolver: StaticResolver{Node: n.ID()}}, WithWindow(w), WithLogger(bkQuiet),
				WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}), WithMaxInFlight(tc.slots))
			if err != nil {
				t.Fatal(err)
			}
			depth := max(8*w, 48)
			var cancels []context.CancelFunc
			var cmu sync.Mutex
			ctxFor := func(k *bkCall) context.Context {
				pos := k.idx % max(w, 3)
				if pos != 0 && pos != max(w, 3)/2 && pos != max(w, 3)-1 {
					return context.Background()
				}
				ctx, cancel := context.WithCancel(context.Background())
				cmu.Lock()
				cancels = append(cancels, cancel)
				cmu.Unlock()
				switch bkHash("ends", w, k.lane, k.idx) % 5 {
				case 0:
					k.note = "pre-cancelled"
					cancel()
				case 1:
					k.note = "cancel"
					time.AfterFunc(time.Duration(bkHash(k.id)%2000)*time.Microsecond, cancel)
				case 2:
					k.note = "deadline"
					ctx, cancel = context.WithTimeout(ctx, time.Duration(bkHash(k.id)%3000)*time.Microsecond)
					cmu.Lock()
					cancels = append(cancels, cancel)
					cmu.Unlock()
				case 3:
					k.note = "expired"
					ctx, cancel = context.WithDeadline(ctx, time.Now().Add(-time.Second))
					cmu.Lock()
					cancels = append(cancels, cancel)
					cmu.Unlock()
				default:
					k.note = "cancel-later"
					time.AfterFunc(50*time.Millisecond, cancel)
				}
				return ctx
			}
			lanes := []subjects.Address{"rec/e", "rec/e", "rec/f"}
			sts := []subjects.Stream{"1", "2", ""}
			calls := bkLanes(c, lanes, sts, depth, func(l, i int) []byte { return bkPayload(l, i, 0) }, mixedKinds("ends"), ctxFor, fmt.Sprint("ce", w))
			mayHold := func(k *bkCall) bool { return errors.Is(k.err, context.Canceled) }
			tally := bkCheck(t, rec, lanes, calls, bkRules{mayHold: mayHold})
			for _, lane := range calls {
				for _, k := range lane {
					switch {
					case k.err == nil, bkTimeout(k.err), errors.Is(k.err, verdict.ErrDeadlineUnsent), errors.Is(k.err, context.Canceled):
					default:
						t.Errorf("%s (%s %s): %v", k.id, bkKindNames[k.kind], k.note, k.err)
					}
					if k.note == "" && k.err != nil && !bkTimeout(k.err) {
						t.Errorf("%s (%s): %v, not cancelled by its caller", k.id, bkKindNames[k.kind], k.err)
					}
					if (k.note == "pre-cancelled" || k.note == "expired") && k.err == nil {
						t.Errorf("%s (%s %s): accepted", k.id, bkKindNames[k.kind], k.note)
					}
				}
			}
			bkSettled(t, c, n.Host())
			// Close in the middle of deep windows.
			var closeCalls [][]*bkCall
			var wg sync.WaitGroup
			wg.Add(1)
			lanes2 := []subjects.Address{"rec/e2", "rec/e2", "rec/f2"}
			go func() {
				defer wg.Done()
				closeCalls = bkLanes(c, lanes2, sts, 4*depth, func(l, i int) []byte { return bkPayload(l, i, 0) }, mixedKinds("close"), nil, fmt.Sprint("cl", w))
			}()
			before := n.Host().Stats().Accepted
			natstest.Eventually(t, 10*time.Second, func() bool { return n.Host().Stats().Accepted >= before+int64(depth) }, "half the calls accepted")
			c.Close()
			wg.Wait()
			closing := func(k *bkCall) bool { return errors.Is(k.err, verdict.ErrClosing) }
			tally2 := bkCheck(t, rec, lanes2, closeCalls, bkRules{mayHold: closing})
			for _, lane := range closeCalls {
				for _, k := range lane {
					if k.err != nil && !closing(k) && !bkTimeout(k.err) {
						t.Errorf("%s (%s): %v, want accepted or closing", k.id, bkKindNames[k.kind], k.err)
					}
				}
			}
			if sat := c.Saturation(); sat.Lanes != 0 || sat.LegsInFlight != 0 {
				t.Errorf("after Close: %+v", sat)
			}
			cmu.Lock()
			for _, cancel := range cancels {
				cancel()
			}
			cmu.Unlock()
			bkGoroutines(t, base, 3)
			t.Logf("window %d: %v; close: %v", w, tally, tally2)
		})
	}
}

// TestBreakerPayloadsAndStreams: windows pipelined on streams and an
// address of odd bytes (NUL, '.', '*', '>', '=', space, multi-byte UTF-8,
// a 256-byte stream of control bytes), with payloads from empty to the
// server's max_payload: a payload over it fails before anything is sent,
// and one that fits alone but not with the headers fails when its leg is
// published in the middle of the window. Those fail alone, never handled;
// the rest is handled once, in order, byte for byte as sent.
func TestBreakerPayloadsAndStreams(t *testing.T) {
	const maxPayload = 64 << 10
	s := natstest.RunServer(t, natstest.WithMaxPayload(maxPayload))
	n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{})
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithWindow(8), WithLogger(bkQuiet),
		WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}))
	sts := []subjects.Stream{"", "\x00", "a.b", "*", ">", " ", "=", "=3D", "é😀", subjects.Stream(strings.Repeat("\x01", 256)), "s", ""}
	lanes := make([]subjects.Address, len(sts))
	for i := range lanes {
		lanes[i] = "rec/p"
	}
	lanes[len(lanes)-2], lanes[len(lanes)-1] = "rec/x y.z*>", "rec/=3D=é~"
	depth := 40
	sizes := func(l, i int) int {
		switch h := bkHash("payload", l, i) % 100; {
		case h < 30:
			return 0
		case h < 70:
			return int(h)
		case h < 90:
			return 4096 + int(bkHash(l, i)%12000)
		case h < 95:
			return maxPayload - 2048 // fits with the headers
		case h < 98:
			return maxPayload - 8 // fits alone, not with the headers
		default:
			return maxPayload + 1
		}
	}
	payload := func(l, i int) []byte {
		n := sizes(l, i)
		if n == 0 {
			return nil
		}
		p, h := make([]byte, n), bkHash(l, i)
		for j := range p {
			p[j] = byte(h + uint32(j)*31)
		}
		return p
	}
	calls := bkLanes(c, lanes, sts, depth, payload, mixedKinds("kinds of payloads"), nil, "pl")
	tally := bkCheck(t, rec, lanes, calls, bkRules{})
	tooLarge := 0
	for _, lane := range calls {
		for _, k := range lane {
			big := len(k.payload) > maxPayload-1024
			switch {
			case big && len(k.payload) > maxPayload-2048:
				if !errors.Is(k.err, verdict.ErrPayloadTooLarge) || verdict.IsTransient(k.err) {
					t.Errorf("%s (%d bytes): %v, want payload-too-large", k.id, len(k.payload), k.err)
				}
				tooLarge++
			case k.err != nil && !bkTimeout(k.err):
				t.Errorf("%s (%s, %d bytes, stream %q): %v", k.id, bkKindNames[k.kind], len(k.payload), sts[k.lane], k.err)
			}
		}
	}
	bkSettled(t, c, n.Host())
	if hs := n.Host().Stats(); hs.DedupeHits != 0 {
		t.Errorf("%d dedupe hits", hs.DedupeHits)
	}
	t.Logf("%d calls, %d too large: %v", len(lanes)*depth, tooLarge, tally)
}

// splitResolver sends addresses under rec/a to a fault proxy's current
// generation, every other address to node.
type splitResolver struct {
	px   *faultProxy
	node subjects.NodeID
}

func (r splitResolver) Resolve(ctx context.Context, addr subjects.Address) (subjects.NodeID, error) {
	if strings.HasPrefix(string(addr), "rec/a") {
		return r.px.Resolve(ctx, addr)
	}
	return r.node, nil
}

func (splitResolver) Invalidate(subjects.Address, subjects.NodeID) {}

// TestBreakerDepartureIsolation: one client pipelines windows to an owner
// that departs every few milliseconds (a proxy generation declared gone
// with failNode; the real node behind it dedupes the re-sends) and, on
// the same lanes' client, to a second owner that never departs; a second
// client pipelines to that owner too. Flights and lanes are pooled across
// deliveries and clients: a departure must reach only the deliveries
// addressed to the departed generation, in the life they were in — the
// other owner's deliveries are all accepted at the first leg (no retry, no
// dedupe hit there). The departing owner's deliveries are each accepted,
// handled once, in call order.
func TestBreakerDepartureIsolation(t *testing.T) {
	per := 400
	if !natstest.Long() {
		per = 100
	}
	s := natstest.RunServer(t)
	na, reca := bkNamedNode(t, natstest.Connect(t, s), "a", hub.Config{})
	nb, recb := bkNamedNode(t, natstest.Connect(t, s), "bb", hub.Config{})
	p := newFaultProxy(t, natstest.Connect(t, s), na)
	c1 := newClient(t, natstest.Connect(t, s), splitResolver{px: p, node: nb.ID()}, WithWindow(16), WithLogger(bkQuiet),
		WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 500}), WithLegTimeout(5*time.Second), WithView(p))
	c2 := newClient(t, natstest.Connect(t, s), StaticResolver{Node: nb.ID()}, WithWindow(16), WithLogger(bkQuiet))
	p.client.Store(c1)
	stop := make(chan struct{})
	chaos := make(chan int)
	go func() {
		events := 0
		for {
			select {
			case <-stop:
				chaos <- events
				return
			case <-time.After(2 * time.Millisecond):
			}
			old := subjects.NodeID{Name: "px", Generation: p.gen.Add(1) - 1}
			c1.failNode(old, "chaos")
			events++
		}
	}()
	lanesA := []subjects.Address{"rec/a1", "rec/a1", "rec/a2"}
	lanesB := []subjects.Address{"rec/b1", "rec/b1", "rec/b2"}
	sts := []subjects.Stream{"x", "y", ""}
	var callsA, callsB, callsB2 [][]*bkCall
	var wg sync.WaitGroup
	wg.Add(3)
	pl := func(l, i int) []byte { return bkPayload(l, i, 0) }
	go func() {
		defer wg.Done()
		callsA = bkLanes(c1, lanesA, sts, per, pl, func(l, i int) bkKind { return bkKind(bkHash("a", l, i) % 3) }, nil, "da")
	}()
	go func() {
		defer wg.Done()
		callsB = bkLanes(c1, lanesB, sts, per, pl, mixedKinds("b"), nil, "db")
	}()
	go func() {
		defer wg.Done()
		callsB2 = bkLanes(c2, []subjects.Address{"rec/b3", "rec/b3", "rec/b4"}, sts, per, pl, mixedKinds("b2"), nil, "dc")
	}()
	wg.Wait()
	tallyA := bkCheck(t, reca, lanesA, callsA, bkRules{})
	close(stop)
	events := <-chaos
	tallyB := bkCheck(t, recb, lanesB, callsB, bkRules{})
	bkCheck(t, recb, []subjects.Address{"rec/b3", "rec/b3", "rec/b4"}, callsB2, bkRules{})
	for _, set := range [][][]*bkCall{callsA, callsB, callsB2} {
		for _, lane := range set {
			for _, k := range lane {
				if k.err != nil {
					t.Errorf("%s (%s): %v", k.id, bkKindNames[k.kind], k.err)
				}
			}
		}
	}
	if hs := nb.Host().Stats(); hs.DedupeHits != 0 {
		t.Errorf("the owner that never departed saw %d deliveries again: a departure reached a delivery not addressed to it", hs.DedupeHits)
	}
	if st := c2.Stats(); st.Retries != 0 {
		t.Errorf("the client without departures retried %d times: %+v", st.Retries, st)
	}
	bkSettled(t, c1, na.Host())
	t.Logf("%d departures; client 1 %+v; A %+v; B %v", events, c1.Stats(), tallyA, tallyB)
}

// TestBreakerManySenders: one lane (address, stream) fed by many callers at
// once — 12 goroutines of one client, each making its own ordered calls of
// every kind, and 6 clients of their own — while the intake refuses legs
// now and then (resendable and for good). Each caller's calls are handled
// in its call order; one verdict each; accepted handled once; refused
// never; 0 dedupe hits.
func TestBreakerManySenders(t *testing.T) {
	for _, w := range []int{3, 64} {
		t.Run(fmt.Sprintf("window%d", w), func(t *testing.T) {
			s := natstest.RunServer(t)
			faults := &intakeFaults{}
			seed := fmt.Sprint("senders", w)
			faults.plan = func(n int64) fault {
				switch h := bkHash(seed, n) % 1000; {
				case h < 30:
					return faultRefuse
				case h < 45:
					return faultRefuseFinal
				}
				return faultNone
			}
			n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{Fence: faults.fence, TurnFence: func() error { return nil }})
			opts := []Option{WithWindow(w), WithLogger(bkQuiet), WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20})}
			shared := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, opts...)
			const goroutines, clients, depth = 12, 6, 60
			lanes := make([]subjects.Address, goroutines+clients)
			sts := make([]subjects.Stream, len(lanes))
			for i := range lanes {
				lanes[i], sts[i] = "rec/many", "one"
			}
			all := make([][]*bkCall, len(lanes))
			var wg sync.WaitGroup
			// Each caller is a "lane" of the checker: its own calls, in
			// its own order, on the one real lane.
			pl := func(l, i int) []byte { return bkPayload(l, i, int(bkHash(l, i)%64)) }
			wg.Add(1)
			go func() {
				defer wg.Done()
				got := bkLanes(shared, lanes[:goroutines], sts[:goroutines], depth, pl, mixedKinds(seed), nil, "ms")
				copy(all, got)
			}()
			for ci := range clients {
				c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, opts...)
				wg.Add(1)
				go func() {
					defer wg.Done()
					l := goroutines + ci
					one := bkLanes(c, lanes[l:l+1], sts[l:l+1], depth, func(_, i int) []byte { return pl(l, i) }, mixedKinds(fmt.Sprint(seed, ci)), nil, fmt.Sprint("mc", ci))
					for _, k := range one[0] {
						k.lane = l
					}
					all[l] = one[0]
				}()
			}
			wg.Wait()
			tally := bkCheck(t, rec, lanes, all, bkRules{})
			bkSettled(t, shared, n.Host())
			for _, lane := range all {
				for _, k := range lane {
					if k.err != nil && !errors.Is(k.err, verdict.ErrInboxFull) && !bkTimeout(k.err) {
						t.Errorf("%s (%s): %v", k.id, bkKindNames[k.kind], k.err)
					}
				}
			}
			if hs := n.Host().Stats(); hs.DedupeHits != 0 {
				t.Errorf("%d dedupe hits", hs.DedupeHits)
			}
			t.Logf("window %d: %d calls; intake %d legs, %d refused resendable, %d for good; %v", w, len(lanes)*depth, faults.n.Load(), faults.refused.Load(), faults.final.Load(), tally)
		})
	}
}

// TestBreakerColdWindows: windows pipelined at once to many addresses no
// node has activated yet, on a node with membership: each address's legs
// park on its claim (a tight park bound refuses some, Ignored, in the
// middle of windows) and are accepted in lane order once it is claimed.
// One verdict each; accepted handled once; parked-and-refused never; 0
// inversions; one activation per address.
func TestBreakerColdWindows(t *testing.T) {
	for _, tc := range []struct {
		name  string
		park  int
		addrs int
	}{
		{"park-default", 0, 150},
		{"park2", 2, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t)
			nc := natstest.Connect(t, s)
			mc := steadyMembership
			n, rec := bkStartNode(t, NodeConfig{Conn: nc, Name: "cold", Membership: &mc, Host: hub.Config{ParkPerAddress: tc.park}},
				WithWindow(8), WithLogger(bkQuiet), WithRetry(RetryPolicy{MaxRetries: 20}), WithClock(newFakeClock()))
			lanes := make([]subjects.Address, tc.addrs)
			sts := make([]subjects.Stream, tc.addrs)
			for i := range lanes {
				lanes[i] = subjects.Address(fmt.Sprintf("rec/cold-%s-%d", tc.name, i))
			}
			calls := bkLanes(n.Client, lanes, sts, 12, func(l, i int) []byte { return bkPayload(l, i, 0) },
				func(l, i int) bkKind { return bkKind(bkHash("cold", l, i) % 2) }, nil, "cw"+tc.name)
			tally := bkCheck(t, rec, lanes, calls, bkRules{})
			for _, lane := range calls {
				for _, k := range lane {
					if k.err != nil && !bkTimeout(k.err) && (tc.park == 0 || !errors.Is(k.err, verdict.ErrInboxFull)) {
						t.Errorf("%s: %v", k.id, k.err)
					}
				}
			}
			hs := n.Host().Stats()
			if hs.Activations > tc.addrs {
				t.Errorf("%d activations for %d addresses", hs.Activations, tc.addrs)
			}
			if hs.DedupeHits != 0 {
				t.Errorf("%d dedupe hits", hs.DedupeHits)
			}
			t.Logf("%s: %d calls to %d cold addresses; host refused %v; %v", tc.name, tc.addrs*12, tc.addrs, hs.RefusedByReason, tally)
		})
	}
}

// TestBreakerIdleCollection: activations collected as idle after 1 ms, so
// that the intake loses a lane's state between the legs of a window
// whenever the inbox runs dry (a blocking Deliver or Request among the
// calls makes such gaps); later legs of the window meet a fresh activation
// that holds no state for them and are refused out of order, then re-sent
// in a new epoch. Nothing lost, handled twice or out of order.
func TestBreakerIdleCollection(t *testing.T) {
	for _, w := range []int{4, 32} {
		t.Run(fmt.Sprintf("window%d", w), func(t *testing.T) {
			s := natstest.RunServer(t)
			n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{IdleTimeout: time.Millisecond})
			lates := &lateSet{}
			c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithWindow(w), WithLogger(bkQuiet),
				WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}), WithLateVerdicts(lates.add))
			if _, err := c.Deliver(context.Background(), Delivery{To: "rec/warm"}); err != nil {
				t.Fatal(err) // the client learns the node's answer key
			}
			lanes := []subjects.Address{"rec/idle", "rec/idle", "rec/idle2"}
			sts := []subjects.Stream{"a", "b", ""}
			calls := bkLanes(c, lanes, sts, 200, func(l, i int) []byte { return bkPayload(l, i, 0) }, mixedKinds(fmt.Sprint("idle", w)), nil, fmt.Sprint("ic", w))
			tally := bkCheck(t, rec, lanes, calls, bkRules{lates: lates})
			for _, lane := range calls {
				for _, k := range lane {
					if k.err != nil && !bkTimeout(k.err) {
						t.Errorf("%s (%s): %v", k.id, bkKindNames[k.kind], k.err)
					}
				}
			}
			bkSettled(t, c, n.Host())
			hs := n.Host().Stats()
			if hs.DedupeHits != 0 {
				t.Errorf("%d dedupe hits", hs.DedupeHits)
			}
			t.Logf("window %d: %d deactivations, refused %v, late %v; %v", w, hs.Deactivated, hs.RefusedByReason, hs.LateByReason, tally)
		})
	}
}

// TestBreakerLinkChaos: the client's own link dropped every few
// milliseconds while windows of every kind of call are in flight (windows
// 2 and 64) and the intake refuses some legs. A leg lost with the link is
// re-sent after the reconnect under its ID (the intake dedupes it): every
// plain delivery ends accepted and handled once; a Request ends with its
// response or, if its response was lost with the link after acceptance,
// outcome-unknown (Failed, handled at most once); a lane's calls are handled
// in call order.
func TestBreakerLinkChaos(t *testing.T) {
	for _, w := range []int{2, 64} {
		t.Run(fmt.Sprintf("window%d", w), func(t *testing.T) {
			s := natstest.RunServer(t)
			faults := &intakeFaults{}
			seed := fmt.Sprint("link", w)
			faults.plan = func(n int64) fault {
				if bkHash(seed, n)%1000 < 20 {
					return faultRefuse
				}
				return faultNone
			}
			n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{Fence: faults.fence, TurnFence: func() error { return nil }})
			nc := natstest.Connect(t, s, nats.ReconnectWait(5*time.Millisecond), nats.MaxReconnects(-1))
			c := newClient(t, nc, StaticResolver{Node: n.ID()}, WithWindow(w), WithLogger(bkQuiet),
				WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 200}))
			if _, err := c.Deliver(context.Background(), Delivery{To: "rec/warm"}); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			drops := make(chan int)
			go func() {
				k := 0
				for {
					select {
					case <-stop:
						drops <- k
						return
					case <-time.After(15 * time.Millisecond):
					}
					_ = nc.ForceReconnect()
					k++
				}
			}()
			lanes := []subjects.Address{"rec/link", "rec/link", "rec/link2"}
			sts := []subjects.Stream{"a", "b", ""}
			calls := bkLanes(c, lanes, sts, 250, func(l, i int) []byte { return bkPayload(l, i, 0) }, mixedKinds(seed), nil, fmt.Sprint("lk", w))
			close(stop)
			k := <-drops
			unknown := func(k *bkCall) bool { return k.kind == bkRequest && errors.Is(k.err, verdict.ErrOutcomeUnknown) }
			tally := bkCheck(t, rec, lanes, calls, bkRules{mayHold: unknown})
			for _, lane := range calls {
				for _, k := range lane {
					if k.err != nil && !unknown(k) && !bkTimeout(k.err) {
						t.Errorf("%s (%s): %v", k.id, bkKindNames[k.kind], k.err)
					}
				}
			}
			natstest.Eventually(t, 10*time.Second, nc.IsConnected, "reconnected")
			bkSettled(t, c, n.Host())
			t.Logf("window %d: %d link drops; client %+v; %v", w, k, c.Stats(), tally)
		})
	}
}

// TestBreakerDuplicateIDs: a caller that reuses delivery IDs inside a
// window (a misuse the protocol tolerates: the reuse vanishes with an
// Accepted reply). A reused ID is answered from the intake's dedupe
// without being handled again and without advancing the lane, so the leg
// behind it is refused out of order and re-sent: nothing hangs, every
// call gets one verdict, every ID is handled once, in the order of its
// first use; a Request reusing the ID of a plain delivery gets no response
// (it ends at its deadline), one reusing the ID of a Request in flight
// fails at once (bad request).
func TestBreakerDuplicateIDs(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{})
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithWindow(8), WithLogger(bkQuiet),
		WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}))
	const addr = subjects.Address("rec/dup")
	type dcall struct {
		id    string
		first int // the index of the first call with this ID
		kind  bkKind
		k     *bkCall
	}
	var calls []*dcall
	for i := range 400 {
		d := &dcall{id: fmt.Sprint("dup-", i), first: i, kind: bkAsync}
		switch {
		case i%7 == 6:
			d.id, d.first = calls[i-3].id, calls[i-3].first // reused inside the window
		case i%23 == 22:
			d.kind = bkRequest
			d.id, d.first = calls[i-1].id, calls[i-1].first // a Request reusing a plain delivery's ID
		}
		d.k = &bkCall{id: d.id, idx: i, kind: d.kind, done: make(chan struct{}), payload: bkPayload(0, i, 0)}
		calls = append(calls, d)
	}
	for _, d := range calls {
		ctx := context.Background()
		if d.kind == bkRequest {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
		}
		bkSend(ctx, c, d.k, Delivery{ID: d.id, To: addr, Payload: d.k.payload})
	}
	// Two Requests under one ID at once: the second fails before sending.
	gate := make(chan struct{})
	rec.mu.Lock()
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.ID == "dup-req" {
			<-gate
		}
		return nil
	}
	rec.mu.Unlock()
	first := c.DeliverAsync(context.Background(), Delivery{ID: "dup-warm", To: addr})
	reqDone := make(chan error, 1)
	go func() {
		_, err := c.Request(context.Background(), Delivery{ID: "dup-req", To: addr, Stream: "r"})
		reqDone <- err
	}()
	natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions("dup-req") == 1 }, "the first request handled")
	if _, err := c.Request(context.Background(), Delivery{ID: "dup-req", To: addr, Stream: "r"}); !errors.Is(err, verdict.ErrBadRequest) {
		t.Errorf("a second Request under an ID in flight: %v, want bad-request", err)
	}
	close(gate)
	if err := <-reqDone; err != nil {
		t.Errorf("the first request: %v", err)
	}
	if r := <-first; r.Err != nil {
		t.Error(r.Err)
	}
	tally := map[string]int{}
	for _, d := range calls {
		select {
		case <-d.k.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s (#%d): no verdict", d.id, d.k.idx)
		}
		if v := d.k.verdicts.Load(); v != 1 {
			t.Errorf("%s (#%d): %d verdicts", d.id, d.k.idx, v)
		}
		reused := d.first != d.k.idx
		tally[fmt.Sprint(bkKindNames[d.kind], " reused ", reused, ": ", verdictName(d.k.err))]++
		switch {
		case d.kind == bkRequest:
			if !bkTimeout(d.k.err) {
				t.Errorf("%s (#%d, a Request reusing a delivery's ID): %v, want its deadline", d.id, d.k.idx, d.k.err)
			}
		case d.k.err != nil:
			t.Errorf("%s (#%d): %v", d.id, d.k.idx, d.k.err)
		}
	}
	bkSettled(t, c, n.Host())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	next := 0
	for _, d := range rec.handled[addr] {
		var i int
		if _, err := fmt.Sscanf(d.ID, "dup-%d", &i); err != nil {
			continue
		}
		if i < next {
			t.Errorf("dup-%d handled after dup-%d", i, next-1)
		}
		next = i + 1
	}
	for _, d := range calls {
		if n := rec.count[d.id]; n != 1 {
			t.Errorf("%s: handled %d times", d.id, n)
		}
	}
	t.Logf("%v; host refused %v, dedupe hits %d", tally, n.Host().Stats().RefusedByReason, n.Host().Stats().DedupeHits)
}

// TestBreakerHotLane: the benchmark's shape — one lane (address, stream)
// with hundreds of concurrent callers, each making its own sequence of
// Deliver, Request and DeliverAsync calls — steady, then with the client's
// link dropped every 20 ms. Pooled flights, tickets, lanes, leg messages
// and reply slots are reused at the highest rate here. Each caller's calls
// are handled in its order, once; every plain delivery is accepted; a
// Request ends with its response or, after a drop, outcome-unknown.
func TestBreakerHotLane(t *testing.T) {
	for _, tc := range []struct {
		name           string
		callers, depth int
		chaos          bool
	}{{"steady", 256, 16, false}, {"link-chaos", 128, 8, true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t)
			n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{})
			nc := natstest.Connect(t, s, nats.ReconnectWait(5*time.Millisecond), nats.MaxReconnects(-1))
			c := newClient(t, nc, StaticResolver{Node: n.ID()}, WithLogger(bkQuiet), WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 200}))
			stop := make(chan struct{})
			drops := make(chan int, 1)
			go func() {
				k := 0
				defer func() { drops <- k }()
				for tc.chaos {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					_ = nc.ForceReconnect()
					k++
				}
			}()
			lanes := make([]subjects.Address, tc.callers)
			sts := make([]subjects.Stream, tc.callers)
			for i := range lanes {
				lanes[i] = "rec/hot"
			}
			calls := bkLanes(c, lanes, sts, tc.depth, func(l, i int) []byte { return bkPayload(l, i, 0) },
				func(l, i int) bkKind {
					return []bkKind{bkDeliver, bkDeliver, bkRequest, bkAsync}[bkHash(tc.name, l, i)%4]
				}, nil, "hot"+tc.name)
			close(stop)
			k := <-drops
			unknown := func(k *bkCall) bool {
				return tc.chaos && k.kind == bkRequest && errors.Is(k.err, verdict.ErrOutcomeUnknown)
			}
			tally := bkCheck(t, rec, lanes, calls, bkRules{mayHold: unknown})
			for _, lane := range calls {
				for _, k := range lane {
					if k.err != nil && !unknown(k) {
						t.Errorf("%s (%s): %v", k.id, bkKindNames[k.kind], k.err)
					}
				}
			}
			natstest.Eventually(t, 10*time.Second, nc.IsConnected, "reconnected")
			bkSettled(t, c, n.Host())
			hs := n.Host().Stats()
			if !tc.chaos && (hs.DedupeHits != 0 || hs.Refused != 0) {
				t.Errorf("steady: %d dedupe hits, refused %v", hs.DedupeHits, hs.RefusedByReason)
			}
			t.Logf("%s: %d calls, %d link drops; host refused %v, %d dedupe hits; %v", tc.name, tc.callers*tc.depth, k, hs.RefusedByReason, hs.DedupeHits, tally)
		})
	}
}

// TestBreakerSlowFailingBuilds: windows into addresses whose hub takes
// longer to build than a leg's timeout, and whose every other build fails.
// The intake answers on acceptance, so no leg waits for a build; the
// deliveries accepted while a build that fails was running each get one
// late activation-failed (never handled), and the lane goes on into the
// next build, handled in call order.
func TestBreakerSlowFailingBuilds(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := bkNode(t, natstest.Connect(t, s), hub.Config{})
	var builds atomic.Int64
	if err := n.Register("slow", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		b := builds.Add(1)
		time.Sleep(400 * time.Millisecond) // the fault: a build slower than the leg timeout
		if b%2 == 1 {
			return nil, errors.New("breaker: the build failed")
		}
		return rec.factory(ctx, addr)
	}); err != nil {
		t.Fatal(err)
	}
	lates := &lateSet{}
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithWindow(16), WithLogger(bkQuiet), WithLegTimeout(300*time.Millisecond),
		WithClock(newFakeClock()), WithRetry(RetryPolicy{MaxRetries: 20}), WithLateVerdicts(lates.add))
	if _, err := c.Deliver(context.Background(), Delivery{To: "rec/warm"}); err != nil {
		t.Fatal(err) // the client learns the node's answer key
	}
	lanes := []subjects.Address{"slow/a", "slow/a", "slow/b"}
	sts := []subjects.Stream{"1", "2", ""}
	calls := bkLanes(c, lanes, sts, 60, func(l, i int) []byte { return bkPayload(l, i, 0) }, mixedKinds("build"), nil, "bd")
	tally := bkCheck(t, rec, lanes, calls, bkRules{lates: lates})
	failedLate := 0
	for _, lane := range calls {
		for _, k := range lane {
			err := k.err
			if err == nil {
				err = lates.get(k.id)
			}
			switch {
			case err == nil, bkTimeout(err):
			case errors.Is(err, verdict.ErrActivationFailed):
				failedLate++
			default:
				t.Errorf("%s (%s): %v", k.id, bkKindNames[k.kind], err)
			}
		}
	}
	bkSettled(t, c, n.Host())
	t.Logf("%d builds, %d deliveries failed with theirs; host late %v; %v", builds.Load(), failedLate, n.Host().Stats().LateByReason, tally)
}
