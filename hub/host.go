package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/internal/histo"
	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// ClaimTimeout bounds a directory claim on the intake.
const ClaimTimeout = 2 * time.Second

// Defaults for zero Config fields.
const (
	DefaultInboxSize        = 1024
	DefaultIdleTimeout      = 5 * time.Minute
	DefaultParkPerAddress   = 256
	DefaultParkBacklog      = 16384
	DefaultClaimConcurrency = 128
)

// Claims is the seam for single activation across nodes (DESIGN §5): before a
// node activates an address it claims it. The membership layer implements it
// with the KV directory; a nil Claims means this node owns every address
// (one node). Implementations must be safe for concurrent use.
//
// Claims are tokens, not names (DESIGN §5, round 3): every claim this node
// takes, or re-adopts, gets a ClaimToken of its own, and the activation
// built on it is the only one that holds it. Release and stand-down name
// the token, so an older activation of the same address on this node can
// never release or stand down a claim a newer activation took.
type Claims interface {
	// Claim makes node the owner of addr and returns the token of its
	// claim, or returns the live owner that holds it (Grant.Owner !=
	// node, zero Token, nil error). An error means the directory could
	// not be read or written (the delivery is refused ShuttingDown).
	Claim(ctx context.Context, addr subjects.Address) (Grant, error)
	// Release gives up the claim t on deactivation. A token that is no
	// longer the address's current claim on this node (a newer
	// activation claimed it since) releases nothing.
	Release(t ClaimToken)
}

// Grant is what a claim returned: the owner, and when that is this node,
// the token of the claim.
type Grant struct {
	Owner subjects.NodeID
	Token ClaimToken
}

// ClaimToken names one claim a Claims implementation issued: the address,
// an identity unique to the claim within the issuing node, and the KV
// revision the claim was written at when it was issued (the directory may
// re-write it later under the same identity). The zero value names no
// claim.
type ClaimToken struct {
	Addr subjects.Address
	ID   uint64
	Rev  uint64
}

// IsZero reports whether t names no claim.
func (t ClaimToken) IsZero() bool { return t.ID == 0 }

// Config holds a Host's settings. Conn and Node are required; every zero
// field means its documented default.
type Config struct {
	// Conn is the NATS connection the host subscribes and answers on.
	Conn *nats.Conn
	// Node is this node generation; its delivery subject is
	// <prefix>.dlv.<name>.<gen>.>.
	Node subjects.NodeID
	// Prefix is the subject prefix; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// InboxSize bounds each activation's inbox, in deliveries; a delivery
	// arriving at a full inbox is refused Ignored (verdict.ErrInboxFull).
	// Zero means DefaultInboxSize.
	InboxSize int
	// DedupeWindow is how many accepted delivery IDs the node remembers;
	// zero means DefaultDedupeWindow.
	DedupeWindow int
	// DedupeResponseBytes bounds the payload bytes of handled requests'
	// responses kept in the window, so that a duplicate gets its response
	// again; past it the oldest are dropped and a duplicate of theirs is
	// answered verdict.ErrResponseGone. Zero means
	// DefaultDedupeResponseBytes; negative keeps none.
	DedupeResponseBytes int
	// IdleTimeout deactivates an activation with no work for this long.
	// Zero means DefaultIdleTimeout; negative means never.
	IdleTimeout time.Duration
	// Claims claims addresses before activation; nil means this node owns
	// every address.
	Claims Claims
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Fence, if set, is asked before each delivery is accepted; a non-nil
	// error refuses it (with that error). Membership uses it so that a node
	// whose registration is unconfirmed — after a reconnect, or lost —
	// serves nothing (DESIGN §5, fencing).
	Fence func() error
	// BreakerRate is the storm breaker's limit in deliveries per second per
	// (sender, target, type, stream) key; over it the intake refuses Ignored
	// (verdict.ErrStormBreaker). Legs in a windowed lane (HeaderLane) are
	// not counted (DefaultBreakerRate says why). Zero means
	// DefaultBreakerRate; negative turns the breaker off.
	BreakerRate int
	// ParkPerAddress bounds the deliveries parked on one cold address
	// while its claim is in flight; past it the intake refuses Ignored
	// (verdict.ErrInboxFull). Zero means DefaultParkPerAddress.
	ParkPerAddress int
	// ParkBacklog bounds the deliveries parked on all cold addresses of
	// the node together; past it the intake refuses Ignored
	// (verdict.ErrInboxFull). Zero means DefaultParkBacklog.
	ParkBacklog int
	// ClaimConcurrency bounds the claims in flight at once (claims of many
	// addresses are pipelined up to it). Zero means
	// DefaultClaimConcurrency.
	ClaimConcurrency int
	// TurnFence, if set, is asked before each turn instead of Fence: a
	// node may accept (park) deliveries while it may not yet run turns —
	// its registration unconfirmed after a reconnect — so its senders do
	// not back off through a registry's leader election. A non-nil error
	// makes the turn wait (AwaitServing).
	TurnFence func() error
	// AwaitServing, if set, is called by a turn when its fence refuses: it
	// blocks until the node may serve again (nil: handle the delivery) or
	// never will (an error: fail it late with that error). Without it a
	// fenced turn fails its delivery at once.
	AwaitServing func(ctx context.Context) error
	// TracerProvider traces intakes and turns (OpenTelemetry; see
	// docs/protocol.md §8c): nil, the default, turns tracing off at no cost.
	TracerProvider trace.TracerProvider
	// State keeps hubs' durable state (DESIGN §7a, [LoadState]); nil means
	// this node keeps none and LoadState fails with ErrNoStateStore.
	State StateStore
}

func (c *Config) validate() error {
	if c.Conn == nil {
		return fmt.Errorf("%w: Conn is nil", ErrInvalidConfig)
	}
	if err := c.Node.Validate(); err != nil {
		return fmt.Errorf("%w: Node: %w", ErrInvalidConfig, err)
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if err := c.Prefix.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.InboxSize < 0 || c.DedupeWindow < 0 {
		return fmt.Errorf("%w: negative InboxSize or DedupeWindow", ErrInvalidConfig)
	}
	if c.InboxSize == 0 {
		c.InboxSize = DefaultInboxSize
	}
	if c.DedupeWindow == 0 {
		c.DedupeWindow = DefaultDedupeWindow
	}
	if c.DedupeResponseBytes == 0 {
		c.DedupeResponseBytes = DefaultDedupeResponseBytes
	}
	if c.ParkPerAddress < 0 || c.ParkBacklog < 0 || c.ClaimConcurrency < 0 {
		return fmt.Errorf("%w: negative ParkPerAddress, ParkBacklog or ClaimConcurrency", ErrInvalidConfig)
	}
	if c.ParkPerAddress == 0 {
		c.ParkPerAddress = DefaultParkPerAddress
	}
	if c.ParkBacklog == 0 {
		c.ParkBacklog = DefaultParkBacklog
	}
	if c.ClaimConcurrency == 0 {
		c.ClaimConcurrency = DefaultClaimConcurrency
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.BreakerRate == 0 {
		c.BreakerRate = DefaultBreakerRate
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Stats are a host's counters since start; every field is cumulative except
// Activations and Queued, which are current.
type Stats struct {
	Node        subjects.NodeID `json:"node"`
	Activations int             `json:"activations"`  // live activations
	Queued      int             `json:"queued"`       // deliveries accepted and not yet settled
	Accepted    int64           `json:"accepted"`     // deliveries accepted (first time)
	DedupeHits  int64           `json:"dedupe_hits"`  // deliveries answered Accepted again from the window
	Refused     int64           `json:"refused"`      // deliveries refused before acceptance
	Handled     int64           `json:"handled"`      // deliveries whose handler returned
	Late        int64           `json:"late"`         // late verdicts sent after acceptance
	Deactivated int64           `json:"deactivated"`  // activations collected or closed
	Claiming    int             `json:"claiming"`     // cold addresses whose claim is in flight (current)
	Parked      int             `json:"parked"`       // deliveries parked on those claims (current)
	ParkRefused int64           `json:"park_refused"` // deliveries refused because a claim's parking or the node's backlog was full (included in Refused)

	// BreakerRefusals counts the storm breaker's refusals (included in Refused).
	BreakerRefusals int64 `json:"breaker_refusals"`
	// RefusedByReason splits Refused by verdict reason (its wire name,
	// e.g. "not-owner"); LateByReason splits Late the same way. Reasons
	// that never occurred are absent.
	RefusedByReason map[string]int64 `json:"refused_by_reason,omitempty"`
	LateByReason    map[string]int64 `json:"late_by_reason,omitempty"`
}

// Host receives deliveries for one node generation. It is safe for
// concurrent use. Create it with [New], register hub kinds, then [Host.Start].
type Host struct {
	cfg       Config
	nodeID    string // cfg.Node.String(), the Mesh-Node header value
	ansPrefix string // "<prefix>.ans.", where senders' answer subjects live
	// acceptedHdr is the constant header of every Accepted reply; it is
	// shared read-only (nats.go only reads a header when publishing).
	acceptedHdr nats.Header
	answerKey   string // this generation's answer key (answer.go)
	log         *slog.Logger
	dedupe      *dedupe
	breaker     *breaker // nil: off

	kindsMu sync.RWMutex
	kinds   map[string]Factory

	mu          sync.RWMutex
	activations map[subjects.Address]*activation
	claiming    map[subjects.Address]*claimOp // cold addresses whose claim is in flight
	parked      int                           // deliveries parked on claiming, node-wide
	draining    bool
	sub         *nats.Subscription
	claimSem    chan struct{}

	ctx    context.Context // cancelled by Close: builds and handlers
	cancel context.CancelFunc
	wg     sync.WaitGroup // builds, turns, janitor

	accepted, dedupeHits, refused, handled, late, deactivated atomic.Int64

	breakerRefusals, parkRefused atomic.Int64

	refusedBy, lateBy [256]atomic.Int64 // by verdict.Reason
	turns             histo.H           // handler turn durations

	tracer  trace.Tracer // nil: tracing off
	intakes sync.Map     // *nats.Msg → *intakeSpan, until the reply (tracing on)
}

// New validates cfg and returns a Host that is not yet subscribed. Errors
// match [ErrInvalidConfig].
func New(cfg Config) (*Host, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	answerKey := newAnswerKey()
	acceptedHdr := nats.Header{}
	verdict.Encode(acceptedHdr, nil, cfg.Node.String())
	acceptedHdr.Set(HeaderAnswerKey, answerKey)
	var br *breaker
	if cfg.BreakerRate > 0 {
		br = newBreaker(cfg.BreakerRate, time.Now)
	}
	return &Host{
		acceptedHdr: acceptedHdr,
		answerKey:   answerKey,
		ansPrefix:   cfg.Prefix.Sub(AnswerToken + "."),
		cfg:         cfg,
		tracer:      meshtrace.Tracer(cfg.TracerProvider),
		nodeID:      cfg.Node.String(),
		log:         cfg.Logger.With("node", cfg.Node.String()),
		dedupe:      newDedupe(cfg.DedupeWindow, max(cfg.DedupeResponseBytes, 0)),
		breaker:     br,
		kinds:       map[string]Factory{},
		activations: map[subjects.Address]*activation{},
		claiming:    map[subjects.Address]*claimOp{},
		claimSem:    make(chan struct{}, cfg.ClaimConcurrency),
		ctx:         ctx,
		cancel:      cancel,
	}, nil
}

// Node returns the host's node generation.
func (h *Host) Node() subjects.NodeID { return h.cfg.Node }

// Register installs the factory for addresses of kind. It returns
// [ErrKindRegistered] if kind has one. Safe to call at any time.
func (h *Host) Register(kind string, f Factory) error {
	h.kindsMu.Lock()
	defer h.kindsMu.Unlock()
	if _, ok := h.kinds[kind]; ok {
		return fmt.Errorf("%w: %q", ErrKindRegistered, kind)
	}
	h.kinds[kind] = f
	return nil
}

// Kinds returns the registered hub kinds.
func (h *Host) Kinds() []string {
	h.kindsMu.RLock()
	defer h.kindsMu.RUnlock()
	out := make([]string, 0, len(h.kinds))
	for k := range h.kinds {
		out = append(out, k)
	}
	return out
}

// Start subscribes to the node generation's delivery subject and starts the
// idle collector. It returns the subscribe error, or [ErrHostClosed].
func (h *Host) Start() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx.Err() != nil {
		return ErrHostClosed
	}
	sub, err := h.cfg.Conn.Subscribe(h.cfg.Prefix.NodeSubscription(h.cfg.Node), h.intake)
	if err != nil {
		return fmt.Errorf("hub: subscribe: %w", err)
	}
	// Intake is cheap and never blocks; let bursts queue in the client
	// rather than be dropped as a slow consumer.
	_ = sub.SetPendingLimits(-1, -1)
	h.sub = sub
	if h.cfg.IdleTimeout > 0 {
		h.wg.Add(1)
		go h.janitor()
	}
	return nil
}

// intake handles one delivery message: it is the subscription callback, so
// it never blocks on anything but short critical sections.
func (h *Host) intake(m *nats.Msg) {
	if m.Reply == "" {
		h.log.Debug("delivery without reply subject dropped", "subject", m.Subject)
		return
	}
	if !h.cfg.Prefix.SafeReply(m.Reply) {
		// Never publish the verdict where the sender chose a subject
		// under "$" or the prefix (a KV bucket, a control subject).
		h.refused.Add(1)
		h.log.Debug("delivery with an unsafe reply subject dropped", "subject", m.Subject, "reply", m.Reply)
		return
	}
	if h.tracer != nil {
		h.startIntake(m)
	}
	e, err := h.parse(m)
	if err != nil {
		h.refuse(m, err)
		return
	}
	if h.tracer != nil {
		h.tagIntake(m, e)
	}
	if f := h.cfg.Fence; f != nil {
		if err := f(); err != nil {
			h.refuse(m, err)
			return
		}
	}
	if r := h.dedupe.lookup(e.ID); r != nil {
		h.duplicate(m, e, r)
		return
	}
	if b := h.breaker; b != nil && e.seq <= 1 {
		// A windowed lane's legs past its epoch's first are not counted
		// (DefaultBreakerRate): what they carry was sequence-checked in.
		k := keyOf(&e.Delivery)
		if ok, tripped := b.allow(k); !ok {
			if tripped {
				h.log.Warn("storm breaker tripped", "sender", k.Sender, "target", string(k.Target), "type", k.Type, "stream", string(k.Stream), "rate", b.rate)
			}
			h.breakerRefusals.Add(1)
			h.refuse(m, verdict.New(verdict.ReasonStormBreaker, "storm breaker: sender %q, target %s, type %q, stream %q over %d deliveries/s", k.Sender, k.Target, k.Type, k.Stream, b.rate))
			return
		}
	}
	h.dispatch(m, e)
}

// dispatch puts an accepted-to-be delivery in its activation's inbox and
// answers it, or parks it on its address's claim (a cold address with
// Claims set: the claim runs on its own goroutine, never on the
// subscription's), or refuses it.
func (h *Host) dispatch(m *nats.Msg, e *entry) {
	var a *activation
	for {
		h.mu.RLock()
		draining := h.draining || h.ctx.Err() != nil
		a = h.activations[e.To]
		h.mu.RUnlock()
		if draining {
			h.refuse(m, verdict.New(verdict.ReasonHubShuttingDown, "node %s is draining", h.nodeID))
			return
		}
		if a == nil {
			if h.cfg.Claims != nil {
				parked, err := h.park(m, e)
				if err != nil {
					h.refuse(m, err)
				}
				if parked || err != nil {
					return
				}
				continue // activated meanwhile
			}
			var err error
			if a, err = h.activate(e.To); err != nil {
				h.refuse(m, err)
				return
			}
		}
		// Remembered before it can be settled, so that a failure racing
		// the enqueue finds the record to forget.
		e.rec = h.dedupe.add(e.ID, e.expectResponse, e.answerTo)
		err := a.enqueue(e, false)
		if err != nil {
			h.dedupe.forget(e.rec)
			e.rec = nil
		}
		if err == errActivationGone {
			continue // collected as idle just now: activate afresh
		}
		if err != nil {
			h.refuse(m, err)
			return
		}
		break
	}
	h.answerAccepted(m, e)
	a.kick() // after the reply: its turn does not delay it
}

// duplicate answers a delivery whose ID is in the dedupe window from the
// outcome recorded for it, without enqueuing it again: a request already
// handled gets Accepted and its response again (to the duplicate's answer
// subject), or verdict.ErrResponseGone once the response was dropped; a
// request still queued or running gets Accepted, and its answer goes to the
// duplicate's answer subject too (a different sender's: bounded, past it
// the duplicate is refused); a delivery that failed late gets that failure;
// a plain delivery Accepted. Never Accepted followed by silence.
func (h *Host) duplicate(m *nats.Msg, e *entry, r *record) {
	if r.request && e.expectResponse {
		st, noted := h.dedupe.also(r, e.answerTo)
		if st == recAccepted {
			h.dedupeHits.Add(1)
			if noted {
				// Queued or running: its answer goes to this duplicate's
				// answer subject too.
				h.reply(m, nil)
			} else {
				h.refuse(m, verdict.New(verdict.ReasonInboxFull, "request %s is queued on %s and already owes its response to %d other senders", e.ID, h.nodeID, maxAlsoAnswer+1))
			}
			return
		}
	}
	state, payload, err := h.dedupe.outcomeOf(r)
	if state == recForgotten {
		// Refused late with a resendable verdict since the lookup: the hub
		// holds nothing of it, so this copy is accepted afresh.
		h.dispatch(m, e)
		return
	}
	h.dedupeHits.Add(1)
	switch {
	case state == recFailed:
		h.reply(m, err)
	case !r.request || !e.expectResponse:
		h.reply(m, nil)
	case state == recRespGone:
		h.reply(m, verdict.New(verdict.ReasonResponseGone, "request %s was handled on %s; its response is no longer kept", e.ID, h.nodeID))
	case state == recResponded:
		h.reply(m, nil)
		if serr := h.sendAnswer(e.answerTo, e.ID, AnswerResponse, err, payload, e.tr); serr != nil {
			h.log.Warn("response not re-sent", "id", e.ID, "err", serr)
		}
	default:
		h.reply(m, nil) // a plain delivery queued or running
	}
}

// answerAccepted sends the reply of an enqueued delivery: Accepted, or the
// failure that settled it before this reply.
func (h *Host) answerAccepted(m *nats.Msg, e *entry) {
	h.accepted.Add(1)
	if e.replied.CompareAndSwap(false, true) {
		h.reply(m, nil)
	} else {
		// Failed after acceptance but before this reply: the failure is
		// the one verdict, sent synchronously.
		h.reply(m, e.err)
	}
}

// parse reads a delivery message into an entry, or a Failed refusal.
func (h *Host) parse(m *nats.Msg) (*entry, error) {
	d, err := h.cfg.Prefix.ParseDelivery(m.Subject)
	if err != nil {
		return nil, verdict.New(verdict.ReasonInvalidAddress, "%v", err)
	}
	if d.Node != h.cfg.Node {
		return nil, verdict.New(verdict.ReasonNotOwner, "delivery for %s reached %s", d.Node, h.nodeID)
	}
	e := &entry{}
	e.To, e.Stream, e.host = d.Addr, d.Stream, h
	hdr := m.Header
	e.ID = hdr.Get(HeaderID)
	if err := ValidateID(e.ID); err != nil {
		return nil, &verdict.Error{Reason: verdict.ReasonInvalidID, Message: "header " + HeaderID + ": " + err.(*verdict.Error).Message}
	}
	if f := hdr.Get(HeaderFrom); f != "" {
		if err := subjects.Address(f).Validate(); err != nil {
			return nil, verdict.New(verdict.ReasonInvalidAddress, "header %s: %v", HeaderFrom, err)
		}
		e.From = subjects.Address(f)
	}
	e.Type = hdr.Get(HeaderType)
	if len(e.Type) > MaxTypeLen {
		return nil, verdict.New(verdict.ReasonBadRequest, "header %s over %d bytes", HeaderType, MaxTypeLen)
	}
	e.Attempt = 1
	if s := hdr.Get(HeaderAttempt); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, verdict.New(verdict.ReasonBadRequest, "header %s: %q is not a positive integer", HeaderAttempt, s)
		}
		e.Attempt = n
	}
	if v := hdr.Get(HeaderLane); v != "" {
		if e.epoch, e.seq, err = ParseLane(v); err != nil {
			return nil, err
		}
	}
	e.answerTo = hdr.Get(HeaderAnswerTo)
	if e.answerTo != "" && !h.answerSubject(e.answerTo) {
		// DESIGN §5: never publish a response or late verdict outside the
		// answer subjects (a control subject, the registry's KV subject).
		return nil, verdict.New(verdict.ReasonBadRequest, "header %s: %q is not a subject under %s", HeaderAnswerTo, e.answerTo, h.ansPrefix)
	}
	if e.Sender = hdr.Get(HeaderSender); e.Sender == "" {
		e.Sender = h.senderOf(e.answerTo)
	}
	e.expectResponse = hdr.Get(HeaderExpectResponse) == "true"
	if e.expectResponse && e.answerTo == "" {
		return nil, verdict.New(verdict.ReasonBadRequest, "%s without %s", HeaderExpectResponse, HeaderAnswerTo)
	}
	e.Payload = m.Data
	return e, nil
}

// answerSubject reports whether s is a literal subject under
// <prefix>.ans.: non-empty tokens without wildcards, spaces or control
// characters.
func (h *Host) answerSubject(s string) bool {
	rest, ok := strings.CutPrefix(s, h.ansPrefix)
	if !ok || rest == "" || len(s) > maxAnswerSubjectLen {
		return false
	}
	for tok := range strings.SplitSeq(rest, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c <= ' ' || c == 0x7f {
				return false
			}
		}
	}
	return true
}

// maxAnswerSubjectLen bounds an answer subject (bytes).
const maxAnswerSubjectLen = 512

// senderOf derives a mesh sender's identity "name.gen" from its answer
// subject <prefix>.ans.<name>.<gen>, or returns "".
func (h *Host) senderOf(answerTo string) string {
	rest, ok := strings.CutPrefix(answerTo, h.ansPrefix)
	if !ok {
		return ""
	}
	if _, err := subjects.ParseNodeID(rest); err != nil {
		return ""
	}
	return rest
}

// activate returns the activation of addr, creating it (and starting its
// build) if absent. With Claims set it claims addr first, through the same
// claim operation the intake parks deliveries on (claim.go): one claim per
// address is in flight on a host at a time, and the activation it builds is
// the only holder of its token.
func (h *Host) activate(addr subjects.Address) (*activation, error) {
	h.kindsMu.RLock()
	f, ok := h.kinds[addr.Kind()]
	h.kindsMu.RUnlock()
	if !ok {
		return nil, verdict.New(verdict.ReasonUnknownKind, "node %s hosts no hub of kind %q", h.nodeID, addr.Kind())
	}
	if h.cfg.Claims == nil {
		h.mu.Lock()
		a, err := h.newActivationLocked(addr, f, ClaimToken{})
		h.mu.Unlock()
		return a, err
	}
	for {
		h.mu.Lock()
		if h.draining || h.ctx.Err() != nil {
			h.mu.Unlock()
			return nil, verdict.New(verdict.ReasonHubShuttingDown, "node %s is draining", h.nodeID)
		}
		if a := h.activations[addr]; a != nil {
			h.mu.Unlock()
			return a, nil
		}
		op := h.claiming[addr]
		if op == nil {
			op = newClaimOp(addr, f)
			h.claiming[addr] = op
			h.wg.Add(1)
			h.mu.Unlock()
			h.runClaim(op)
		} else {
			h.mu.Unlock()
			select {
			case <-op.done:
			case <-h.ctx.Done():
				return nil, verdict.New(verdict.ReasonHubShuttingDown, "node %s is closing", h.nodeID)
			}
		}
		if op.refusal != nil {
			return nil, op.refusal
		}
		if op.act != nil {
			// Claimed and activated: that activation, even if its
			// build failed already (a lookup would claim and build
			// again, at once, for as long as builds fail fast).
			return op.act, nil
		}
	}
}

// newActivationLocked returns addr's activation, creating it and starting
// its build if absent, or refuses while draining. tok is the claim the
// activation holds (zero without Claims); an activation already there takes
// tok over, since it is now the address's current claim on this node.
// Called with h.mu held.
func (h *Host) newActivationLocked(addr subjects.Address, f Factory, tok ClaimToken) (*activation, error) {
	if h.draining || h.ctx.Err() != nil {
		return nil, verdict.New(verdict.ReasonHubShuttingDown, "node %s is draining", h.nodeID)
	}
	if a := h.activations[addr]; a != nil {
		if !tok.IsZero() {
			a.mu.Lock()
			a.claim = tok
			a.mu.Unlock()
		}
		return a, nil
	}
	a := &activation{host: h, addr: addr, state: stateBuilding, building: true, claim: tok}
	h.activations[addr] = a
	h.wg.Add(1)
	go a.build(f)
	return a, nil
}

// Activate activates addr on this node explicitly (DESIGN §5, local
// activation) and pins it until release is called: it is never
// idle-collected meanwhile. It does not wait for the hub's build, and never
// builds twice: if the build it started failed before it took its hold, it
// returns that failure (verdict.ErrActivationFailed, not resendable);
// one that fails later leaves the release of an activation that is gone.
// It blocks on the address's claim (with Claims), bounded by ctx. Errors
// are verdict errors (unknown kind, not the owner, shutting down,
// activation failed) or ctx's. release is safe to call more than once.
// Safe for concurrent use.
func (h *Host) Activate(ctx context.Context, addr subjects.Address) (release func(), err error) {
	if err := addr.Validate(); err != nil {
		return nil, &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: err.Error()}
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		a, err := h.activate(addr)
		if err != nil {
			return nil, err
		}
		a.mu.Lock()
		switch a.state {
		case stateFailed:
			err := a.failure
			a.mu.Unlock()
			return nil, err
		case stateClosed:
			a.mu.Unlock()
			continue // collected or stood down meanwhile: activate it anew
		}
		a.holds++
		a.mu.Unlock()
		var once sync.Once
		return func() {
			once.Do(func() {
				a.mu.Lock()
				a.holds--
				a.lastActive = time.Now()
				a.mu.Unlock()
			})
		}, nil
	}
}

// reply answers the delivery request with err's verdict (nil: Accepted).
func (h *Host) reply(m *nats.Msg, err error) {
	if h.tracer != nil {
		h.endIntake(m, err)
	}
	r := &nats.Msg{Subject: m.Reply, Header: h.acceptedHdr}
	if err != nil {
		r.Header = nats.Header{}
		verdict.Encode(r.Header, err, h.nodeID)
	}
	if perr := h.cfg.Conn.PublishMsg(r); perr != nil {
		h.log.Warn("reply failed", "subject", m.Subject, "err", perr)
	}
}

func (h *Host) refuse(m *nats.Msg, err error) {
	h.refused.Add(1)
	h.refusedBy[verdict.ReasonOf(err)].Add(1)
	h.reply(m, err)
}

// sendResponse records request d's response (or its failure) in the dedupe
// window and publishes it to d's answer subject and to those of the
// duplicates accepted meanwhile from other senders; it returns the error of
// the publish to d's own answer subject.
func (h *Host) sendResponse(d *Delivery, err error, payload []byte) error {
	also := h.dedupe.responded(d.rec, payload, err)
	for _, to := range also {
		if serr := h.sendAnswer(to, d.ID, AnswerResponse, err, payload, d.tr); serr != nil {
			// Still one answer for that sender: why it was not sent.
			ferr := &verdict.Error{Reason: verdict.ReasonHandlerError, Message: fmt.Sprintf("response of %d bytes not sent: %v", len(payload), serr)}
			if serr := h.sendAnswer(to, d.ID, AnswerResponse, ferr, nil, d.tr); serr != nil {
				h.log.Warn("response not sent", "id", d.ID, "to", to, "err", serr)
			}
		}
	}
	return h.sendAnswer(d.answerTo, d.ID, AnswerResponse, err, payload, d.tr)
}

// sendAnswer publishes a late verdict or a response to an answer subject.
//
// tr holds the span context the answer continues (nil: tracing off).
func (h *Host) sendAnswer(to, id, kind string, err error, payload []byte, tr *traceContexts) error {
	if to == "" {
		return nil
	}
	am := answerMsgPool.Get().(*answerMsg)
	defer am.put()
	am.msg.Subject, am.msg.Data = to, payload
	am.set(0, HeaderID, id)
	am.set(1, HeaderAnswer, kind)
	am.set(2, HeaderAnswerToken, AnswerTokenOf(h.answerKey, id))
	injectTrace(am.msg.Header, tr)
	if err == nil { // verdict.Encode's Accepted, without its allocations
		am.set(3, verdict.HeaderVerdict, verdict.Accepted.String())
		am.set(4, verdict.HeaderNode, h.nodeID)
	} else {
		verdict.Encode(am.msg.Header, err, h.nodeID)
	}
	return h.cfg.Conn.PublishMsg(&am.msg)
}

// answerMsg is a pooled answer message (sendAnswer): nats.go copies a
// message into the connection's buffer before PublishMsg returns, so its
// header map and the values' one-element slices serve the next answer.
type answerMsg struct {
	msg  nats.Msg
	vals [5]string
}

var answerMsgPool = sync.Pool{New: func() any { return &answerMsg{msg: nats.Msg{Header: make(nats.Header, 8)}} }}

func (am *answerMsg) set(i int, k, v string) {
	am.vals[i] = v
	am.msg.Header[k] = am.vals[i : i+1 : i+1]
}

func (am *answerMsg) put() {
	h := am.msg.Header
	clear(h)
	*am = answerMsg{msg: nats.Msg{Header: h}}
	answerMsgPool.Put(am)
}

// sendLate publishes e's late verdict; for a request it says so
// (HeaderExpectResponse), so that a sender no longer awaiting it counts it
// as unmatched instead of reading it as a plain delivery's.
func (h *Host) sendLate(e *entry, err error) error { return h.sendLateTo(e.answerTo, e, err) }

// sendLateTo publishes e's late verdict to answer subject to.
func (h *Host) sendLateTo(to string, e *entry, err error) error {
	msg := &nats.Msg{Subject: to, Header: nats.Header{}}
	msg.Header.Set(HeaderID, e.ID)
	msg.Header.Set(HeaderAnswer, AnswerVerdict)
	msg.Header.Set(HeaderAnswerToken, AnswerTokenOf(h.answerKey, e.ID))
	if e.expectResponse {
		msg.Header.Set(HeaderExpectResponse, "true")
	}
	injectTrace(msg.Header, e.tr)
	verdict.Encode(msg.Header, err, h.nodeID)
	return h.cfg.Conn.PublishMsg(msg)
}

// fail settles an accepted entry with a failure, unless the handler took it:
// in the synchronous reply if the intake has not answered yet, else as one
// late answer.
func (h *Host) fail(e *entry, err error) {
	if !e.taken.CompareAndSwap(false, true) {
		return
	}
	e.err = err
	also := h.dedupe.failed(e.rec, err) // a resendable failure forgets the ID: its re-send is accepted
	for _, to := range also {
		// Duplicates accepted from other senders while e was queued.
		if serr := h.sendLateTo(to, e, err); serr != nil {
			h.log.Warn("late verdict not sent", "id", e.ID, "to", to, "err", serr)
		}
	}
	if e.replied.CompareAndSwap(false, true) {
		return // the intake will send err as the reply
	}
	h.late.Add(1)
	h.lateBy[verdict.ReasonOf(err)].Add(1)
	if e.answerTo == "" {
		h.log.Warn("delivery failed after acceptance; sender gave no answer subject", "id", e.ID, "address", string(e.To), "err", err)
		return
	}
	if serr := h.sendLate(e, err); serr != nil {
		h.log.Warn("late verdict not sent", "id", e.ID, "err", serr)
	}
}

// serving reports whether a turn may handle a delivery now: nil, or the
// fence's error once it is known the node will not serve again. While the
// fence only pauses (AwaitServing), it blocks.
func (h *Host) serving() error {
	f := h.cfg.Fence
	if h.cfg.TurnFence != nil {
		f = h.cfg.TurnFence
	}
	if f == nil {
		return nil
	}
	err := f()
	if err == nil {
		return nil
	}
	if w := h.cfg.AwaitServing; w != nil {
		if werr := w(h.ctx); werr == nil {
			return nil
		}
	}
	return err
}

// Deactivate removes addr's activation at once, if any: what it still had
// queued fails late with ShuttingDown, the hub's Deactivate runs, and the
// claim is released. It blocks until a handler in progress returns.
func (h *Host) Deactivate(addr subjects.Address) {
	h.mu.Lock()
	a := h.activations[addr]
	delete(h.activations, addr)
	h.mu.Unlock()
	if a == nil {
		return
	}
	a.close(verdict.New(verdict.ReasonNotOwner, "activation %s on %s stood down before handling", addr, h.nodeID))
	for {
		a.mu.Lock()
		running := a.running
		a.mu.Unlock()
		if !running {
			break
		}
		time.Sleep(time.Millisecond)
	}
	a.deactivate()
}

// StandDown removes the activation that holds the claim t, if one still
// does: this node lost that claim (the directory's verifier found it taken
// or fenced). An activation of the same address holding a newer claim is
// left alone. What the activation had queued fails late with a resendable
// not-the-owner verdict; it starts no further turn. StandDown does not wait
// for a turn in progress: that turn deactivates the hub and releases the
// claim when it returns. Safe for concurrent use.
func (h *Host) StandDown(t ClaimToken) {
	h.mu.Lock()
	a := h.activations[t.Addr]
	if a == nil || a.claimToken().ID != t.ID {
		h.mu.Unlock()
		return
	}
	delete(h.activations, t.Addr)
	h.mu.Unlock()
	a.close(&verdict.Error{Reason: verdict.ReasonNotOwner, Message: fmt.Sprintf("activation %s on %s stood down before handling: its claim was lost", t.Addr, h.nodeID), Node: h.nodeID})
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

// Addresses returns the addresses with a live activation, in no order.
func (h *Host) Addresses() []subjects.Address {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]subjects.Address, 0, len(h.activations))
	for a := range h.activations {
		out = append(out, a)
	}
	return out
}

// Stats returns the host's counters.
func (h *Host) Stats() Stats {
	h.mu.RLock()
	n := len(h.activations)
	claiming, parked := len(h.claiming), h.parked
	q := 0
	for _, a := range h.activations {
		a.mu.Lock()
		q += len(a.queue) - a.head
		a.mu.Unlock()
	}
	h.mu.RUnlock()
	return Stats{
		Node: h.cfg.Node, Activations: n, Queued: q,
		Accepted: h.accepted.Load(), DedupeHits: h.dedupeHits.Load(), Refused: h.refused.Load(),
		Handled: h.handled.Load(), Late: h.late.Load(), Deactivated: h.deactivated.Load(),
		BreakerRefusals: h.breakerRefusals.Load(),
		Claiming:        claiming, Parked: parked, ParkRefused: h.parkRefused.Load(),
		RefusedByReason: byReason(&h.refusedBy), LateByReason: byReason(&h.lateBy),
	}
}

func byReason(c *[256]atomic.Int64) map[string]int64 {
	var out map[string]int64
	for r := range c {
		if n := c[r].Load(); n > 0 {
			if out == nil {
				out = map[string]int64{}
			}
			out[verdict.Reason(r).String()] = n
		}
	}
	return out
}

// TurnDurations returns the histogram of handler turn durations (Handle's
// call to its return) on this host.
func (h *Host) TurnDurations() histo.Snapshot { return h.turns.Snapshot() }

// janitor collects idle activations every quarter of the idle timeout.
func (h *Host) janitor() {
	defer h.wg.Done()
	every := max(h.cfg.IdleTimeout/4, 5*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
			h.collectIdle(time.Now().Add(-h.cfg.IdleTimeout))
		}
	}
}

func (h *Host) collectIdle(before time.Time) {
	var idle []*activation
	h.mu.Lock()
	for addr, a := range h.activations {
		a.mu.Lock()
		if a.idleSince(before) {
			a.state = stateClosed
			delete(h.activations, addr)
			idle = append(idle, a)
		}
		a.mu.Unlock()
	}
	h.mu.Unlock()
	for _, a := range idle {
		a.deactivate()
	}
}

// Drain stops accepting (new deliveries are refused ShuttingDown), waits
// until every accepted delivery is handled or ctx's deadline nears, fails
// whatever is still queued with a late ShuttingDown, flushes those late
// verdicts to the server, deactivates every activation and unsubscribes. The
// last quarter of the time to ctx's deadline (at most 500 ms) is kept for
// failing and flushing, so every late verdict is on its way to its sender
// by the deadline, when the caller may close the connection or stop an
// embedded server. It returns context.DeadlineExceeded (or ctx's error) if
// not everything was handled. Safe to call more than once.
func (h *Host) Drain(ctx context.Context) error {
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
	// The tail of the deadline is kept for settling: the late verdicts of
	// whatever is still queued must reach their senders (published and
	// flushed to the server) before the caller's deadline, after which the
	// connection — and an embedded server — may go at once.
	wait := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, deadline.Add(-settleReserve(time.Until(deadline))))
		defer cancel()
	}
	var werr error
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for h.busy() {
		select {
		case <-wait.Done():
			werr = ctx.Err()
			if werr == nil {
				werr = context.DeadlineExceeded // the reserve began: the same deadline, cut short
			}
		case <-tick.C:
			continue
		}
		break
	}
	grace := DefaultCloseWait
	if werr != nil {
		grace = drainGrace // the deadline passed: do not wait much longer
	}
	h.closeWithin(grace, ctx)
	return werr
}

// settleReserve is the part of a drain's remaining time kept for failing
// what is still queued and flushing those late verdicts: a quarter of it, at
// most 500 ms.
func settleReserve(remaining time.Duration) time.Duration {
	return min(max(remaining, 0)/4, 500*time.Millisecond)
}

// DefaultCloseWait bounds how long Close waits for handlers that ignore the
// cancellation of their ctx; after it they are abandoned (and logged).
const DefaultCloseWait = 10 * time.Second

// drainGrace is how long a Drain whose ctx ended still waits for handlers
// to return after cancelling them.
const drainGrace = time.Second

// busy reports whether any activation has queued or running work.
func (h *Host) busy() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, a := range h.activations {
		a.mu.Lock()
		b := a.running || a.head < len(a.queue)
		a.mu.Unlock()
		if b {
			return true
		}
	}
	return false
}

// Close unsubscribes, fails every queued delivery with a late ShuttingDown,
// cancels builds and handlers, waits for them (at most DefaultCloseWait: a
// handler that ignores its ctx is abandoned and logged) and deactivates
// every activation. Safe to call more than once.
func (h *Host) Close() { h.closeWithin(DefaultCloseWait, nil) }

// closeWithin closes the host, waiting at most wait for handlers; if flush
// is set, the late verdicts of what was still queued are flushed to the
// server, bounded by flush's deadline (2 s without one), before the wait.
func (h *Host) closeWithin(wait time.Duration, flush context.Context) {
	h.mu.Lock()
	h.draining = true
	sub := h.sub
	h.sub = nil
	all := make([]*activation, 0, len(h.activations))
	for addr, a := range h.activations {
		all = append(all, a)
		delete(h.activations, addr)
	}
	h.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	for _, a := range all {
		a.close(verdict.New(verdict.ReasonHubShuttingDown, "activation %s on %s deactivated before handling", a.addr, h.nodeID))
	}
	if flush != nil {
		fctx := flush
		if _, ok := fctx.Deadline(); !ok {
			var cancel context.CancelFunc
			fctx, cancel = context.WithTimeout(fctx, 2*time.Second)
			defer cancel()
		}
		if err := h.cfg.Conn.FlushWithContext(fctx); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			h.log.Warn("late verdicts of the drain not confirmed flushed", "err", err)
		}
	}
	h.cancel()
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		h.log.Error("handlers or builds ignore their cancelled ctx; abandoning them", "waited", wait.String())
	}
	for _, a := range all {
		a.mu.Lock()
		stuck := a.running
		a.mu.Unlock()
		if stuck {
			continue // its hub is still in use: do not deactivate under it
		}
		a.deactivate() // a build still running deactivates it when it returns
	}
}
