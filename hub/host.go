package hub

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/internal/clock"
	"github.com/natsmesh/natsmesh/internal/histo"
	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// ClaimTimeout bounds the KV work of a directory claim on the intake.
const ClaimTimeout = 2 * time.Second

// TakeoverWait is how long beyond ClaimTimeout a claim may wait for a
// departed owner's fencing delay (membership.DefaultFencingDelay, 2 s),
// its parked deliveries with it; a longer wait is refused resendable. A
// parked delivery's sender awaits its reply meanwhile: ClaimTimeout plus
// TakeoverWait stays under the Go sender's leg timeout (5 s).
const TakeoverWait = 2 * time.Second

// Defaults for zero Config fields.
const (
	DefaultInboxSize        = 1024
	DefaultIdleTimeout      = 5 * time.Minute
	DefaultParkPerAddress   = 256
	DefaultParkBacklog      = 16384
	DefaultClaimConcurrency = 128
	DefaultLaneWindow       = 256
)

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
	// LaneWindow is the most legs of one sending lane the intake grants in
	// flight at once (HeaderWindow), in deliveries; the grant is smaller
	// while the activation's inbox is filling (half its free room). Zero
	// means DefaultLaneWindow; at most InboxSize and MaxWindow.
	LaneWindow int
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
	// Clock is the host's time source: idle collection (IdleTimeout, the
	// janitor's ticker), the storm breaker's windows, a turn's re-gate
	// after a pause and the lanes' idle eviction run on it, so a test can
	// drive them with a fake clock. Nil means the real clock. Drain's and
	// Close's bounds and the turn-duration metric stay on the real clock
	// (they bound or measure real time).
	Clock clock.Clock
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
	if c.LaneWindow < 0 {
		return fmt.Errorf("%w: negative LaneWindow", ErrInvalidConfig)
	}
	if c.LaneWindow == 0 {
		c.LaneWindow = DefaultLaneWindow
	}
	c.LaneWindow = min(c.LaneWindow, c.InboxSize, MaxWindow)
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
	c.Clock = clock.Or(c.Clock)
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
	// compactAccepted is the payload of every compact Accepted reply
	// (HeaderAccept): CompactAccepted, then the answer key; shared
	// read-only (nats.go copies it into its buffer when publishing).
	compactAccepted []byte
	answerKey       string // this generation's answer key (answer.go)
	log             *slog.Logger
	dedupe          *dedupe
	breaker         *breaker // nil: off

	kindsMu sync.RWMutex
	kinds   map[string]Factory

	mu          sync.RWMutex
	activations map[subjects.Address]*activation
	// retiring holds, per address, an activation taken out of activations
	// while a turn of it may still run (StandDown, standDown): the
	// address's next activation on this node builds only once it finished
	// (activation.prev), so that no two of its turns ever overlap here.
	retiring map[subjects.Address]*activation
	claiming map[subjects.Address]*claimOp // cold addresses whose claim is in flight
	idle     idleQueue                     // the janitor's agenda (idle.go)
	parked   int                           // deliveries parked on claiming, node-wide
	draining bool
	sub      *nats.Subscription
	claimSem chan struct{}
	// claimQ holds pipelined claims waiting for a slot of claimSem, in
	// arrival order (startClaim, releaseClaimSlot); claimQMu guards it,
	// and makes "no slot free" and "queued" one step against a slot freed
	// meanwhile.
	claimQMu sync.Mutex
	claimQ   []*claimOp

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
		br = newBreaker(cfg.BreakerRate, cfg.Clock.Now)
	}
	return &Host{
		acceptedHdr:     acceptedHdr,
		compactAccepted: append([]byte{CompactAccepted}, answerKey...),
		answerKey:       answerKey,
		ansPrefix:       cfg.Prefix.Sub(AnswerToken + "."),
		cfg:             cfg,
		tracer:          meshtrace.Tracer(cfg.TracerProvider),
		nodeID:          cfg.Node.String(),
		log:             cfg.Logger.With("node", cfg.Node.String()),
		dedupe:          newDedupe(cfg.DedupeWindow, max(cfg.DedupeResponseBytes, 0)),
		breaker:         br,
		kinds:           map[string]Factory{},
		activations:     map[subjects.Address]*activation{},
		retiring:        map[subjects.Address]*activation{},
		claiming:        map[subjects.Address]*claimOp{},
		claimSem:        make(chan struct{}, cfg.ClaimConcurrency),
		ctx:             ctx,
		cancel:          cancel,
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

// maxAnswerSubjectLen bounds an answer subject (bytes).
const maxAnswerSubjectLen = 512

var answerMsgPool = sync.Pool{New: func() any { return &answerMsg{msg: nats.Msg{Header: make(nats.Header, 8)}} }}

// Addresses returns the addresses with a live activation, in no order: not
// one that Deactivate closed and that waits for its turn in progress.
func (h *Host) Addresses() []subjects.Address {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]subjects.Address, 0, len(h.activations))
	for addr, a := range h.activations {
		a.mu.Lock()
		closed := a.state == stateClosed
		a.mu.Unlock()
		if !closed {
			out = append(out, addr)
		}
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

// DefaultCloseWait bounds how long Close waits for handlers that ignore the
// cancellation of their ctx; after it they are abandoned (and logged).
const DefaultCloseWait = 10 * time.Second

// drainGrace is how long a Drain whose ctx ended still waits for handlers
// to return after cancelling them.
const drainGrace = time.Second
