package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Delivery is what a sender sends. To is required; everything else is
// optional.
type Delivery struct {
	// ID is unique per delivery and kept across its retries; empty means
	// a fresh NUID. At most 128 bytes.
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
}

// Receipt is the outcome of an accepted delivery.
type Receipt struct {
	ID       string
	Node     subjects.NodeID // the node generation that accepted it
	Attempts int             // attempts made, 1..MaxRetries+1
}

// Client sends deliveries (DESIGN §4). It is safe for concurrent use.
type Client struct {
	cfg      Config
	opts     options
	log      *slog.Logger
	sender   string // cfg.Identity.String()
	answerTo string

	nuid         lockedNUID
	sem          chan struct{} // legs in flight
	inFlight     atomic.Int64
	peakInFlight atomic.Int64
	sat          saturation

	lanesMu sync.Mutex
	lanes   map[LaneKey]*lane

	pendingMu sync.Mutex
	pending   map[string]*pendingRequest // Request awaiting its response, by delivery ID

	legsByNode sync.Map // subjects.NodeID -> *nodeLegs: legs in flight per owner

	answersSub *nats.Subscription
	status     chan nats.Status
	statusDone chan struct{}
	closing    atomic.Bool
	stop       chan struct{} // closed when Close starts
	stopCtx    context.Context
	stopCancel context.CancelFunc
	closed     chan struct{}
	closeOnce  sync.Once
	calls      sync.WaitGroup

	keys   answerKeys   // answer keys of accepting generations (answers.go)
	forged atomic.Int64 // answers dropped by the binding

	retries, accepted, failed atomic.Int64
	byVerdict                 [5]atomic.Int64 // deliveries ended, by verdict.ErrorType
}

// NewClient validates cfg, applies opts and subscribes to the client's answer
// subject. Errors match [ErrInvalidConfig], or are the subscribe error.
func NewClient(cfg Config, opts ...Option) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	c := &Client{
		cfg:     cfg,
		opts:    o,
		log:     o.logger,
		sender:  cfg.Identity.String(),
		sem:     make(chan struct{}, o.maxInFlight),
		lanes:   map[LaneKey]*lane{},
		pending: map[string]*pendingRequest{},
		closed:  make(chan struct{}),
		stop:    make(chan struct{}),
	}
	c.stopCtx, c.stopCancel = context.WithCancel(context.Background())
	c.answerTo = cfg.Prefix.Sub(hub.AnswerToken + "." + cfg.Identity.Name + "." + strconv.FormatUint(cfg.Identity.Generation, 10))
	sub, err := cfg.Conn.Subscribe(c.answerTo, c.dispatchAnswer)
	if err != nil {
		return nil, fmt.Errorf("mesh: subscribe answers: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	c.answersSub = sub
	c.status = cfg.Conn.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING)
	c.statusDone = make(chan struct{})
	go c.watchLink()
	return c, nil
}

// watchLink fails every leg in flight when this client's own link drops:
// nats.go would let them wait out their timeout although the reply is lost
// with the connection. The failure is nats.ErrDisconnected — resendable
// after reconnect with the same delivery ID, which the receiver dedupes
// (DESIGN §3).
func (c *Client) watchLink() {
	defer close(c.statusDone)
	for range c.status {
		c.failAllLegs(fmt.Errorf("own NATS link dropped with the leg in flight: %w", nats.ErrDisconnected))
	}
}

// Identity returns the client's sender identity.
func (c *Client) Identity() subjects.NodeID { return c.cfg.Identity }

// Deliver sends d to its address and returns once a hub accepted it — not
// after the handler ran. It blocks while earlier deliveries of the same lane
// (d.To, d.Stream) are in flight, while the legs-in-flight cap is reached, and
// during retry back-off; ctx bounds all of it (a ctx without deadline gets the
// request timeout). Safe for concurrent use; calls on one lane are sent in
// call order.
//
// Failures are verdict errors; read them with verdict.IsTransient,
// verdict.IsResendable and verdict.Classify. Only resendable failures are
// retried (same delivery ID, owner re-resolved each attempt); a leg timeout is
// returned at once and never re-sent, because the hub may hold the delivery.
// Invalid input returns verdict.ErrInvalidAddress or verdict.ErrPayloadTooLarge
// before anything is sent; a closing client returns verdict.ErrClosing.
func (c *Client) Deliver(ctx context.Context, d Delivery) (Receipt, error) {
	return c.deliver(ctx, &d, false)
}

func (c *Client) deliver(ctx context.Context, d *Delivery, expectResponse bool) (Receipt, error) {
	key, t, err := c.begin(d)
	if err != nil {
		return Receipt{ID: d.ID}, err
	}
	return c.run(ctx, d, key, t, expectResponse)
}

// Result is the outcome of [Client.DeliverAsync].
type Result struct {
	Receipt
	Err error
}

// DeliverAsync joins d's lane at once, in call order, and delivers it in the
// background exactly as [Client.Deliver] would; the returned channel (buffer
// 1) receives its one Result. It does not block, so one goroutine can
// pipeline many deliveries on a lane and they are sent in the order of the
// DeliverAsync calls. ctx bounds the whole delivery, as for Deliver.
func (c *Client) DeliverAsync(ctx context.Context, d Delivery) <-chan Result {
	out := make(chan Result, 1)
	key, t, err := c.begin(&d)
	if err != nil {
		out <- Result{Receipt: Receipt{ID: d.ID}, Err: err}
		return out
	}
	go func() {
		r, err := c.run(ctx, &d, key, t, false)
		out <- Result{Receipt: r, Err: err}
	}()
	return out
}

// begin validates d and joins its lane.
func (c *Client) begin(d *Delivery) (LaneKey, *laneTicket, error) {
	if err := c.validate(d); err != nil {
		c.count(err)
		return LaneKey{}, nil, err
	}
	c.calls.Add(1)
	if c.closing.Load() {
		c.calls.Done()
		return LaneKey{}, nil, verdict.ErrClosing
	}
	key := laneKeyOf(d)
	return key, c.enqueueLane(key), nil
}

// run waits for the lane, runs the attempts and releases the lane. A ctx
// without deadline is bounded by the request timeout; the bound is applied
// where the call waits (lane, slot, leg, back-off) rather than by wrapping
// ctx, which keeps the fast path free of timers.
func (c *Client) run(ctx context.Context, d *Delivery, key LaneKey, t *laneTicket, expectResponse bool) (Receipt, error) {
	defer c.calls.Done()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(c.opts.requestTimeout)
	}
	if err := c.waitLane(ctx, deadline, key, t); err != nil {
		c.count(err)
		return Receipt{ID: d.ID}, fmt.Errorf("mesh: deliver %s: waiting for its lane: %w", d.ID, err)
	}
	defer c.releaseLane(key, t)
	r, err := c.attempts(ctx, deadline, d, expectResponse)
	c.count(err)
	return r, err
}

// count records how a delivery ended.
func (c *Client) count(err error) {
	if err != nil {
		c.failed.Add(1)
	} else {
		c.accepted.Add(1)
	}
	c.byVerdict[verdict.Classify(err)].Add(1)
}

func (c *Client) validate(d *Delivery) error {
	if d.ID == "" {
		d.ID = c.nuid.next()
	}
	if len(d.ID) > hub.MaxIDLen {
		return verdict.New(verdict.ReasonBadRequest, "delivery ID over %d bytes", hub.MaxIDLen)
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

// attempts runs the retry ladder while holding the lane.
func (c *Client) attempts(ctx context.Context, deadline time.Time, d *Delivery, expectResponse bool) (Receipt, error) {
	p := c.opts.retry
	b := p.backoff()
	var unplaced time.Time // since when no live node hosts the kind
	placing := false
	for attempt := 1; ; attempt++ {
		node, err := c.cfg.Resolver.Resolve(ctx, d.To)
		if err == nil {
			err = c.leg(ctx, deadline, d, node, attempt, expectResponse)
			if err == nil {
				return Receipt{ID: d.ID, Node: node, Attempts: attempt}, nil
			}
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, verdict.ErrNotOwner) || errors.Is(err, verdict.ErrDeparted) {
				c.cfg.Resolver.Invalidate(d.To, node)
			}
		}
		if node.IsZero() {
			err = fmt.Errorf("mesh: deliver %s to %s (attempt %d): %w", d.ID, d.To, attempt, err)
		} else {
			err = fmt.Errorf("mesh: deliver %s to %s (attempt %d, node %s): %w", d.ID, d.To, attempt, node, err)
		}
		if !verdict.IsResendable(err) || attempt > p.MaxRetries {
			return Receipt{ID: d.ID, Node: node, Attempts: attempt}, err
		}
		if c.closing.Load() {
			return Receipt{ID: d.ID, Node: node, Attempts: attempt}, errors.Join(verdict.ErrClosing, err)
		}
		wait := b.NextBackOff()
		if errors.Is(err, verdict.ErrNoPlacement) {
			// Nothing was sent: a node hosting the kind may join, but a
			// typo in a kind must not cost the whole ladder.
			now := c.opts.clock.Now()
			if !placing {
				unplaced, placing = now, true
			}
			left := c.opts.placementWait - now.Sub(unplaced)
			if left <= 0 {
				return Receipt{ID: d.ID, Attempts: attempt}, err
			}
			wait = min(wait, left)
		}
		if serr := c.sleep(ctx, deadline, wait); serr != nil {
			if c.closing.Load() {
				return Receipt{ID: d.ID, Attempts: attempt}, errors.Join(verdict.ErrClosing, err)
			}
			if errors.Is(serr, context.Canceled) {
				// The caller chose: Failed, not transient.
				return Receipt{ID: d.ID, Attempts: attempt}, errors.Join(serr, err)
			}
			// Out of time while backing off: the last failure still says
			// truthfully that the hub holds nothing.
			return Receipt{ID: d.ID, Attempts: attempt}, fmt.Errorf("%w (gave up during back-off: %v)", err, serr)
		}
		c.retries.Add(1)
	}
}

// leg sends one attempt and decodes the verdict of its reply.
func (c *Client) leg(ctx context.Context, deadline time.Time, d *Delivery, node subjects.NodeID, attempt int, expectResponse bool) error {
	msg := &nats.Msg{
		Subject: c.cfg.Prefix.Delivery(node, d.To, d.Stream),
		Data:    d.Payload,
		Header:  make(nats.Header, 8),
	}
	h := msg.Header
	h[hub.HeaderID] = []string{d.ID}
	if attempt > 1 {
		h[hub.HeaderAttempt] = []string{strconv.Itoa(attempt)}
	}
	h[hub.HeaderAnswerTo] = []string{c.answerTo}
	if d.Type != "" {
		h[hub.HeaderType] = []string{d.Type}
	}
	if d.From != "" {
		h[hub.HeaderFrom] = []string{string(d.From)}
	}
	if expectResponse {
		h[hub.HeaderExpectResponse] = []string{"true"}
	}
	if legEnd := time.Now().Add(c.opts.legTimeout); legEnd.Before(deadline) {
		deadline = legEnd
	}
	legCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	ref := &legRef{cancel: cancel}
	nl := c.trackLeg(node, ref)
	defer nl.remove(ref)
	select {
	case c.sem <- struct{}{}:
	case <-legCtx.Done():
		return fmt.Errorf("waiting for an in-flight slot: %w", legCtx.Err())
	case <-c.stop:
		return verdict.ErrClosing
	}
	n := c.inFlight.Add(1)
	for peak := c.peakInFlight.Load(); n > peak && !c.peakInFlight.CompareAndSwap(peak, n); peak = c.peakInFlight.Load() {
	}
	c.observeInFlight(n)
	reply, err := c.cfg.Conn.RequestMsgWithContext(legCtx, msg)
	c.observeInFlight(c.inFlight.Add(-1))
	<-c.sem
	if cause := ref.cause.Load(); cause != nil {
		return *cause // the owner departed while the leg was in flight
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return payloadTooLarge(len(d.Payload), c.cfg.Conn.MaxPayload())
	}
	if err != nil {
		return err
	}
	_, err = verdict.Decode(reply.Header)
	if err == nil {
		c.keys.learn(node, reply)
	}
	return err
}

// Close stops the client: new deliveries fail with verdict.ErrClosing,
// retries in back-off stop at their next attempt, awaited requests fail with
// verdict.ErrClosing, and the answer subscription is removed once the calls
// in progress return. Safe to call more than once.
func (c *Client) Close() {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		close(c.stop)
		c.stopCancel()
		c.pendingMu.Lock()
		for id, p := range c.pending {
			p.ch <- answer{err: verdict.ErrClosing}
			delete(c.pending, id)
		}
		c.pendingMu.Unlock()
		c.calls.Wait()
		_ = c.answersSub.Unsubscribe()
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

// ClientStats are the client's cumulative counters.
type ClientStats struct {
	Accepted int64 `json:"accepted"` // deliveries accepted
	Failed   int64 `json:"failed"`   // deliveries that ended in a failure verdict
	Retries  int64 `json:"retries"`  // re-sends after a resendable failure
	// ByVerdict counts ended deliveries by verdict name ("Accepted",
	// "Failed", "ShuttingDown", "Unavailable", "Ignored").
	ByVerdict map[string]int64 `json:"by_verdict"`
	// ForgedAnswers counts late verdicts and responses dropped because
	// they did not carry the token of the generation that accepted the
	// delivery (DESIGN §5): forgeries, or answers of another generation.
	ForgedAnswers int64 `json:"forged_answers"`
}

// Stats returns the client's counters.
func (c *Client) Stats() ClientStats {
	s := ClientStats{Accepted: c.accepted.Load(), Failed: c.failed.Load(), Retries: c.retries.Load(), ByVerdict: map[string]int64{}, ForgedAnswers: c.forged.Load()}
	for t := range c.byVerdict {
		s.ByVerdict[verdict.ErrorType(t).String()] = c.byVerdict[t].Load()
	}
	return s
}

// sleep backs off for d on the injected clock, bounded by deadline; Close
// interrupts it.
func (c *Client) sleep(ctx context.Context, deadline time.Time, d time.Duration) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer context.AfterFunc(c.stopCtx, cancel)()
	return c.opts.clock.Sleep(ctx, d)
}

// lockedNUID is a per-client NUID generator: the package-level nuid.Next
// serialises every client of the process on one lock.
type lockedNUID struct {
	mu sync.Mutex
	n  *nuid.NUID
}

func (l *lockedNUID) next() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = nuid.New()
	}
	return l.n.Next()
}

func nuidShort() string {
	id := nuid.Next()
	return id[len(id)-10:]
}
