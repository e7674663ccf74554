package hub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/internal/meshtrace"

	"github.com/natsmesh/natsmesh/internal/plant"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// errActivationGone: the activation was collected between lookup and enqueue;
// the intake looks it up again.
var errActivationGone = errors.New("hub: activation collected")

type actState uint8

const (
	stateBuilding actState = iota // factory running; deliveries park
	stateReady                    // hub built; turns run while work is queued
	stateFailed                   // build failed; removed from the host
	stateClosed                   // deactivated; removed from the host
)

// activation is the receiver of one address on this node. It holds no
// goroutine while idle: a turn goroutine runs only while the inbox has work
// and the hub is ready, and a build goroutine only while building.
type activation struct {
	host *Host
	addr subjects.Address

	mu      sync.Mutex
	state   actState
	hub     Hub
	queue   []*entry // inbox: queue[head:] are waiting, in acceptance order
	head    int
	running bool // a turn goroutine is draining the inbox
	// idle, when not nil, is closed (and cleared) when the running turn
	// goroutine stops: waitIdle's signal.
	idle       chan struct{}
	holds      int // explicit holds pin the activation
	lastActive time.Time
	// idleQueued: the activation has an entry on its host's janitor
	// agenda (idleQueue). Guarded by the host's mu, not by mu.
	idleQueued bool
	building   bool // the build goroutine has not returned: deactivate waits for it
	done       bool // deactivate ran
	// finished: deactivate returned (the hub deactivated, the claim
	// released); waitDeactivated, waitFinished.
	finished event
	// removed: Deactivate took it out of the host's map (waitRemoved).
	removed event
	// prev is the address's previous activation on this node, stood down
	// under a turn that may still run: build waits until it finished
	// (waitFinished) before it builds this one.
	prev    *activation
	claim   ClaimToken // the claim this activation holds (zero without Claims)
	failure error      // why the build failed (stateFailed): the activation-failed verdict

	stateHandle *State // durable state, once LoadState took it over (state.go)

	lanes map[laneID]*laneState // windowed lanes' positions (lanes.go)

	readOnly map[string]bool // delivery types the hub marks read-only (readonly.go); set before Ready

	reentrant bool                     // the hub lets requests of its own call chain in (chain.go); set before Ready
	current   atomic.Pointer[turnInfo] // the exclusive turn running, for reentrancy
}

// enqueue puts e in the inbox, or refuses it (full inbox, activation gone).
//
// With startTurn false the caller starts the turn itself (kick) once it has
// answered the delivery: the reply does not wait behind the start of a
// goroutine.
func (a *activation) enqueue(e *entry, startTurn bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch a.state {
	case stateFailed:
		return verdict.New(verdict.ReasonActivationFailed, "activation of %s failed", a.addr)
	case stateClosed:
		return errActivationGone
	}
	if err := a.laneCheckLocked(e); err != nil {
		return err
	}
	if e.Chain.Has(a.addr) {
		if err := a.cycleLocked(e); err != nil {
			return err
		}
		a.lastActive = a.host.cfg.Clock.Now()
		a.laneAdvanceLocked(e, a.lastActive)
		return nil // runs at once, beside the waiting turn (runReentrant)
	}
	if len(a.queue)-a.head >= a.host.cfg.InboxSize {
		return verdict.New(verdict.ReasonInboxFull, "inbox of %s is full (%d deliveries)", a.addr, a.host.cfg.InboxSize)
	}
	if e.seq == 1 {
		// An epoch starts: grant its lane its part of what the inbox has
		// room for — half the free room, shared with the other lanes the
		// activation knows (each is granted its own part when its epoch
		// starts), so that the lanes together are granted at most that.
		free := a.host.cfg.InboxSize - (len(a.queue) - a.head) - 1
		lanes := len(a.lanes)
		if _, known := a.lanes[laneOf(e)]; !known {
			lanes++
		}
		e.grant = max(1, min(a.host.cfg.LaneWindow, free/(2*lanes)))
	}
	if a.head > 0 && a.head == len(a.queue) {
		clear(a.queue)
		a.queue, a.head = a.queue[:0], 0
	}
	a.queue = append(a.queue, e)
	a.lastActive = a.host.cfg.Clock.Now()
	a.laneAdvanceLocked(e, a.lastActive)
	if startTurn {
		a.startTurnLocked()
	}
	return nil
}

// kick starts a turn if one is due (see enqueue).
func (a *activation) kick() {
	a.mu.Lock()
	a.startTurnLocked()
	a.mu.Unlock()
}

// startTurnLocked starts a turn goroutine if the hub is ready, work is
// queued and none runs. Called with a.mu held.
func (a *activation) startTurnLocked() {
	if a.state != stateReady || a.running || a.head == len(a.queue) {
		return
	}
	a.running = true
	a.host.wg.Add(1)
	go a.turns()
}

// waitIdle blocks until no turn goroutine runs on a (at once if none
// does).
func (a *activation) waitIdle() {
	for {
		a.mu.Lock()
		if !a.running {
			a.mu.Unlock()
			return
		}
		if a.idle == nil {
			a.idle = make(chan struct{})
		}
		ch := a.idle
		a.mu.Unlock()
		<-ch
	}
}

// turns handles queued deliveries one at a time until the inbox is empty.
func (a *activation) turns() {
	defer a.host.wg.Done()
	for {
		a.mu.Lock()
		if a.state != stateReady || a.head == len(a.queue) {
			a.running = false
			if a.idle != nil {
				close(a.idle)
				a.idle = nil
			}
			a.lastActive = a.host.cfg.Clock.Now()
			if a.head == len(a.queue) && cap(a.queue) > 64 {
				a.queue, a.head = nil, 0 // give a burst's memory back
			}
			closed := a.state == stateClosed
			a.mu.Unlock()
			if closed {
				// Closed under a running turn (which Close may have
				// stopped waiting for): the last turn deactivates.
				a.deactivate()
			}
			return
		}
		hub := a.hub
		if a.readOnlyLocked(a.queue[a.head]) {
			a.mu.Unlock()
			a.readTurns(hub)
			continue
		}
		if b, ok := hub.(Batcher); ok && len(a.queue)-a.head > 1 && !a.readOnlyLocked(a.queue[a.head+1]) {
			n := 0 // the exclusive deliveries at the head, up to MaxBatch
			for n < MaxBatch && a.head+n < len(a.queue) && !a.readOnlyLocked(a.queue[a.head+n]) {
				n++
			}
			batch := make([]*entry, n)
			copy(batch, a.queue[a.head:a.head+n])
			clear(a.queue[a.head : a.head+n])
			a.head += n
			a.mu.Unlock()
			a.handleBatch(b, batch)
			continue
		}
		if plant.On(plant.ReorderLane) && len(a.queue)-a.head >= 2 {
			last := len(a.queue) - 1
			a.queue[a.head], a.queue[last] = a.queue[last], a.queue[a.head]
		}
		e := a.queue[a.head]
		a.queue[a.head] = nil
		a.head++
		a.mu.Unlock()
		a.turn(hub, e)
	}
}

// handle runs one turn of e, which passed the serving gate at gated. A
// panicking handler fails the delivery, not the node.
func (a *activation) handle(hub Hub, e *entry, gated time.Time) {
	h := a.host
	d := &e.Delivery
	d.claim = a.claimToken()
	ctx := h.ctx
	var span trace.Span // nil: tracing off
	if h.tracer != nil {
		ctx, span = h.startTurn(d)
	}
	ctx, ti := e.turnContext(ctx, a.addr)
	defer ti.ended.Store(true) // a ctx kept past the turn carries no chain (ChainOf)
	if !e.reentrant && !a.readOnly[d.Type] {
		a.setCurrent(ti)
		defer a.setCurrent(nil)
	}
	if err := h.regate(gated); err != nil {
		if span != nil {
			meshtrace.End(span, err)
		}
		h.failTaken(e, err)
		return
	}
	start := time.Now() // real clock: the turn-duration metric measures real time
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("handler panic: %v", r)
				h.log.Error("hub handler panicked", "address", string(a.addr), "id", d.ID, "panic", r)
			}
		}()
		return hub.Handle(ctx, d)
	}()
	h.turns.Observe(time.Since(start))
	if span != nil {
		meshtrace.End(span, err)
	}
	h.handled.Add(1)
	if d.expectResponse && d.responded.CompareAndSwap(false, true) {
		var rerr error
		if sv := stateVerdict(err, h.nodeID); sv != nil {
			rerr = sv // nothing persisted: resendable (state.go)
		} else if err != nil {
			rerr = handlerVerdict(err)
		}
		if serr := h.sendResponse(d, rerr, nil); serr != nil {
			h.log.Warn("response not sent", "id", d.ID, "err", serr)
		}
		return
	}
	if err != nil {
		h.log.Warn("hub handler failed", "address", string(a.addr), "id", d.ID, "type", d.Type, "err", err)
	}
}

// handleBatch runs one turn of a Batcher over several deliveries, each
// settled as handle settles one: a delivery the hub did not respond to
// gets an empty response, or the batch's error.
func (a *activation) handleBatch(b Batcher, batch []*entry) {
	h := a.host
	gated := h.cfg.Clock.Now()
	if err := h.serving(); err != nil {
		for _, e := range batch {
			h.fail(e, err)
		}
		return
	}
	ds := make([]*Delivery, 0, len(batch))
	took := make([]*entry, 0, len(batch))
	for _, e := range batch {
		if e.taken.CompareAndSwap(false, true) {
			ds = append(ds, &e.Delivery)
			took = append(took, e)
		}
	}
	if len(ds) == 0 {
		return
	}
	ctx := h.ctx
	var span trace.Span // nil: tracing off
	if h.tracer != nil {
		ctx, span = h.startBatchTurn(ds)
	}
	ctx, ti := withTurn(ctx, a.addr, ds...)
	defer ti.ended.Store(true) // a ctx kept past the turn carries no chain (ChainOf)
	a.setCurrent(ti)
	defer a.setCurrent(nil)
	if err := h.regate(gated); err != nil {
		if span != nil {
			meshtrace.End(span, err)
		}
		for _, e := range took {
			h.failTaken(e, err)
		}
		return
	}
	start := time.Now() // real clock: the turn-duration metric measures real time
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("handler panic: %v", r)
				h.log.Error("hub batch handler panicked", "address", string(a.addr), "deliveries", len(ds), "panic", r)
			}
		}()
		return b.HandleBatch(ctx, ds)
	}()
	h.turns.Observe(time.Since(start))
	if span != nil {
		meshtrace.End(span, err)
	}
	h.handled.Add(int64(len(ds)))
	var rerr error
	if sv := stateVerdict(err, h.nodeID); sv != nil {
		rerr = sv
	} else if err != nil {
		rerr = handlerVerdict(err)
		h.log.Warn("hub batch handler failed", "address", string(a.addr), "deliveries", len(ds), "err", err)
	}
	for _, d := range ds {
		if d.expectResponse && d.responded.CompareAndSwap(false, true) {
			if serr := h.sendResponse(d, rerr, nil); serr != nil {
				h.log.Warn("response not sent", "id", d.ID, "err", serr)
			}
		}
	}
}

// build runs the factory; deliveries accepted meanwhile stay parked.
func (a *activation) build(f Factory) {
	h := a.host
	defer h.wg.Done()
	if p := a.prev; p != nil {
		// Its last turn returns, then it deactivates (its hub's
		// Deactivate, its claim released): only then may this one load
		// the address's state and run turns.
		p.waitFinished()
		a.prev = nil
	}
	var ro map[string]bool // the hub's read-only delivery types
	var reentrant bool
	hub, err := func() (hub Hub, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("factory panic: %v", r)
			}
		}()
		hub, err = f(context.WithValue(h.ctx, activationKey{}, a), a.addr)
		if r, ok := hub.(Reentrant); ok && err == nil {
			reentrant = r.Reentrant()
		}
		if r, ok := hub.(ReadOnly); ok && err == nil {
			for _, t := range r.ReadOnlyTypes() {
				if ro == nil {
					ro = map[string]bool{}
				}
				ro[t] = true
			}
		}
		return hub, err
	}()
	if err == nil && hub == nil {
		err = fmt.Errorf("factory returned a nil hub")
	}
	a.mu.Lock()
	a.building = false
	if a.state != stateBuilding { // closed while building
		a.hub = hub
		a.mu.Unlock()
		// Whoever closed it could not deactivate a hub still being
		// built (however long the build outlived Close): do it now.
		a.deactivate()
		return
	}
	if err != nil {
		ferr := &verdict.Error{Reason: verdict.ReasonActivationFailed, Message: fmt.Sprintf("build of %s failed: %v", a.addr, err), Node: h.nodeID}
		a.state, a.failure = stateFailed, ferr
		parked := a.takeQueueLocked()
		a.mu.Unlock()
		h.mu.Lock()
		if h.activations[a.addr] == a {
			delete(h.activations, a.addr)
		}
		h.mu.Unlock()
		h.log.Warn("hub build failed", "address", string(a.addr), "parked", len(parked), "err", err)
		for _, e := range parked {
			h.fail(e, ferr)
		}
		a.deactivate()
		return
	}
	a.hub = hub
	a.readOnly, a.reentrant = ro, reentrant
	a.state = stateReady
	a.lastActive = a.host.cfg.Clock.Now()
	a.startTurnLocked()
	a.mu.Unlock()
}

// isClosed reports whether the activation was closed or failed.
func (a *activation) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state == stateClosed || a.state == stateFailed
}

// standDown removes the activation from its host because it cannot persist
// its state (state.go): it accepts nothing more; what it had queued fails
// late with a resendable not-the-owner verdict; its hub is deactivated and
// its claim released once no turn runs (by the running turn itself, if
// any: standDown is called from a turn).
func (a *activation) standDown(cause error) {
	h := a.host
	h.mu.Lock()
	if h.activations[a.addr] == a {
		delete(h.activations, a.addr)
		h.retiring[a.addr] = a // this very turn still runs
	}
	h.mu.Unlock()
	h.log.Warn("activation stands down: its state cannot be persisted", "address", string(a.addr), "err", cause)
	a.retire(cause.Error())
}

// retire ends an activation already removed from its host that is no
// longer the address's owner: what it had queued fails late with a
// resendable not-the-owner verdict (why says what happened), and its hub is
// deactivated and its claim released once no turn runs — by the running
// turn itself when it returns, if one runs. It never waits for a turn.
func (a *activation) retire(why string) {
	h := a.host
	a.close(&verdict.Error{Reason: verdict.ReasonNotOwner, Message: fmt.Sprintf("activation %s on %s stood down before handling: %s", a.addr, h.nodeID, why), Node: h.nodeID})
	a.mu.Lock()
	idle := !a.running
	a.mu.Unlock()
	if idle {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			a.deactivate()
		}()
	}
}

// takeQueueLocked empties the inbox and returns what was waiting.
func (a *activation) takeQueueLocked() []*entry {
	out := append([]*entry(nil), a.queue[a.head:]...)
	a.queue, a.head = nil, 0
	return out
}

// close marks the activation closed and fails everything still queued.
func (a *activation) close(err error) {
	a.mu.Lock()
	if a.state != stateFailed {
		a.state = stateClosed
	}
	parked := a.takeQueueLocked()
	a.mu.Unlock()
	for _, e := range parked {
		a.host.fail(e, err)
	}
}

// idleSince reports whether the activation is ready, unpinned, has no work
// and was last active before t. Called with a.mu held.
func (a *activation) idleSince(t time.Time) bool {
	if a.state != stateReady || a.running || a.holds != 0 || a.head != len(a.queue) || !a.lastActive.Before(t) {
		return false
	}
	if p, ok := a.hub.(Pinner); ok && p.Pinned() {
		return false
	}
	return true
}

// setCurrent records the exclusive turn running (nil: none).
func (a *activation) setCurrent(t *turnInfo) { a.current.Store(t) }

// claimToken returns the claim the activation holds.
func (a *activation) claimToken() ClaimToken {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.claim
}

// handlerVerdict is the response verdict of a handler's error. A handler
// that returns a terminal verdict of its own (e.g. verdict.New with
// verdict.ReasonBadRequest for input it refuses) keeps its reason and
// message; any other error, including a resendable verdict — the handler
// ran, so "nothing held" would not be true — is handler-error with the
// error's text.
func handlerVerdict(err error) *verdict.Error {
	var ve *verdict.Error
	if errors.As(err, &ve) && ve.Reason != verdict.ReasonUnknown && !verdict.IsTransient(ve) {
		msg := ve.Message
		if ve != err {
			// Wrapped: keep the handler's context, said once.
			msg = strings.Replace(err.Error(), ve.Error(), ve.Message, 1)
		}
		return &verdict.Error{Reason: ve.Reason, Message: msg}
	}
	return &verdict.Error{Reason: verdict.ReasonHandlerError, Message: err.Error()}
}
