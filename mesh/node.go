package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// NodeConfig holds a Node's settings. Conn and Name are required.
type NodeConfig struct {
	// Conn is the node's NATS connection. Required.
	Conn *nats.Conn
	// Name is the node name, [A-Za-z0-9_-]{1,64}. Required.
	Name string
	// TracerProvider traces the node's deliveries, ingress, intakes and
	// turns (OpenTelemetry, docs/protocol.md §8c): it is given to the
	// client (WithTracerProvider) and to the host (hub.Config) unless
	// Host.TracerProvider is set. nil, the default, turns tracing off.
	TracerProvider trace.TracerProvider
	// Generation is this incarnation's generation without membership;
	// zero means the start time in nanoseconds since the epoch. With
	// membership the registry assigns it (strictly increasing per name).
	Generation uint64
	// Prefix is the subject prefix; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Resolver maps addresses to owners; nil means every address is owned
	// by this node (a one-node mesh).
	Resolver Resolver
	// Host tunes the receiving side (inbox size, dedupe window, idle
	// timeout, claims); its Conn, Node, Prefix and Logger are set by the
	// Node, and a nil Clock is the node's (WithClock).
	Host hub.Config
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// DisableIngress turns off serving <prefix>.in.*.* (on by default).
	DisableIngress bool
	// DisableControl turns off the micro service and control endpoints
	// (on by default).
	DisableControl bool
	// OnDrainRequest runs when a drain is requested over the control
	// subject (meshctl drain); nil means Drain with DefaultDrainTimeout.
	// A daemon sets it to begin its own shutdown.
	OnDrainRequest func()
	// CallerIdentity says where the ingress takes an outside caller's
	// identity from (DESIGN §10; SECURITY.md): the dedupe window and kept
	// answers are per (caller, delivery ID). Zero means CallerFromInbox.
	CallerIdentity CallerIdentity
	// IngressCallerRate, if positive, limits each caller's ingress
	// deliveries to that many per second (a token bucket holding
	// IngressCallerBurst); one over it is answered Ignored
	// (verdict.ErrStormBreaker) before anything is sent. Zero means no
	// limit. At most 4096 callers are tracked one by one; beyond, new
	// callers share one bucket (ingress_fair.go).
	IngressCallerRate float64
	// IngressCallerBurst is the bucket of IngressCallerRate, in
	// deliveries; zero means the rate (at least 1).
	IngressCallerBurst int
	// ClientInboxes are the inbox prefixes of the account's client users,
	// one per user (profiles.Mesh.ClientInbox, e.g. "_INBOX.alice"), for
	// the reply rules of CallerFromInbox mode (SECURITY.md): the ingress
	// refuses a reply under one of them that is not that prefix plus one
	// or two tokens (nats.go's shapes), so a caller cannot name another
	// user's inbox while keeping a scope of its own. Nil: only the nodes'
	// inbox is refused.
	ClientInboxes []string
	// IngressConcurrency bounds ingress deliveries forwarded at once;
	// zero means DefaultIngressConcurrency (4096).
	IngressConcurrency int
	// IngressCallerShare is how many of the IngressConcurrency slots one
	// caller (CallerIdentity; all fire-and-forget deliveries are the one
	// caller "anon") may take while any is free; beyond it a caller takes
	// a slot only while less than half of them are held, and is otherwise
	// answered Ignored (verdict.ErrInboxFull). Zero means IngressConcurrency /
	// DefaultIngressCallerShareDivisor (256 of 4096), at least 1.
	IngressCallerShare int
	// IngressPlacementWaits bounds the ingress deliveries that wait for a
	// node hosting their kind to appear (the sender's placement wait,
	// WithPlacementWait), apart from IngressConcurrency: such a delivery
	// gives its ingress slot back and holds one of these instead, shared
	// fairly as above (a caller's share is a sixteenth); one that finds
	// none fails at once with verdict.ErrNoPlacement (Unavailable,
	// resendable), not waited for. Zero means IngressConcurrency /
	// DefaultIngressPlacementWaitsDivisor (512 of 4096), at least 1.
	IngressPlacementWaits int
	// Membership, when set, makes the node part of a multi-node mesh (see
	// MembershipConfig); Generation is then chosen at Start by the
	// registry. Nil means a one-node mesh.
	Membership *MembershipConfig
	// OnMembershipEvent, if set, receives every membership event (joins
	// and departures of other generations, across rejoins), e.g. for
	// metrics. It runs on the membership watcher; it must not block.
	OnMembershipEvent func(membership.Event)
	// OnFatal, if set, is called when the node cannot go on: its name was
	// taken over by a newer live incarnation (it must not rejoin). A
	// daemon exits. Without it the node just stops serving.
	OnFatal func(error)
}

// MembershipConfig turns on the multi-node mesh (DESIGN §5–§6): the node
// registers in the KV registry with a generation of its own, claims
// addresses in the KV directory before activating them, resolves addresses
// through the directory and placement, fails everything in flight to a
// departed generation at once, and fences itself (serves nothing, then
// rejoins with a fresh generation) when it was declared gone. Zero fields
// take the defaults of packages membership and directory.
//
// The node's NATS connection should ping as membership.ClientPingInterval
// and membership.ClientMaxPingsOut say, so that a silently cut link is
// noticed within the fencing delay (docs/operations.md, "Membership
// timing").
type MembershipConfig struct {
	Heartbeat    time.Duration // registry heartbeat (default membership.DefaultHeartbeat, 1 s)
	TTL          time.Duration // silence while the registry takes writes that declares a node gone (default membership.DefaultTTL, 8 s)
	FencingDelay time.Duration // wait after a departure before taking its addresses over (default membership.DefaultFencingDelay, 2 s)
	Replicas     int           // KV replicas (default 1; 3 on a 3-server cluster)
	// PlacementCluster places the buckets and streams this node creates
	// (registry, directory, state, reminders) in the NATS cluster of that
	// name: a supercluster's home cluster (DESIGN §12). Empty: the
	// server's default, the cluster of the first node to create them.
	PlacementCluster string
	AdvisorySubject  string        // client-disconnect advisories (default membership.DefaultAdvisorySubject; "-" disables)
	VerifyInterval   time.Duration // claim re-verification (default 2 s)
	// Replace lets Start supersede a live, still-heartbeating generation
	// of the node's name; without it Start fails with
	// membership.ErrNameInUse before writing to the registry.
	Replace bool
	// Subscriber registers the node as a subscriber (membership.Member's
	// Subscriber): a process that hosts nothing and only follows sync
	// streams, shown apart from the mesh's nodes.
	Subscriber bool
	// StateReplicas is the replica count of the durable hub state bucket
	// (DESIGN §7a, package hubstate), used by the node that creates it;
	// zero means Replicas. Use 3 on a 3-server cluster.
	StateReplicas int
	// StateMaxValueSize is the largest state one address may save, in
	// bytes; zero means hubstate.DefaultMaxValueSize (lowered to what fits
	// the server's max_payload). A larger save fails with
	// hub.ErrStateTooLarge before anything is written.
	StateMaxValueSize int
	// Predecessors are generations of the node's name proven to have
	// exited (membership.Config.Predecessors): a registered one is
	// superseded at once, and survivors take its addresses over without
	// the fencing delay. meshd reads them from its data directory, whose
	// OS lock proves the processes that recorded them gone. Naming a
	// generation whose process may live lets two processes serve.
	Predecessors []uint64
	// OnGeneration, if set, is called with each generation of the node
	// before it is announced (at Start and at every rejoin); an error
	// stops that join. meshd records the generation in its data
	// directory there, so that the next process on the directory can
	// prove it gone.
	OnGeneration func(subjects.NodeID) error
	// DisableState opens no state bucket: hub.LoadState fails with
	// hub.ErrNoStateStore (the kv kind then keeps its map in memory only).
	DisableState bool
	// DisableReminders opens no reminders stream and runs no reminder
	// runner (DESIGN §13, package mesh/reminders): Node.Reminders is nil.
	DisableReminders bool
	// ReminderReplicas is the replica count of the reminders stream and
	// its consumer, used by the node that creates them; zero means
	// StateReplicas, then Replicas. Use 3 on a 3-server cluster.
	ReminderReplicas int
	// ReminderAckWait is how long a fire held by a node that went silent
	// waits before another node delivers it; zero means
	// reminders.DefaultAckWait (10 s). The last node to start sets it.
	ReminderAckWait time.Duration
}

// Node is one mesh process: a hub host that receives deliveries for its node
// generation and a client that sends them. Safe for concurrent use.
type Node struct {
	*Client
	cfg     NodeConfig
	conn    *nats.Conn
	prefix  subjects.Prefix
	log     *slog.Logger
	started time.Time
	opts    []Option

	// kindsMu serializes putting the registered kinds on a session
	// (applyKinds): Register's and a new session's, so that a kind
	// registered while a rejoin installs the next session reaches it, and
	// announcements never overtake one another with an older list.
	kindsMu sync.Mutex

	mu        sync.RWMutex
	inc       *session          // the current session: everything stamped with the generation
	ended     hub.Stats         // the counters of the sessions that ended (addStats), so the node's never go back
	state     hub.StateStore    // durable hub state, opened at the first join
	rem       *reminders.Store  // the reminders stream, opened at the first join (nil: none)
	remRunner *reminders.Runner // delivers this node's share of the fires (nil: none)
	kinds     map[string]hub.Factory
	running   bool

	ingressSub              *nats.Subscription // the ingress queue subscription (guarded by ingressMu: a move replaces it)
	ingressPaused           bool               // a move drained ingressSub and has not subscribed again (guarded by ingressMu)
	ingressPool             *fairPool          // slots of forwarded ingress deliveries (ingress_fair.go)
	placementPool           *fairPool          // slots of ingress deliveries waiting for placement
	ingressShareRefused     atomic.Int64       // ingress deliveries answered Ignored: the pool or the caller's share was full
	ingressPlacementRefused atomic.Int64       // ingress deliveries failed at once: no placement wait left for their caller
	rates                   *callerRates       // nil: no per-caller rate limit
	callerCounts            callerCounts
	ingressRateLimited      atomic.Int64   // ingress deliveries answered Ignored: over their caller's rate
	inboxReplies            atomic.Int64   // ingress requests refused by the reply rules (replyRule)
	unanswered              atomic.Int64   // fire-and-forget ingress deliveries that failed (logged at powers of two)
	ingressMu               sync.Mutex     // orders enterIngress against stopIngress
	ingressShut             bool           // stopIngress ran: no forward is registered any more (guarded by ingressMu)
	ingressWG               sync.WaitGroup // the forwards registered by enterIngress
	ingressHook             func()         // tests: runs in the ingress callback before a forward is registered
	ingressCount            atomic.Int64
	tracer                  trace.Tracer // the ingress's; nil: tracing off
	badReplies              atomic.Int64 // ingress and control requests refused for their reply subject
	refusedNodeOnly         atomic.Int64 // ingress deliveries refused: a node-only type or an internal kind
	svcMu                   sync.Mutex
	svcStopped              bool
	draining                atomic.Bool

	departures atomic.Int64 // departures of other generations observed
	rejoins    atomic.Int64 // times this node was fenced and rejoined
	fenced     atomic.Int64 // times a generation of this node was declared gone (fenced)
	superseded atomic.Int64 // times a newer generation of the name superseded this node
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// NewNode validates cfg and builds a node; register hub kinds with
// [Node.Register], then call [Node.Start]. opts tune the sending side;
// WithClock among them is the node's one clock (hub host, membership,
// directory, state store, reminder runner, sync streams: see [Clock]).
// Errors match [ErrInvalidConfig] or hub.ErrInvalidConfig.
func NewNode(cfg NodeConfig, opts ...Option) (*Node, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil", ErrInvalidConfig)
	}
	if cfg.Generation == 0 {
		cfg.Generation = uint64(time.Now().UnixNano()) // real clock: a generation is on the wire and in the registry
	}
	id := subjects.NodeID{Name: cfg.Name, Generation: cfg.Generation}
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = subjects.DefaultPrefix
	}
	if err := cfg.Prefix.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for _, in := range cfg.ClientInboxes {
		if !cfg.Prefix.SafeReply(in) || in == cfg.Prefix.NodeInbox() || strings.HasPrefix(in, cfg.Prefix.NodeInbox()+".") {
			return nil, fmt.Errorf("%w: client inbox prefix %q: want a literal subject outside $, the prefix and the nodes' inbox", ErrInvalidConfig, in)
		}
	}
	if cfg.IngressConcurrency <= 0 {
		cfg.IngressConcurrency = DefaultIngressConcurrency
	}
	if cfg.IngressCallerShare <= 0 {
		cfg.IngressCallerShare = max(1, cfg.IngressConcurrency/DefaultIngressCallerShareDivisor)
	}
	if cfg.IngressPlacementWaits <= 0 {
		cfg.IngressPlacementWaits = max(1, cfg.IngressConcurrency/DefaultIngressPlacementWaitsDivisor)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{
		cfg: cfg, conn: cfg.Conn, prefix: cfg.Prefix, opts: opts, tracer: meshtrace.Tracer(cfg.TracerProvider),
		log: cfg.Logger.With("node", cfg.Name), started: time.Now(), // real clock: reported on the control API
		ingressPool:   newFairPool(cfg.IngressConcurrency, cfg.IngressCallerShare),
		rates:         newCallerRates(cfg.IngressCallerRate, cfg.IngressCallerBurst),
		placementPool: newFairPool(cfg.IngressPlacementWaits, cfg.IngressPlacementWaits/DefaultIngressCallerShareDivisor),
		kinds:         map[string]hub.Factory{},
		ctx:           ctx, cancel: cancel,
	}
	res := cfg.Resolver
	switch {
	case cfg.Membership != nil && res == nil:
		res = nodeResolver{n}
	case res == nil:
		res = StaticResolver{Node: id}
	}
	base := []Option{WithLogger(cfg.Logger), WithTracerProvider(cfg.TracerProvider)}
	if cfg.Membership != nil {
		// Liveness is the cluster view's (DESIGN §9), read through the
		// current session (Node.Gone), so it follows a rejoin.
		base = append(base, WithView(n))
	}
	c, err := NewClient(Config{Conn: cfg.Conn, Resolver: res, Identity: id, Prefix: cfg.Prefix},
		append(base, opts...)...)
	if err != nil {
		return nil, err
	}
	n.Client = c
	if cfg.Membership == nil {
		// One node: the generation is fixed now.
		h, err := n.newHost(id, nil, nil, nil, nil)
		if err != nil {
			return nil, err
		}
		n.inc = newSession()
		n.inc.id, n.inc.host = id, h
	}
	return n, nil
}

// addStats adds the cumulative counters of b to a (gauges are left alone:
// they describe the current session only).
func addStats(a *hub.Stats, b hub.Stats) {
	a.Accepted += b.Accepted
	a.DedupeHits += b.DedupeHits
	a.Refused += b.Refused
	a.Handled += b.Handled
	a.Late += b.Late
	a.Deactivated += b.Deactivated
	a.ParkRefused += b.ParkRefused
	a.BreakerRefusals += b.BreakerRefusals
	for _, m := range []struct {
		dst *map[string]int64
		src map[string]int64
	}{{&a.RefusedByReason, b.RefusedByReason}, {&a.LateByReason, b.LateByReason}} {
		for k, v := range m.src {
			if *m.dst == nil {
				*m.dst = map[string]int64{}
			}
			(*m.dst)[k] += v
		}
	}
}

// hostStats returns the hub counters of the node across its sessions (each
// rejoin starts a new host, whose own counters start at zero) and the
// current session's gauges.
func (n *Node) hostStats() hub.Stats {
	n.mu.RLock()
	total := n.ended
	total.RefusedByReason, total.LateByReason = maps.Clone(total.RefusedByReason), maps.Clone(total.LateByReason)
	inc := n.inc
	n.mu.RUnlock()
	if inc == nil {
		return total
	}
	cur := inc.host.Stats()
	addStats(&cur, total)
	return cur
}

func (n *Node) current() *session {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.inc
}

// Session is one snapshot of the node's current generation (DESIGN §1): its
// identity, its receiving side and its membership view, read together, so
// that a rejoin between separate reads cannot mix two generations. Done is
// closed once the node has moved on — to its next generation after a
// rejoin (once that one is installed: Node.Session then returns it), or
// for good (Close, Drain): whatever was armed on this snapshot re-arms on a
// new one then, with no polling. A node without a session (before Start
// with membership) gives a zero ID, a nil Host and a closed Done.
type Session struct {
	ID      subjects.NodeID
	Host    *hub.Host
	Members *membership.Membership // nil without membership
	Done    <-chan struct{}
}

// closedChan is the Done of no session.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Session returns a snapshot of the node's current generation. Safe for
// concurrent use; it does not block.
func (n *Node) Session() Session {
	inc := n.current()
	if inc == nil {
		return Session{Done: closedChan}
	}
	return Session{ID: inc.id, Host: inc.host, Members: inc.members, Done: inc.done}
}

// ID returns the node's current generation (zero before Start with
// membership).
func (n *Node) ID() subjects.NodeID {
	if inc := n.current(); inc != nil {
		return inc.id
	}
	return subjects.NodeID{}
}

// Host returns the current generation's receiving side (nil before Start
// with membership).
func (n *Node) Host() *hub.Host {
	if inc := n.current(); inc != nil {
		return inc.host
	}
	return nil
}

// Members returns the node's membership view, or nil without membership.
func (n *Node) Members() *membership.Membership {
	if inc := n.current(); inc != nil {
		return inc.members
	}
	return nil
}

// Directory returns the node's directory handle, or nil without membership.
func (n *Node) Directory() *directory.Directory {
	if inc := n.current(); inc != nil {
		return inc.dir
	}
	return nil
}

// Register installs the hub factory for an address kind on the current
// session and every later one (a rejoin's included, even one installed
// while Register runs), and announces the kind in the registry so placement
// can use this node for it. It blocks on the registry write (at most 5 s).
// Errors match hub.ErrKindRegistered, or report that the announcement
// failed while the session's registration is still valid: the kind stays
// registered, and the next Register or session announces it again. Safe
// for concurrent use.
func (n *Node) Register(kind string, f hub.Factory) error {
	n.mu.Lock()
	if _, ok := n.kinds[kind]; ok {
		n.mu.Unlock()
		return fmt.Errorf("%w: %q", hub.ErrKindRegistered, kind)
	}
	n.kinds[kind] = f
	n.mu.Unlock()
	inc, err := n.applyKinds()
	if err != nil && inc != nil && inc.members != nil && (errors.Is(err, membership.ErrLost) || inc.members.IsLost() || n.current() != inc) {
		// That session's registration is gone: the next session
		// registers and announces every kind (installKinds).
		err = nil
	}
	if err != nil {
		return fmt.Errorf("mesh: announce kind %q: %w", kind, err)
	}
	return nil
}

// applyKinds puts every registered kind on the current session: on its
// host, and into its registry entry if that lists fewer. It returns the
// session it worked on (nil before Start with membership) and the
// announcement's error. Serialized by kindsMu.
func (n *Node) applyKinds() (*session, error) {
	n.kindsMu.Lock()
	defer n.kindsMu.Unlock()
	n.mu.RLock()
	inc := n.inc
	kinds := maps.Clone(n.kinds)
	n.mu.RUnlock()
	if inc == nil {
		return nil, nil // Start registers them all
	}
	for k, f := range kinds {
		_ = inc.host.Register(k, f) // ErrKindRegistered: it has it
	}
	if inc.members == nil {
		return inc, nil
	}
	names := placedKinds(kinds)
	if slices.Equal(names, inc.announced) {
		return inc, nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	if err := inc.members.SetKinds(ctx, names); err != nil {
		return inc, err
	}
	inc.announced = names
	return inc, nil
}

// installKinds puts every registered kind on a session just installed
// (Start, a rejoin): a Register that ran while the session joined may have
// reached only the one before.
func (n *Node) installKinds() {
	if _, err := n.applyKinds(); err != nil {
		n.log.Warn("could not announce the registered kinds", "generation", n.ID().String(), "err", err)
	}
}

// kindNames returns the registered kinds placement may use, sorted.
func (n *Node) kindNames() []string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return placedKinds(n.kinds)
}

// placedKinds returns the kinds of kinds that placement may use (internal
// kinds, "_…", are never placed), sorted.
func placedKinds(kinds map[string]hub.Factory) []string {
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		if !strings.HasPrefix(k, "_") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// newHost builds a host for generation id with the registered kinds.
func (n *Node) newHost(id subjects.NodeID, claims hub.Claims, fence, turnFence func() error, await func(context.Context) error) (*hub.Host, error) {
	hc := n.cfg.Host
	hc.Conn, hc.Node, hc.Prefix, hc.Logger = n.conn, id, n.prefix, n.cfg.Logger
	if hc.TracerProvider == nil {
		hc.TracerProvider = n.cfg.TracerProvider
	}
	if hc.Clock == nil {
		hc.Clock = n.Clock() // the node's one clock (WithClock)
	}
	n.mu.RLock()
	if hc.State == nil && n.state != nil {
		hc.State = n.state
	}
	n.mu.RUnlock()
	if claims != nil {
		hc.Claims = claims
	}
	if fence != nil {
		hc.Fence, hc.TurnFence, hc.AwaitServing = fence, turnFence, await
	}
	h, err := hub.New(hc)
	if err != nil {
		return nil, err
	}
	n.mu.RLock()
	for k, f := range n.kinds {
		_ = h.Register(k, f)
	}
	n.mu.RUnlock()
	return h, nil
}

// DefaultStartTimeout bounds joining the membership in Start.
const DefaultStartTimeout = 30 * time.Second

// StateStore returns the node's durable hub state store (DESIGN §7a): the
// Host config's, or the bucket opened at join; nil before Start or when
// disabled.
func (n *Node) StateStore() hub.StateStore {
	if n.cfg.Host.State != nil {
		return n.cfg.Host.State
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.state
}
