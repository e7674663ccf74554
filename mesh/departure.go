package mesh

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// A delivery's verdict follows from two facts — was a leg of it sent, was it
// accepted — never from which goroutine noticed an event first (DESIGN §3,
// §4). Each delivery the client works on is a flight: its phase records
// those facts, and it is indexed by the owner generation it is addressed to
// (or that accepted it) only while it is in flight. An event (the owner's
// departure, this client's link dropping, this client closing) is recorded
// on the flight under its lock and wakes it; the goroutine working on the
// flight decides its verdict under the same lock, from the phase it is in
// and the first event recorded. So a departure, the caller's deadline, the
// client closing and the in-flight slot cap reach one verdict for one set of
// facts:
//
//	phase                          departure        link drop        closing
//	waiting (slot, back-off)       departed (retry) —                closing
//	sent (leg in flight)           departed (retry) disconnected     closing
//	accepted (response awaited)    outcome unknown  outcome unknown  outcome unknown
//
// where "outcome unknown" is the resendable fact itself for an Idempotent
// delivery. The caller's deadline while waiting is verdict.ErrDeadlineUnsent
// (resendable, nothing was sent); while sent or accepted it is a timeout.

// phase is what the sender knows happened to a delivery's current attempt.
type phase uint8

const (
	phaseWaiting  phase = iota // nothing of this attempt is in flight: waiting for a slot or backing off
	phaseSent                  // a leg is in flight, not answered yet
	phaseAccepted              // a hub accepted it; its response is awaited (Request)
	phaseDone                  // the verdict is decided: later events and answers find nothing
)

// event is something that happened to a flight from outside.
type event uint8

const (
	evNone     event = iota
	evDeparted       // the owner generation departed
	evLinkDrop       // this client's own link dropped
	evClosing        // this client is closing
	evMoved          // the owner's connection moved with the leg in flight or the response awaited (ownerMoved)
)

// flight is one delivery while the client works on it. Safe for concurrent
// use; every field after mu is guarded by it.
type flight struct {
	id         string
	idempotent bool
	request    bool // a Request: its response is awaited after acceptance

	mu sync.Mutex
	// use counts the flight's lives (a plain delivery's flight is pooled:
	// getFlight, putFlight). It changes only after the flight left the
	// index for the last time, so a snapshot of the index (under c.fl.mu)
	// reads it race-free, and an event applied from a snapshot (under
	// f.mu) finds out whether the flight was released and reused since:
	// then the event is not its own and is dropped (flightRef).
	use    uint64
	phase  phase
	node   subjects.NodeID // the owner addressed (waiting, sent) or the node that accepted it (accepted)
	ev     event           // the first event since the phase's wait began
	evText string          // how the event happened, for the error text
	evErr  error           // evMoved's verdict
	evAt   time.Time       // when ev was recorded (monotonic)
	// timeout: the leg's deadline passed before any event was recorded
	// (timedOut). The timeout is then this attempt's fact: events recorded
	// after it do not change the leg's verdict.
	timeout bool
	wake    chan struct{} // closed (once: woken) when ev is recorded or an answer arrives
	woken   bool
	backoff bool // the wait is a retry back-off (not a slot)
	cancel  context.CancelFunc
	early   []*nats.Msg // answers that overtook the acceptance (answers.go), unverified
	ans     *answer     // the genuine response or late verdict that arrived for it
	ansUsed bool        // ans is the verdict
}

// flightPool recycles the flights of plain deliveries (Client.run), each
// with its wake channel while that was not closed: a flight is put back
// once its delivery's verdict is decided and it left the index for the last
// time, so only a snapshot of the index taken before can still reach it,
// and flightRef.lock turns that away (use). A Request's flight is not
// pooled: its delivery ID stays in the pending map and answers may find it
// after its call returned.
var flightPool = sync.Pool{New: func() any { return new(flight) }}

// getFlight returns a fresh flight for plain delivery d.
func getFlight(d *Delivery) *flight {
	f := flightPool.Get().(*flight)
	f.id, f.idempotent = d.ID, d.Idempotent
	return f
}

// putFlight gives back a flight of getFlight whose delivery is decided and
// that is no longer indexed; it must not be used afterwards.
func putFlight(f *flight) {
	f.retire()
	flightPool.Put(f)
}

// retire ends f's life: it clears f for its next one and counts the life.
func (f *flight) retire() {
	f.mu.Lock()
	wake := f.wake
	if f.woken {
		wake = nil // closed: address would replace it anyway
	}
	use := f.use + 1
	f.id, f.idempotent, f.request = "", false, false
	f.phase, f.node, f.ev, f.evText, f.evErr, f.woken, f.backoff, f.cancel = phaseWaiting, subjects.NodeID{}, evNone, "", nil, false, false, nil
	f.evAt, f.timeout = time.Time{}, false
	f.early, f.ans, f.ansUsed = nil, nil, false
	f.wake, f.use = wake, use
	f.mu.Unlock()
}

// answer is a response or late verdict that reached a Request. node is the
// generation that sent it ("name.gen"): answer-binding compares it with the
// flight's accepting node.
type answer struct {
	payload []byte
	err     error
	node    string
}

// flights indexes the client's flights by owner generation. It is no
// store of liveness: whether a generation is gone is the cluster view's
// (ClusterView). Safe for concurrent use.
type flights struct {
	mu     sync.Mutex
	byNode map[subjects.NodeID]map[*flight]struct{}
	spare  map[*flight]struct{} // an emptied set, reused by the next generation indexed (no map per delivery)
}

func newFlights() flights {
	return flights{byNode: map[subjects.NodeID]map[*flight]struct{}{}}
}

// address starts a wait of f in phase p addressed to node: it indexes f
// under node, with a fresh wake channel and no event, and records at once
// that this client is closing, or — if checkGone — that the cluster view
// knows node gone.
func (c *Client) address(f *flight, node subjects.NodeID, p phase, checkGone bool) {
	c.fl.mu.Lock()
	set := c.fl.byNode[node]
	if set == nil {
		if set = c.fl.spare; set != nil {
			c.fl.spare = nil
		} else {
			set = map[*flight]struct{}{}
		}
		c.fl.byNode[node] = set
	}
	set[f] = struct{}{}
	// Asked under fl.mu: a departure the view learns after this answer
	// is told by failNode, whose scan of the index then finds f.
	gone := checkGone && c.opts.view.Gone(node)
	f.mu.Lock()
	c.fl.mu.Unlock()
	f.phase, f.node, f.ev, f.evText, f.evErr, f.cancel, f.backoff = p, node, evNone, "", nil, nil, false
	f.evAt, f.timeout = time.Time{}, false
	if f.wake == nil || f.woken {
		f.wake = make(chan struct{}) // an unclosed one serves again
	}
	f.woken = false
	if gone {
		f.recordLocked(evDeparted, "known gone")
	}
	if c.shut.Load() {
		f.recordLocked(evClosing, "")
	}
	f.mu.Unlock()
}

// unindex removes f from the index.
func (c *Client) unindex(f *flight) {
	f.mu.Lock()
	node := f.node
	f.mu.Unlock()
	c.fl.mu.Lock()
	if set := c.fl.byNode[node]; set != nil {
		delete(set, f)
		if len(set) == 0 {
			delete(c.fl.byNode, node)
			c.fl.spare = set
		}
	}
	c.fl.mu.Unlock()
}

// recordLocked records ev unless an event or the verdict came first, wakes
// the flight and cancels its leg. Called with f.mu held.
func (f *flight) recordLocked(ev event, how string) {
	if f.phase == phaseDone || f.timeout || f.ev != evNone && (f.ev != evMoved || ev == evMoved) {
		return // a move gives way to a departure, a link drop or closing; a timeout to nothing
	}
	if ev == evLinkDrop && f.phase == phaseWaiting {
		return // nothing of it is in flight: it is sent after the reconnect
	}
	// Real clock: evAt is compared with a leg timer's fire time and a
	// context's deadline, which are real.
	f.ev, f.evText, f.evAt = ev, how, time.Now()
	f.wakeLocked()
	if f.cancel != nil {
		f.cancel()
	}
}

// timedOut records that the leg in flight reached its deadline at fired
// (the leg timer's fire time, or the caller's deadline), unless an event
// was recorded on f before that moment, and reports whether the timeout
// is the attempt's fact. Which of the two came first decides the leg's
// verdict, not which goroutine noticed first (DESIGN §3): an owner that
// departed after the deadline had passed does not make a timed-out leg —
// which it may hold — resendable.
func (f *flight) timedOut(fired time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ev != evNone && !f.evAt.After(fired) {
		return false // the event came first: its verdict stands
	}
	f.timeout = true
	return true
}

// wakeLocked closes f.wake once. Called with f.mu held.
func (f *flight) wakeLocked() {
	if f.wake != nil && !f.woken {
		f.woken = true
		close(f.wake)
	}
}

// causeLocked is the verdict of the recorded event in the current phase, or
// nil if none was recorded. Called with f.mu held.
func (f *flight) causeLocked() error {
	var err error
	switch f.ev {
	case evNone:
		return nil
	case evDeparted:
		err = departedError(f.node, f.evText)
	case evLinkDrop:
		err = fmt.Errorf("own NATS link dropped: %w", nats.ErrDisconnected)
	case evClosing:
		err = verdict.ErrClosing
	case evMoved:
		if f.phase == phaseAccepted {
			return nil // not a failure: the awaited request is re-sent (awaitResponse)
		}
		return f.evErr
	}
	if f.phase != phaseAccepted || f.idempotent {
		return err
	}
	what := map[event]string{evDeparted: "its owner departed", evLinkDrop: "this sender's own link dropped", evClosing: "this client closed"}[f.ev]
	return &verdict.Error{Reason: verdict.ReasonOutcomeUnknown, Node: f.node.String(), Err: err,
		Message: fmt.Sprintf("accepted by %s, then %s before its response: the handler may have run", f.node, what)}
}

func departedError(node subjects.NodeID, how string) error {
	msg := fmt.Sprintf("owner %s departed", node)
	if how != "" {
		msg += " (" + how + ")"
	}
	return &verdict.Error{Reason: verdict.ReasonDeparted, Message: msg, Node: node.String()}
}

// failNode declares generation node gone (crash detected, graceful leave,
// superseded): everything in flight to it that it had not accepted — legs
// in flight, deliveries waiting for a slot or backing off after its refusal
// — gets the departed verdict at once (ShuttingDown, resendable: Deliver
// re-resolves and sends again), and every Request it had accepted whose
// response is awaited fails at once with verdict.ErrOutcomeUnknown (or the
// departed verdict if the delivery is Idempotent) and is never re-sent.
// It is the event; the client remembers nothing of it: flights addressed to
// node later meet the departed verdict at once only if the cluster view
// (WithView) reports node gone — a Node's does, and calls failNode on each
// departure its membership sees. how describes the departure for the error
// text. Safe for concurrent use; calling it twice for one node is harmless.
func (c *Client) failNode(node subjects.NodeID, how string) {
	hit := c.flightsOf(node)
	for _, r := range hit {
		if !r.lock() {
			continue
		}
		if f := r.f; f.node == node {
			f.recordLocked(evDeparted, how)
		}
		r.f.mu.Unlock()
	}
	c.dropHeld(node) // its key can no longer arrive (answers.go)
}

// flightRef is a flight seen in the index, in one of its lives: lock
// applies an event only to that life, never to the delivery that reuses a
// released flight.
type flightRef struct {
	f   *flight
	use uint64
}

// lock locks the flight and reports whether it is still in the life r saw;
// if not, it is unlocked again and the caller must leave it alone.
func (r flightRef) lock() bool {
	r.f.mu.Lock()
	if r.f.use != r.use {
		r.f.mu.Unlock()
		return false
	}
	return true
}

// flightsOf returns the flights indexed under node now. Each may move on
// before the caller locks it (flightRef.lock): check f.node under f.mu.
func (c *Client) flightsOf(node subjects.NodeID) []flightRef {
	c.fl.mu.Lock()
	defer c.fl.mu.Unlock()
	return c.flightsOfLocked(node)
}

// flightsOfLocked is flightsOf with c.fl.mu held.
func (c *Client) flightsOfLocked(node subjects.NodeID) []flightRef {
	set := c.fl.byNode[node]
	hit := make([]flightRef, 0, len(set))
	for f := range set {
		hit = append(hit, flightRef{f, f.use})
	}
	return hit
}

// addressedNodes returns the generations flights are indexed under now.
func (c *Client) addressedNodes() []subjects.NodeID {
	c.fl.mu.Lock()
	defer c.fl.mu.Unlock()
	out := make([]subjects.NodeID, 0, len(c.fl.byNode))
	for node := range c.fl.byNode {
		out = append(out, node)
	}
	return out
}

// interruptAll records ev on every flight in flight.
func (c *Client) interruptAll(ev event) {
	c.fl.mu.Lock()
	var hit []flightRef
	for _, set := range c.fl.byNode {
		for f := range set {
			hit = append(hit, flightRef{f, f.use})
		}
	}
	c.fl.mu.Unlock()
	for _, r := range hit {
		if r.lock() {
			r.f.recordLocked(ev, "")
			r.f.mu.Unlock()
		}
	}
}

// countFlights counts the indexed flights for which pred holds (called
// with the flight's lock held): a view for tests and the status report.
func (c *Client) countFlights(pred func(f *flight) bool) int {
	c.fl.mu.Lock()
	defer c.fl.mu.Unlock()
	n := 0
	for _, set := range c.fl.byNode {
		for f := range set {
			f.mu.Lock()
			if pred(f) {
				n++
			}
			f.mu.Unlock()
		}
	}
	return n
}

func (c *Client) waiting() int {
	return c.countFlights(func(f *flight) bool { return f.phase == phaseWaiting && !f.backoff })
}

func (c *Client) backingOff() int {
	return c.countFlights(func(f *flight) bool { return f.phase == phaseWaiting && f.backoff })
}

func (c *Client) awaiting() int {
	return c.countFlights(func(f *flight) bool { return f.phase == phaseAccepted })
}

// failInFlight fails every leg in flight to node with err, which must be
// resendable (the leg is re-sent with the same delivery ID; the receiver
// dedupes), without marking node departed: its connection moved (its server
// shut down, lame duck) and what was in transit may be lost. Deliveries
// waiting for a slot or backing off and awaited responses are left alone.
// Safe for concurrent use.
func (c *Client) failInFlight(node subjects.NodeID, err error) {
	hit := c.flightsOf(node)
	for _, r := range hit {
		if !r.lock() {
			continue
		}
		if f := r.f; f.node == node && f.phase == phaseSent {
			f.evErr = err
			f.recordLocked(evMoved, "")
		}
		r.f.mu.Unlock()
	}
}

// ownerMoved reports that owner generation node's connection moved (its
// NATS server restarted or shut down, lame duck, a reconnect to another
// server: membership.Moved). node keeps its generation and what it
// accepted, but what was in transit to or from it may be lost (DESIGN §6).
// Every leg in flight to it fails with err, which must be resendable (as
// failInFlight: re-sent with the same delivery ID, the receiver dedupes);
// every accepted Request awaiting its response is re-sent to node with the
// same delivery ID, so that node's dedupe answers it with the kept
// response, or with verdict.ErrResponseGone. Deliveries waiting for a slot
// or backing off are left alone. Safe for concurrent use.
func (c *Client) ownerMoved(node subjects.NodeID, err error) {
	hit := c.flightsOf(node)
	for _, r := range hit {
		if !r.lock() {
			continue
		}
		f := r.f
		switch {
		case f.node != node:
		case f.phase == phaseSent:
			f.evErr = err
			f.recordLocked(evMoved, "")
		case f.phase == phaseAccepted && f.request:
			f.evErr = nil
			f.recordLocked(evMoved, "")
		}
		f.mu.Unlock()
	}
}
