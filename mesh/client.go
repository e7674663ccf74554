package mesh

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/histo"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Delivery is what a sender sends. To is required; everything else is
// optional.
type Delivery struct {
	// ID is unique per delivery and kept across its retries: 1-128 bytes
	// of printable ASCII without spaces (NATS trims whitespace in header
	// values, so anything else would merge IDs); empty means a fresh
	// 128-bit random ID from crypto/rand (22 characters of base64url),
	// which no other caller can predict.
	// Any other ID fails with verdict.ErrInvalidID before anything is sent.
	ID string
	// From is the sending address, if the sender is itself a hub.
	From subjects.Address
	// To is the destination address.
	To subjects.Address
	// Stream orders deliveries inside To: one lane per (To, Stream).
	Stream subjects.Stream
	// Type is an application-defined tag (at most 256 bytes).
	Type string
	// Payload is opaque bytes, limited by the server's max_payload.
	Payload []byte
	// Idempotent says the handler may safely run twice under one ID. It
	// decides the verdict of a Request whose response is lost after
	// acceptance (its owner departed, this sender's link dropped, this
	// client closed): the resendable fact itself (ShuttingDown) for an
	// idempotent delivery, else Failed with verdict.ErrOutcomeUnknown. An
	// awaited Request is re-sent automatically either way only when the
	// generation that accepted it is still live and its connection moved
	// (see Client.Request).
	Idempotent bool

	// caller is the outside caller the ingress forwards for
	// (hub.HeaderCaller); empty for the process's own deliveries.
	caller string
	// reminder and due make the delivery a reminder's fire
	// (hub.HeaderReminder, hub.HeaderReminderDue); set only by the
	// node's reminder runner.
	reminder, due string
	// chain is the call chain of a Request sent from a hub's turn
	// (hub.HeaderChain); empty otherwise.
	chain string
	// placer, if set, is asked when an attempt first finds no live node
	// hosting the kind; false fails the delivery at once with that
	// verdict instead of waiting for placement (the ingress's bounded
	// placement waits, ingress_fair.go).
	placer placer
}

// placer decides whether a delivery may wait for placement (Delivery's
// placer).
type placer interface{ unplaced() bool }

// Receipt is the outcome of an accepted delivery.
type Receipt struct {
	ID       string
	Node     subjects.NodeID // the node generation that accepted it
	Attempts int             // attempts made, 1..MaxRetries+1
}

// Client sends deliveries (DESIGN §4). It is safe for concurrent use.
type Client struct {
	cfg  Config
	opts options
	log  *slog.Logger
	// id is the client's identity and answerTo its answer subject,
	// <prefix>.ans.<name>.<gen>; a node's client takes each new session's
	// (bindIdentity). Read per leg.
	id atomic.Pointer[identity]

	nuid         idSource      // delivery IDs
	sem          chan struct{} // legs in flight
	inFlight     atomic.Int64
	peakInFlight atomic.Int64
	sat          saturation

	lanesMu     sync.Mutex
	lanes       map[LaneKey]*lane
	epochPrefix string        // random, names this client's lane epochs
	epochs      atomic.Uint64 // lane epochs started
	replies     legReplies    // replies to legs (replies.go)

	pendingMu sync.Mutex
	pending   map[string]*flight // Requests awaiting their responses, by delivery ID

	fl   flights     // flights by owner generation (liveness is opts.view's)
	shut atomic.Bool // Close started: flights end with ErrClosing

	moving atomic.Pointer[chan struct{}] // while MoveConnection runs: closed when it ends (move.go)

	idMu       sync.Mutex
	answerSubs []*nats.Subscription // the current identity's answer subscription
	// retiring holds earlier identities' answer subscriptions, each with
	// the timer that ends it after its grace (bindIdentity); Close ends
	// them at once. Guarded by idMu.
	retiring   map[*nats.Subscription]*time.Timer
	status     chan nats.Status
	statusDone chan struct{}
	closing    atomic.Bool
	stop       chan struct{} // closed when Close starts
	stopCtx    context.Context
	stopCancel context.CancelFunc
	closed     chan struct{}
	closeOnce  sync.Once
	calls      callGate // calls in progress; Close waits for them

	keys   answerKeys    // answer keys of accepting generations (answers.go)
	held   heldAnswers   // answers that overtook their generation's key (answers.go)
	gaveUp abandonedLegs // legs answered resendable without their acceptance (answers.go)
	stale  atomic.Int64  // answers dropped from a generation whose leg was abandoned
	forged atomic.Int64  // answers dropped by the binding

	retries, accepted, failed atomic.Int64
	byOutcome                 [numOutcomes]atomic.Int64 // deliveries ended, by final outcome
	latency                   [numOutcomes]histo.H      // call to final outcome, by final outcome
	lateVerdicts, unmatched   atomic.Int64
	resent                    atomic.Int64 // awaited Requests re-sent after their owner's connection moved
}

// NewClient validates cfg, applies opts and subscribes to the client's answer
// subject. Errors match [ErrInvalidConfig], or are the subscribe error.
//
// A client made here stands alone: unless [WithView] gives it one, its
// cluster view is [membership.Static], which sees no departure. It then
// learns that an owner left only from its legs — NATS no responders, the
// intake's "not the owner" or shutting-down refusals, all resendable, so the
// delivery is re-resolved and re-sent — not from membership: an awaited
// response of a Request whose owner crashed ends at the caller's deadline
// (outcome unknown), where a [Node]'s sender fails it at once. Its own
// link's drop and its own closing are told as for a node's sender.
func NewClient(cfg Config, opts ...Option) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	o := defaultOptions()
	o.view = membership.Static{} // a standalone client's cluster view; WithView replaces it
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	c := &Client{
		cfg:     cfg,
		opts:    o,
		log:     o.logger,
		sem:     make(chan struct{}, o.maxInFlight),
		lanes:   map[LaneKey]*lane{},
		pending: map[string]*flight{},
		fl:      newFlights(),
		closed:  make(chan struct{}),
		stop:    make(chan struct{}),
		calls:   callGate{idle: make(chan struct{})},
	}
	c.stopCtx, c.stopCancel = context.WithCancel(context.Background())
	c.epochPrefix = nuidShort() + "-"
	if err := c.replies.start(cfg.Conn); err != nil {
		return nil, fmt.Errorf("mesh: subscribe leg replies: %w", err)
	}
	if err := c.bindIdentity(cfg.Identity); err != nil {
		c.replies.stop()
		return nil, err
	}
	c.status = cfg.Conn.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING)
	c.statusDone = make(chan struct{})
	go c.watchLink()
	return c, nil
}

// watchLink ends every flight in flight when this client's own link drops:
// nats.go would let them wait out their timeout although replies and
// responses are lost with the connection. A leg in flight fails with
// nats.ErrDisconnected — resendable after reconnect with the same delivery
// ID, which the receiver dedupes; an accepted Request awaiting its response
// fails with verdict.ErrOutcomeUnknown unless it is Idempotent (DESIGN §3).
// Deliveries waiting for a slot or backing off are untouched: nothing of
// them is in flight.
func (c *Client) watchLink() {
	defer close(c.statusDone)
	for range c.status {
		c.interruptAll(evLinkDrop)
	}
}

// Identity returns the client's sender identity.
func (c *Client) Identity() subjects.NodeID { return c.id.Load().node }

// Clock returns the clock the client's timers run on (WithClock; the real
// clock by default); on a node, the node's one clock. Safe for concurrent
// use.
func (c *Client) Clock() Clock { return c.opts.clock }

// identity is a client's identity with its answer subject.
type identity struct {
	node     subjects.NodeID
	answerTo string
}

// answerTo returns the answer subject new legs name.
func (c *Client) answerTo() string { return c.id.Load().answerTo }

// bindIdentity makes node the client's identity (DESIGN §1: a session's
// client identity and answer subject are stamped with its generation): it
// subscribes node's answer subject and names it in every leg sent from now
// on. The previous answer subjects stay subscribed for a grace of the
// request timeout plus the leg timeout, so answers to deliveries sent
// before still arrive; Close ends them at once. Errors are the subscribe
// error. Safe for concurrent use.
func (c *Client) bindIdentity(node subjects.NodeID) error {
	c.idMu.Lock()
	defer c.idMu.Unlock()
	if cur := c.id.Load(); cur != nil && cur.node == node {
		return nil
	}
	if c.shut.Load() {
		return verdict.ErrClosing
	}
	to := c.cfg.Prefix.Sub(hub.AnswerToken + "." + node.Name + "." + strconv.FormatUint(node.Generation, 10))
	sub, err := c.cfg.Conn.Subscribe(to, c.dispatchAnswer)
	if err != nil {
		return fmt.Errorf("mesh: subscribe answers: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if c.retiring == nil {
		c.retiring = map[*nats.Subscription]*time.Timer{}
	}
	for _, old := range c.answerSubs {
		// Real clock: it waits out the real deadlines of requests that may
		// still be answered on the old subscription.
		c.retiring[old] = time.AfterFunc(c.opts.requestTimeout+c.opts.legTimeout, func() {
			c.idMu.Lock()
			_, mine := c.retiring[old] // Close may have ended it first
			delete(c.retiring, old)
			c.idMu.Unlock()
			if mine {
				_ = old.Unsubscribe()
			}
		})
	}
	c.answerSubs = append(c.answerSubs[:0], sub)
	c.id.Store(&identity{node: node, answerTo: to})
	return nil
}

// Deliver sends d to its address and returns once a hub accepted it — not
// after the handler ran. It blocks while the window of its lane (d.To,
// d.Stream) is full or an earlier delivery of the lane is retrying (it keeps
// its place), while the legs-in-flight cap is reached, and
// during retry back-off; ctx bounds all of it (a ctx without deadline gets the
// request timeout). Safe for concurrent use; calls on one lane are sent in
// call order.
//
// Failures are verdict errors; read them with verdict.IsTransient,
// verdict.IsResendable and verdict.Classify. Only resendable failures are
// retried (same delivery ID, owner re-resolved each attempt); a leg timeout is
// returned at once and never re-sent, because the hub may hold the delivery.
// Invalid input returns verdict.ErrInvalidAddress, verdict.ErrInvalidID or
// verdict.ErrPayloadTooLarge before anything is sent; a closing client
// returns verdict.ErrClosing. If ctx's deadline passes while the delivery
// waits for its lane, a slot or a back-off (nothing in flight, nothing
// accepted) it returns verdict.ErrDeadlineUnsent: resendable, not a timeout.
// If the owner departs before accepting it, it is re-resolved and re-sent.
func (c *Client) Deliver(ctx context.Context, d Delivery) (Receipt, error) {
	if c.opts.tracer != nil {
		return c.deliverTraced(ctx, &d)
	}
	return c.deliver(ctx, &d, nil)
}

func (c *Client) deliver(ctx context.Context, d *Delivery, f *flight) (Receipt, error) {
	return c.deliverBy(ctx, time.Time{}, d, f)
}

// deliverBy is deliver bounded by deadline; zero means ctx's deadline, or
// the request timeout from now (see run).
func (c *Client) deliverBy(ctx context.Context, deadline time.Time, d *Delivery, f *flight) (Receipt, error) {
	start := time.Now() // real clock: the deadline bounds network I/O, beside ctx's
	key, t, err := c.begin(d, f == nil)
	if err != nil {
		return Receipt{ID: d.ID}, err
	}
	if deadline.IsZero() {
		var ok bool
		if deadline, ok = ctx.Deadline(); !ok {
			deadline = start.Add(c.opts.requestTimeout)
		}
	}
	return c.run(ctx, start, deadline, d, key, t, f)
}

// Result is the outcome of [Client.DeliverAsync] and
// [Client.DeliverAsyncFunc].
type Result struct {
	Receipt
	Err error
}

// DeliverAsync joins d's lane at once, in call order, and delivers it in the
// background exactly as [Client.Deliver] would; the returned channel (buffer
// 1) receives its one Result. It does not block, so one goroutine can
// pipeline many deliveries on a lane and they are sent — and handled by the
// hub — in the order of the DeliverAsync calls; up to the window (default
// 32, [WithWindow]) are in flight at once, the rest wait in the lane.
//
// Results arrive as deliveries settle, which need not be call order: a
// refusal of one (inbox full, storm breaker: Ignored, never re-sent) or its
// timeout fails it alone while the deliveries behind it go on (DESIGN §4).
//
// ctx bounds the whole delivery from the call, as for Deliver: deliveries
// queued behind a long lane spend their deadline waiting, and one whose
// deadline passes before its leg is sent fails with
// verdict.ErrDeadlineUnsent (resendable: nothing was sent). DeliverAsync
// never blocks the caller, so nothing bounds how many wait in a lane but
// memory (about 650 B each): a producer faster than the destination should
// bound itself (a semaphore released from the Result, or [Client.Deliver],
// which blocks while the window is full).
func (c *Client) DeliverAsync(ctx context.Context, d Delivery) <-chan Result {
	out := make(chan Result, 1)
	c.deliverAsync(ctx, d, &asyncCall{out: out})
	return out
}

// DeliverAsyncFunc is DeliverAsync with a callback: done receives the one
// Result, on a goroutine of the client (or on the caller's, before
// DeliverAsyncFunc returns, if d fails validation or the client is
// closing). done must not block for long: it runs where the delivery ran.
// Callbacks of one lane run as its deliveries settle, not necessarily in
// call order (see DeliverAsync); the hub handles them in call order.
func (c *Client) DeliverAsyncFunc(ctx context.Context, d Delivery, done func(Result)) {
	c.deliverAsync(ctx, d, &asyncCall{done: done})
}

// begin validates d and joins its lane; validate says whether d still
// needs validating (Request validated it already).
func (c *Client) begin(d *Delivery, validate bool) (LaneKey, *laneTicket, error) {
	if validate {
		if err := c.validate(d); err != nil {
			c.count(err, time.Time{})
			return LaneKey{}, nil, err
		}
	}
	if !c.calls.join() {
		if validate {
			c.count(verdict.ErrClosing, time.Time{})
		}
		return LaneKey{}, nil, verdict.ErrClosing
	}
	if c.closing.Load() {
		c.calls.leave()
		if validate {
			c.count(verdict.ErrClosing, time.Time{})
		}
		return LaneKey{}, nil, verdict.ErrClosing
	}
	key := laneKeyOf(d)
	return key, c.enqueueLane(key, nil), nil
}

// run waits for the lane, runs the attempts and releases the lane. A ctx
// without deadline is bounded by the request timeout; the bound is applied
// where the call waits (lane, slot, leg, back-off) rather than by wrapping
// ctx, which keeps the fast path free of timers.
//
// f is the Request's flight, or nil for a plain delivery; a Request counts
// its own final outcome once its response came.
//
// start is when the call began (the latency histogram's origin); deadline
// bounds it: ctx's own, or the request timeout from start (from the call: a
// DeliverAsync may start later).
func (c *Client) run(ctx context.Context, start, deadline time.Time, d *Delivery, key LaneKey, t *laneTicket, f *flight) (Receipt, error) {
	defer c.calls.leave()
	var r Receipt
	var err error
	if f == nil {
		f = getFlight(d)
		r, err = c.attempts(ctx, deadline, d, f, t)
		putFlight(f) // decided and unindexed: no leg, wait or back-off of it is left
		f = nil
	} else {
		r, err = c.attempts(ctx, deadline, d, f, t)
	}
	c.finishLane(t, err == nil)
	if err == nil {
		c.accepted.Add(1)
	}
	if f == nil {
		c.count(err, start) // a Request counts its own once its response came
	}
	return r, err
}

func (c *Client) validate(d *Delivery) error {
	if d.ID == "" {
		d.ID = c.nuid.next()
	}
	if err := hub.ValidateID(d.ID); err != nil {
		return err
	}
	if err := d.To.Validate(); err != nil {
		return &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: "invalid destination address", Err: err}
	}
	if d.From != "" {
		if err := d.From.Validate(); err != nil {
			return &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: "invalid sending address (From)", Err: err}
		}
	}
	if err := d.Stream.Validate(); err != nil {
		return &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: "invalid stream", Err: err}
	}
	if len(d.Type) > hub.MaxTypeLen {
		return verdict.New(verdict.ReasonBadRequest, "type over %d bytes", hub.MaxTypeLen)
	}
	// nats.go refuses an oversized message itself before sending (mapped
	// in leg); checking here too gives the clearer error for payloads large
	// enough to matter without taking the connection's lock on every call.
	if len(d.Payload) > smallPayload {
		if max := c.cfg.Conn.MaxPayload(); max > 0 && int64(len(d.Payload)) > max {
			return payloadTooLarge(len(d.Payload), max)
		}
	}
	return nil
}

// smallPayload is the size under which Deliver leaves the max_payload check
// to nats.go.
const smallPayload = 4096

func payloadTooLarge(n int, max int64) error {
	return verdict.New(verdict.ReasonPayloadTooLarge, "payload of %d bytes plus headers is over the server's max_payload of %d bytes", n, max)
}

// Close stops the client: new deliveries fail with verdict.ErrClosing, and
// so at once do legs in flight, deliveries waiting for a slot or backing off
// (resendable, but not by this process), and awaited Requests
// (verdict.ErrOutcomeUnknown unless Idempotent: they were accepted). The
// answer subscription is removed once the calls in progress return. Safe to
// call more than once.
func (c *Client) Close() {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		c.shut.Store(true)
		close(c.stop)
		c.stopCancel()
		c.interruptAll(evClosing)
		c.launchAll() // DeliverAsync deliveries still queued end with ErrClosing
		c.calls.shut()
		c.idMu.Lock()
		for _, sub := range c.answerSubs {
			_ = sub.Unsubscribe()
		}
		c.answerSubs = nil
		for sub, tm := range c.retiring {
			tm.Stop()
			_ = sub.Unsubscribe()
		}
		c.retiring = nil
		c.idMu.Unlock()
		c.replies.stop()
		c.cfg.Conn.RemoveStatusListener(c.status)
		<-c.statusDone
		close(c.closed)
	})
}

// stopNew makes new deliveries fail with verdict.ErrClosing at once while
// those in progress continue (a draining node's own outgoing deliveries).
func (c *Client) stopNew() { c.closing.Store(true) }

// Closed is closed once Close has finished.
func (c *Client) Closed() <-chan struct{} { return c.closed }

// callGate counts a client's calls in progress so that Close can wait for
// them. A call joins only while Close has not begun: a sync.WaitGroup must
// not see an Add from zero while it is waited on, and a call starting while
// Close waits would be exactly that (a data race, or a "WaitGroup misuse"
// panic). Safe for concurrent use.
type callGate struct {
	n    atomic.Int64 // calls in progress, plus gateShut once shut began
	once sync.Once
	idle chan struct{} // closed once shut began and no call is in progress
}

const gateShut = 1 << 62

// join counts a call in, unless shut began (false: nothing counted).
func (g *callGate) join() bool {
	if g.n.Add(1) >= gateShut {
		g.leave()
		return false
	}
	return true
}

// leave counts a call out.
func (g *callGate) leave() {
	if g.n.Add(-1) == gateShut {
		g.once.Do(func() { close(g.idle) })
	}
}

// shut refuses every later join and waits until no call is in progress.
// Called once.
func (g *callGate) shut() {
	if g.n.Add(gateShut) == gateShut {
		g.once.Do(func() { close(g.idle) })
	}
	<-g.idle
}

// idSource generates delivery IDs: 128 bits from crypto/rand, encoded as
// 22 characters of unpadded base64url (DESIGN §5, §10: IDs the mesh
// generates are random, never counters — a predictable ID lets another
// caller claim it first). About 0.1–0.2 µs an ID, with no lock shared
// between callers.
type idSource struct{}

func (idSource) next() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func nuidShort() string {
	id := nuid.Next()
	return id[len(id)-10:]
}
