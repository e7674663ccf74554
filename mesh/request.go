package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Response is a handler's answer to a Request.
type Response struct {
	Receipt
	Payload []byte
}

// Request delivers d, then waits for the handler's response, correlated by
// delivery ID; the handler answers with hub.Delivery.Respond (or by returning:
// an empty response, or its error as verdict.ErrHandler). Safe for concurrent
// use; two Requests of one client may not share an ID at once (the second
// fails with verdict.ErrBadRequest).
//
// Acceptance and response are two separate facts. The delivery part behaves
// as Deliver (retries only before acceptance). Once accepted, the request is
// re-sent only to the generation that accepted it, and only when that
// generation's connection moves while the response is awaited (a NATS server
// restart or lame duck: the response may be lost in transit; its dedupe
// answers the same delivery ID with the kept response, or fails the request
// with verdict.ErrResponseGone, Failed: the handler ran). Otherwise:
//   - if the response does not come by ctx's deadline (or the request
//     timeout when ctx has none) Request fails with context.DeadlineExceeded
//     — a timeout, Failed, not resendable;
//   - if the accepting owner departs, this client's own link drops or the
//     client closes while the response is awaited, Request fails at once
//     with verdict.ErrOutcomeUnknown (Failed, not resendable), or — for an
//     Idempotent delivery — with the resendable fact itself (the departed
//     verdict, nats.ErrDisconnected, verdict.ErrClosing: ShuttingDown).
//
// In the first two cases the handler may or may not have run: the caller
// must reconcile that execution uncertainty (for instance by making the
// operation idempotent under the delivery ID it chose). A late verdict for
// the delivery (its hub's build failed, or it was deactivated before
// handling) fails the request with that verdict. A response that arrives
// after Request returned is counted in ClientStats.Unmatched and dropped.
func (c *Client) Request(ctx context.Context, d Delivery) (Response, error) {
	if ch, ok := hub.ChainOf(ctx); ok {
		// Sent from a hub's turn: the call chain travels with it, so a
		// cycle is refused at once (verdict.ErrCallCycle) instead of
		// waiting out the deadline (DESIGN §13).
		if len(ch.Addresses) > hub.MaxChain {
			return Response{Receipt: Receipt{ID: d.ID}}, verdict.New(verdict.ReasonBadRequest, "call chain %s is over %d addresses deep", ch.ID, hub.MaxChain)
		}
		d.chain = ch.String()
	}
	if c.opts.tracer != nil {
		return c.requestTraced(ctx, &d)
	}
	return c.requestCounted(ctx, &d)
}

// requestCounted runs Request d and counts its outcome. A ctx without
// deadline is bounded by the request timeout where the call waits (its
// lane, slot and legs in run, the response in awaitResponse), not by
// wrapping ctx: no context and timer per Request on the fast path.
func (c *Client) requestCounted(ctx context.Context, d *Delivery) (Response, error) {
	start := time.Now() // real clock: the deadline bounds network I/O, beside ctx's
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = start.Add(c.opts.requestTimeout)
	}
	resp, err := c.request(ctx, deadline, d)
	c.count(err, start)
	return resp, err
}

func (c *Client) request(ctx context.Context, deadline time.Time, d *Delivery) (Response, error) {
	if err := c.validate(d); err != nil {
		return Response{Receipt: Receipt{ID: d.ID}}, err
	}
	f := &flight{id: d.ID, idempotent: d.Idempotent, request: true}
	c.pendingMu.Lock()
	if c.closing.Load() {
		c.pendingMu.Unlock()
		return Response{Receipt: Receipt{ID: d.ID}}, verdict.ErrClosing
	}
	if _, dup := c.pending[d.ID]; dup {
		c.pendingMu.Unlock()
		return Response{Receipt: Receipt{ID: d.ID}}, verdict.New(verdict.ReasonBadRequest, "a Request with ID %q is already awaiting its response on this client", d.ID)
	}
	c.pending[d.ID] = f
	c.pendingMu.Unlock()
	defer func() {
		// The verdict is decided: an answer arriving from now on matches
		// no pending call.
		f.mu.Lock()
		f.phase = phaseDone
		if f.ans != nil && !f.ansUsed {
			// It came between a leg's failure and the verdict.
			c.unmatched.Add(1)
		}
		for _, m := range f.early { // held for an acceptance that never came
			node, _ := subjects.ParseNodeID(m.Header.Get(verdict.HeaderNode))
			if c.genuine(m, d.ID, node) {
				c.unmatchedAnswer(m, d.ID)
			} else {
				c.forgedAnswer(m, d.ID)
			}
		}
		f.early = nil
		f.mu.Unlock()
		c.pendingMu.Lock()
		if c.pending[d.ID] == f {
			delete(c.pending, d.ID)
		}
		c.pendingMu.Unlock()
	}()
	r, err := c.deliverBy(ctx, deadline, d, f)
	if err != nil {
		return Response{Receipt: r}, err
	}
	defer c.unindex(f)
	return c.awaitResponse(ctx, deadline, d, f, r)
}

// deadlineTimers recycles the timers that bound a wait by a deadline
// (a lane's turn, an in-flight slot, a response) instead of a context per
// wait. Go 1.23 timer semantics: a stopped timer delivers no stale tick
// after Reset.
// They are on the real clock, as the deadlines they wait for.
var deadlineTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// deadlineTimer returns a pooled timer firing at deadline; give it back
// with releaseTimer.
func deadlineTimer(deadline time.Time) *time.Timer {
	t := deadlineTimers.Get().(*time.Timer)
	t.Reset(time.Until(deadline))
	return t
}

func releaseTimer(t *time.Timer) {
	t.Stop()
	deadlineTimers.Put(t)
}

// awaitResponse waits for an accepted Request's response. Its verdict is
// responseVerdict's, from the facts under f.mu when the wait ends: an
// answer that arrived wins; else an event recorded before the deadline
// (outcome unknown, or the resendable fact for an Idempotent delivery);
// else the caller's cancellation; else the deadline (a timeout).
//
// When the accepting owner's connection moves while the response is awaited
// (ownerMoved: a server restart, lame duck), the response may be lost in
// transit: the request is re-sent to the same generation with the same
// delivery ID (resendAwaited), and the owner's dedupe answers it with the
// kept response again, or with verdict.ErrResponseGone — never silence.
func (c *Client) awaitResponse(ctx context.Context, deadline time.Time, d *Delivery, f *flight, r Receipt) (Response, error) {
	var expired <-chan time.Time // deadline, when ctx itself has none
	if _, ok := ctx.Deadline(); !ok {
		t := deadlineTimer(deadline)
		defer releaseTimer(t)
		expired = t.C
	}
	timedOut := false
	for {
		f.mu.Lock()
		wake := f.wake
		f.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
		case <-expired:
			timedOut = true
		}
		f.mu.Lock()
		if f.ans != nil || f.ev != evMoved || ctx.Err() != nil || timedOut {
			break // decided below, under f.mu
		}
		// The owner's connection moved: re-send, then await again.
		f.ev, f.evErr = evNone, nil
		f.wake, f.woken = make(chan struct{}), false
		f.mu.Unlock()
		if err := c.resendAwaitedBy(ctx, deadline, d, f, r.Node); err != nil {
			f.mu.Lock()
			if f.ans == nil {
				f.phase = phaseDone
				f.mu.Unlock()
				return Response{Receipt: r}, fmt.Errorf("mesh: request %s to %s: %w", d.ID, d.To, err)
			}
			f.mu.Unlock() // the answer came meanwhile: it is the fact
		}
	}
	defer f.mu.Unlock()
	fx := responseFacts{answer: f.ans, event: f.causeLocked(), eventAt: f.evAt, ctxErr: ctx.Err(), expired: timedOut, deadline: deadline}
	if dl, ok := ctx.Deadline(); ok {
		fx.deadline = dl
	}
	out, err := responseVerdict(fx)
	f.phase = phaseDone
	f.ansUsed = f.ans != nil
	switch {
	case out == responseAnswered && err == nil:
		return Response{Receipt: r, Payload: f.ans.payload}, nil
	case out == responseTimedOut:
		return Response{Receipt: r}, fmt.Errorf("mesh: request %s to %s accepted by %s, no response: %w", d.ID, d.To, r.Node, err)
	}
	return Response{Receipt: r}, fmt.Errorf("mesh: request %s to %s: %w", d.ID, d.To, err) // a late verdict, an event
}

// resendAwaitedBy is resendAwaited bounded by deadline (rare: only after
// the owner's connection moved, so the context it needs is made here).
func (c *Client) resendAwaitedBy(ctx context.Context, deadline time.Time, d *Delivery, f *flight, node subjects.NodeID) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	return c.resendAwaited(ctx, d, f, node)
}

// dispatchAnswer receives late verdicts and responses on the answer subject.
// An answer is taken only with the token of the generation that accepted the
// delivery (answers.go); one that overtook its acceptance reply is held
// (bounded) until the acceptance names that generation. An answer for a
// pending Request goes to that call only; a genuine one for a Request that
// is no longer pending (or already answered) is counted
// (ClientStats.Unmatched) and dropped; a late verdict of a Deliver goes to
// WithLateVerdicts — held first if it names a generation whose answer key is
// not known yet (answers.go).
func (c *Client) dispatchAnswer(m *nats.Msg) {
	id := m.Header.Get(hub.HeaderID)
	kind := m.Header.Get(hub.HeaderAnswer)
	if kind != hub.AnswerResponse && kind != hub.AnswerVerdict {
		return
	}
	c.pendingMu.Lock()
	f := c.pending[id]
	c.pendingMu.Unlock()
	if f != nil {
		f.mu.Lock()
		switch {
		case f.phase == phaseWaiting || f.phase == phaseSent:
			// Not accepted yet as far as this client knows: hold it until
			// the acceptance names the generation it must come from.
			if len(f.early) < maxEarlyAnswers {
				f.early = append(f.early, m)
				f.mu.Unlock()
				return
			}
			f.mu.Unlock()
			c.forgedAnswer(m, id)
			return
		case !c.genuine(m, id, f.node):
			f.mu.Unlock()
			c.forgedAnswer(m, id)
			return
		case f.phase == phaseAccepted && f.ans == nil:
			f.takeLocked(m)
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		c.unmatchedAnswer(m, id)
		return
	}
	node, perr := subjects.ParseNodeID(m.Header.Get(verdict.HeaderNode))
	if perr == nil && c.gaveUp.has(id, node) {
		c.staleAnswer(m, id)
		return
	}
	if perr == nil && c.keys.get(node) == "" {
		// node's key is not known yet: its acceptance reply may still
		// be on its way (answers.go).
		c.hold(m, node)
		return
	}
	if !c.genuine(m, id, node) {
		c.forgedAnswer(m, id)
		return
	}
	if kind == hub.AnswerResponse || m.Header.Get(hub.HeaderExpectResponse) == "true" {
		c.unmatchedAnswer(m, id)
		return
	}
	if c.holdForLeg(m, id, node) {
		return // its leg to node is still in flight: the leg's outcome decides
	}
	if _, err := verdict.Decode(m.Header); err != nil {
		c.lateVerdicts.Add(1)
		if c.opts.tracer != nil {
			c.traceLate(m, id, err)
		}
		if f := c.opts.onLate; f != nil {
			f(LateVerdict{ID: id, Err: err})
		} else {
			c.log.Warn("late verdict for a delivery", "id", id, "err", err)
		}
	}
}

// holdForLeg holds genuine late verdict m of plain delivery id from node
// while a leg of id to node is in flight and not yet accepted (its reply
// lost, late, or overtaken by the answer: they travel on different
// subscriptions), in that flight's early answers: the leg's outcome decides
// it (legDone: reported if node accepts the leg or it times out, dropped as
// stale if the leg is abandoned or refused) — a generation whose leg the
// sender gave up on, and that another generation then accepted, must not
// answer the delivery (DESIGN §5). It reports whether m was held (or, past
// maxEarlyAnswers, dropped). It scans node's flights: only genuine answers
// that match no Request reach it, which are rare.
func (c *Client) holdForLeg(m *nats.Msg, id string, node subjects.NodeID) bool {
	var f *flight
	c.fl.mu.Lock()
	for g := range c.fl.byNode[node] {
		if g.id == id { // stable while g is indexed (flight.use)
			f = g
			break
		}
	}
	c.fl.mu.Unlock()
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.id != id || f.request || f.node != node || (f.phase != phaseWaiting && f.phase != phaseSent) {
		return false // settled (or reused) meanwhile: judged as any late answer
	}
	if len(f.early) >= maxEarlyAnswers {
		c.forgedAnswer(m, id)
		return true
	}
	f.early = append(f.early, m)
	return true
}

// settleEarlyLocked decides the answers a plain delivery's flight held
// while its leg to node was in flight (holdForLeg), now that the leg
// ended: report (accepted by node, or timed out: node may hold it) or drop
// as stale (abandoned, refused, no responders). Called with f.mu held;
// reported answers are dispatched again on another goroutine, once the
// flight is settled.
func (c *Client) settleEarlyLocked(f *flight, report bool) {
	if f.request || len(f.early) == 0 {
		return
	}
	early := f.early
	f.early = nil
	if !report {
		for _, m := range early {
			c.staleAnswer(m, f.id)
		}
		return
	}
	go func() {
		for _, m := range early {
			c.dispatchAnswer(m)
		}
	}()
}

// unmatchedAnswer counts a genuine answer that matches no pending call.
func (c *Client) unmatchedAnswer(m *nats.Msg, id string) {
	c.unmatched.Add(1)
	c.log.Debug("answer matched no pending request", "id", id, "answer", m.Header.Get(hub.HeaderAnswer), "node", m.Header.Get(verdict.HeaderNode))
}

// takeLocked makes genuine answer m the flight's answer and wakes it.
// Called with f.mu held.
func (f *flight) takeLocked(m *nats.Msg) {
	node, err := verdict.Decode(m.Header)
	if m.Header.Get(hub.HeaderAnswer) == hub.AnswerVerdict && err == nil {
		err = &verdict.Error{Reason: verdict.ReasonBadRequest, Message: "late verdict without a failure", Node: node}
	}
	f.ans = &answer{payload: m.Data, err: err, node: node}
	f.wakeLocked()
}

// takeEarlyLocked checks the answers held for f against node's answer key:
// the first genuine one becomes its answer; forgeries are counted; genuine
// extras are unmatched. It reports whether f has an answer. Called with
// f.mu held.
func (c *Client) takeEarlyLocked(f *flight, node subjects.NodeID) bool {
	early := f.early
	f.early = nil
	for _, m := range early {
		switch {
		case !c.genuine(m, f.id, node):
			c.forgedAnswer(m, f.id)
		case f.ans == nil:
			f.takeLocked(m)
		default:
			c.unmatchedAnswer(m, f.id)
		}
	}
	return f.ans != nil
}

// resendAwaited re-sends accepted Request d to node, the generation that
// accepted it, after node's connection moved while d's response was
// awaited (DESIGN §6 "in transit when a connection moves"). It carries the
// same delivery ID and no lane position (a duplicate is answered from the
// owner's dedupe before any sequence check): the owner answers Accepted
// and sends the kept response again (or, still queued or running, sends it
// when it is ready), or verdict.ErrResponseGone. Until the owner is back on
// its subject (no responders) it retries, 50 ms doubling to 1 s.
//
// It returns nil to go on awaiting — the re-send was accepted, or it timed
// out (the owner may be slow; its response may still come), or an answer or
// an event (departure, own link drop, closing, another move) was recorded
// meanwhile, or ctx ended — and otherwise the request's verdict: the
// owner's terminal answer (verdict.ErrResponseGone: the handler ran, its
// response is no longer kept; a late failure it recorded for d). A
// resendable refusal (the owner is fenced or draining) goes on awaiting:
// its departure, if it comes, decides.
func (c *Client) resendAwaited(ctx context.Context, d *Delivery, f *flight, node subjects.NodeID) error {
	wait := 50 * time.Millisecond
	for {
		reply, err := c.resendLeg(ctx, d, f, node)
		accepted := false
		if err == nil {
			_, verr := decodeReply(reply)
			accepted = verr == nil
		}
		f.mu.Lock()
		if accepted && f.ans != nil && f.ans.err != nil && verdict.IsResendable(f.ans.err) {
			// A late refusal ("not handled": resendable) came while this
			// re-send was out. It may answer the earlier acceptance, which
			// node forgot when it refused it — and then node accepted this
			// re-send afresh and will handle it: reporting the refusal
			// would say "safe to send again" of a delivery that runs. So
			// it is not the verdict: the answer of this acceptance is
			// awaited, and if none comes the deadline's timeout says the
			// outcome is unknown (found by the nemesis: a lame-duck move
			// and a stand-down at once).
			c.stale.Add(1)
			c.log.Debug("late refusal set aside: the re-send was accepted again", "id", d.ID, "node", node.String(), "err", f.ans.err)
			f.ans = nil
			if f.ev == evNone {
				f.wake, f.woken = make(chan struct{}), false
			}
		}
		wake, decided := f.wake, f.ans != nil || f.ev != evNone
		f.mu.Unlock()
		if decided || ctx.Err() != nil {
			return nil
		}
		switch {
		case err == nil:
			if _, verr := decodeReply(reply); verr != nil && !verdict.IsResendable(verr) {
				return verr
			}
			return nil
		case !errors.Is(err, nats.ErrNoResponders):
			return nil // a timeout: the response may still come
		}
		select { // not back on its subject yet
		case <-c.opts.clock.After(wait):
		case <-wake:
			return nil
		case <-ctx.Done():
			return nil
		}
		wait = min(2*wait, time.Second)
	}
}

// resendLeg sends one re-send of accepted Request d to node and waits for
// its reply (bounded by the leg timeout and ctx); an event recorded on f
// meanwhile cancels the wait. It holds an in-flight slot while the leg is
// out.
func (c *Client) resendLeg(ctx context.Context, d *Delivery, f *flight, node subjects.NodeID) (*nats.Msg, error) {
	f.mu.Lock()
	wake := f.wake
	f.mu.Unlock()
	select {
	case c.sem <- struct{}{}:
	case <-wake:
		return nil, errResendStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.sem }()
	legEnd := time.Now().Add(c.opts.legTimeout) // real clock: bounds a NATS request
	if dl, ok := ctx.Deadline(); ok && dl.Before(legEnd) {
		legEnd = dl
	}
	legCtx, cancel := context.WithDeadline(ctx, legEnd)
	defer cancel()
	f.mu.Lock()
	if f.woken {
		f.mu.Unlock()
		return nil, errResendStopped
	}
	f.cancel = cancel
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.cancel = nil
		f.mu.Unlock()
	}()
	msg := &nats.Msg{Subject: c.cfg.Prefix.Delivery(node, d.To, d.Stream), Data: d.Payload, Header: make(nats.Header, 6)}
	h := msg.Header
	h[hub.HeaderID] = []string{d.ID}
	h[hub.HeaderAnswerTo] = []string{c.answerTo()}
	h[hub.HeaderExpectResponse] = []string{"true"}
	if d.Type != "" {
		h[hub.HeaderType] = []string{d.Type}
	}
	if d.From != "" {
		h[hub.HeaderFrom] = []string{string(d.From)}
	}
	if d.caller != "" {
		h[hub.HeaderCaller] = []string{d.caller}
	}
	if c.opts.tracer != nil {
		meshtrace.Inject(ctx, h)
	}
	w := c.replies.register()
	defer c.replies.forget(w)
	msg.Reply = w.subject
	c.observeInFlight(c.inFlight.Add(1))
	defer func() { c.observeInFlight(c.inFlight.Add(-1)) }()
	if err := c.cfg.Conn.PublishMsg(msg); err != nil {
		return nil, err
	}
	c.resent.Add(1)
	select {
	case reply := <-w.ch:
		if reply.Header.Get("Status") == "503" && len(reply.Data) == 0 {
			return nil, nats.ErrNoResponders
		}
		return reply, nil
	case <-legCtx.Done():
		return nil, legCtx.Err()
	}
}

// errResendStopped: an event or answer was recorded before the re-send
// left.
var errResendStopped = errors.New("mesh: re-send stopped by an event")

// timedOut reports whether err is a leg's timeout (DESIGN §3: the callee
// may hold it), not the caller's cancellation.
func timedOut(err error) bool {
	return !errors.Is(err, context.Canceled) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}
