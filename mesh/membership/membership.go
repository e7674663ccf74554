// Package membership keeps the mesh's node registry (DESIGN §6): each node
// generation registers under its name in a JetStream KV bucket and refreshes
// the entry with a heartbeat. Every node watches the registry and the NATS
// server's client-disconnect advisory and reports departures as events.
//
// A connection is not a generation. Proof that a generation is gone is one
// of: its own leave (Left); a newer generation of its name (Superseded); a
// disconnect advisory whose reason says the client side closed or went stale
// (Disconnected: a crash closes the socket, a frozen or partitioned process
// stops answering the server's pings); heartbeat silence past the TTL while
// the registry was taking writes (Expired). A node's NATS server restarting,
// its lame duck mode, a reconnect to another server or a JetStream leader
// election prove nothing: an advisory with reason "Server Shutdown", or a
// heartbeat from a new connection, or the node's own notice on reconnect
// (<prefix>.mv.<name>.<gen>, over core NATS, so it does not wait for a
// registry that is electing a leader), is reported as Moved (not a
// departure): what was in flight to that node may be lost in transit and is
// re-sent.
//
// Silence is measured on a registry clock that runs only while this node's
// registry watcher delivers fresh writes (any node's heartbeats, its own
// included): nothing is expired for silence while the registry had no
// leader, nor by a node whose watcher is blind (its consumer died with a
// NATS server; it is restarted once it lags the node's own heartbeat).
// The bucket's own MaxAge is only a backstop (BackstopFactor × TTL).
//
// Generations are strictly increasing per name: a node registers with
// max(now in ns, the registered generation + 1), under a revision check.
// Presence is keyed by name and generation, never by name alone.
package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/subjects"
)

// Defaults for zero Config fields, and the connection settings a node's
// NATS connection should use (see docs/operations.md, "Membership timing").
//
// The TTL outlasts a JetStream leader election (2.7–5.5 s measured on a
// 3-server cluster) with two heartbeats to spare; since silence is counted
// only while the registry takes writes, an election does not count against
// it either way. The client ping bound (ClientPingInterval ×
// (ClientMaxPingsOut+1) = 1.5 s) is no longer than the server's
// (ping_interval 500ms, ping_max 2 on the embedded server; recommended for
// an external cluster), and the fencing delay covers it: survivors take a
// departed generation's addresses over only once that generation has had
// time to notice its own link dropped and stop starting turns.
const (
	DefaultHeartbeat    = time.Second
	DefaultTTL          = 8 * time.Second
	DefaultFencingDelay = 2 * time.Second
	// ClientPingInterval and ClientMaxPingsOut are the nats.go ping
	// settings of a node's connection: a silently dropped link is noticed
	// within ClientPingInterval × (ClientMaxPingsOut+1).
	ClientPingInterval = 500 * time.Millisecond
	ClientMaxPingsOut  = 2
	// ClientReconnectWait is the nats.go reconnect wait of a node's
	// connection (with nats.go's default jitter).
	ClientReconnectWait = 250 * time.Millisecond
	// BackstopFactor × TTL is the registry bucket's MaxAge: it removes
	// entries nobody judged (for instance every node of the mesh crashed).
	BackstopFactor = 8
	// DefaultAdvisorySubject is where a node listens for client-disconnect
	// advisories: the system account's subject as imported into the
	// application account (docs/operations.md). Where the import is
	// missing nothing arrives and the heartbeat TTL detects departures.
	DefaultAdvisorySubject = "$SYS.ACCOUNT.*.DISCONNECT"
	// ConnNamePrefix starts the NATS connection name of every mesh node:
	// "natsmesh <name>" (docs/operations.md). Advisories are matched to a
	// generation by the server and client IDs in its registry entry.
	ConnNamePrefix = "natsmesh "
)

// metaTTL is the registry bucket's metadata key holding the mesh's TTL.
const metaTTL = "natsmesh_ttl"

var (
	// ErrInvalidConfig: a required Config field is missing or invalid.
	ErrInvalidConfig = errors.New("membership: invalid config")
	// ErrLost: this node's registration was removed or superseded (it was
	// declared gone); it must stop serving and rejoin with a new
	// generation.
	ErrLost = errors.New("membership: registration lost")
	// ErrClosed: the membership was closed or left.
	ErrClosed = errors.New("membership: closed")
	// ErrNameInUse: a live, still-heartbeating generation holds the name
	// and Config.Replace is not set. Nothing was written to the registry.
	ErrNameInUse = errors.New("membership: node name in use by a live generation")
	// ErrInvalidGeneration: the registry holds a generation for this
	// node's name that no clock produced (beyond MaxGenerationAhead, up to
	// 2^64-1), so no strictly higher one can be chosen without wrapping.
	ErrInvalidGeneration = errors.New("membership: invalid generation in the registry")
)

// ConnName returns the NATS connection name a node generation must use so
// that disconnect advisories identify it.
func ConnName(n subjects.NodeID) string { return ConnNamePrefix + n.String() }

// Member is one registered node generation.
type Member struct {
	Node    subjects.NodeID `json:"node"`
	Kinds   []string        `json:"kinds"`
	Version string          `json:"version"`
	Started time.Time       `json:"started"`
	Beat    uint64          `json:"beat"` // heartbeats sent
	// BeatAt is when the last heartbeat was written (the writer's clock).
	BeatAt time.Time `json:"beat_at"`
	// Draining: the node is draining; it still serves what it holds but
	// takes no new placements.
	Draining bool `json:"draining,omitempty"`
	// ServerID and ClientID identify the node's current NATS connection
	// (refreshed with every heartbeat), which the server's disconnect
	// advisory names.
	ServerID string `json:"server_id,omitempty"`
	ClientID uint64 `json:"client_id,omitempty"`
	// Cluster is the NATS cluster of the node's connection
	// (nats.Conn.ConnectedClusterName), refreshed with every heartbeat:
	// on a supercluster, placement prefers the sender's cluster (DESIGN
	// §12, HostingNear).
	Cluster string `json:"cluster,omitempty"`
	// Subscriber: a process that only follows sync streams (meshctl
	// subscribe). It registers so that owners can reach its address, but
	// it is not a mesh node: listings show it apart and membership
	// metrics leave it out.
	Subscriber bool `json:"subscriber,omitempty"`
	// Supersedes is the generation of this name that this one replaced
	// with proof that its process has exited (Config.Predecessors: meshd
	// found it recorded in its data directory, whose lock it now holds).
	// Survivors take that generation's addresses over at once, without
	// the fencing delay: a process that has exited runs no turns.
	Supersedes uint64 `json:"supersedes,omitempty"`
	// Removed is set by a survivor that judged this generation gone (a
	// disconnect advisory proving it, or heartbeat silence past the TTL)
	// in place of the entry (its tombstone), so that every other node
	// records the departure as what it was, not as the generation's own
	// leave, whichever notice reaches it first. An entry whose Removed is
	// set names a departed generation; the next registration of the name
	// replaces it, or the bucket's MaxAge backstop removes it.
	Removed *Removal `json:"removed,omitempty"`
}

// Removal says why and by whom a departed generation's registry entry
// was removed (Member.Removed).
type Removal struct {
	// How is the departure's event type by name ("disconnected",
	// "expired").
	How string `json:"how"`
	// Reason is the advisory's reason or the expiry's explanation.
	Reason string `json:"reason,omitempty"`
	// At is when the departure happened, if known (the advisory's
	// timestamp), else when it was judged.
	At time.Time `json:"at"`
	// By is the node generation that judged it.
	By subjects.NodeID `json:"by"`
}

// event returns the departure type the removal records: Expired for a
// name that is not a departure's (an entry written by another version).
func (r *Removal) event() EventType {
	for t := Left; int(t) < len(eventNames); t++ {
		if eventNames[t] == r.How && t.Departed() {
			return t
		}
	}
	return Expired
}

// Hosts reports whether the member hosts kind.
func (m Member) Hosts(kind string) bool { return slices.Contains(m.Kinds, kind) }

// EventType says what happened to a member.
type EventType uint8

// Event types.
const (
	Joined       EventType = iota + 1 // a generation registered
	Left                              // it deleted its entry (graceful drain)
	Expired                           // silent past the TTL while the registry took writes
	Superseded                        // a newer generation of the same name registered
	Disconnected                      // a disconnect advisory proving the process gone (client closed, stale)
	// Moved: the member's connection moved (its server shut down, a
	// reconnect to another server). Not a departure: its generation and
	// claims stay; what was in flight to it may be lost in transit and
	// should be re-sent (the receiver dedupes).
	Moved
)

var eventNames = [...]string{"", "joined", "left", "expired", "superseded", "disconnected", "moved"}

func (t EventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("event(%d)", t)
}

// Departed reports whether the event ends the member's generation.
func (t EventType) Departed() bool { return t != Joined && t != Moved }

// Event is a change of membership. At is when this node learned it.
// Latency, for a departure, estimates how long after the fact it was
// detected: from the advisory's timestamp (Disconnected), from the member's
// last heartbeat (Expired, which includes the TTL), from the new
// generation's start (Superseded); zero for Left, Joined and Moved. Reason
// is the advisory's reason, if an advisory caused it.
type Event struct {
	Type    EventType
	Member  Member
	At      time.Time
	Latency time.Duration
	Reason  string
}

// BucketName returns the registry bucket of a prefix: "natsmesh_<prefix
// with dots as underscores>_nodes".
func BucketName(p subjects.Prefix) string {
	return "natsmesh_" + strings.ReplaceAll(string(p), ".", "_") + "_nodes"
}

// Membership is this node's registration and its view of the mesh. Safe for
// concurrent use.
type Membership struct {
	cfg  Config
	log  *slog.Logger
	kv   jetstream.KeyValue
	self Member

	wmu      sync.Mutex // serialises writes of our own entry (revision chain)
	mu       sync.RWMutex
	live     map[string]*liveMember // by name: the live generation
	departed map[subjects.NodeID]time.Time
	proof    map[subjects.NodeID]bool // departed generations superseded with proof their process exited (pruned with departed)
	// durable records when a departure became a fact of the registry —
	// the generation's entry marked Removed, deleted, or naming a newer
	// generation — so that the departed process can no longer renew its
	// lease (its heartbeat's revision check fails). A departure judged
	// here but not yet durable is not taken over (TakeoverAt); its mark
	// is retried (expiry). Pruned with departed, never before it is
	// durable.
	durable map[subjects.NodeID]time.Time
	pending map[subjects.NodeID]pendingMark // departures judged here whose mark is not written yet
	// lastRev is the revision of the last registry write this node saw of a
	// departed generation's entry (pruned with departed): a deletion of the
	// name, or a newer generation's entry, proves the departure durable
	// only if written after it (durableGone).
	lastRev map[subjects.NodeID]uint64
	// renewedAfter holds the departed generations (pruned with departed)
	// whose heartbeat this node saw land in the registry after it judged
	// them gone: each may hold its lease up to a TTL after its entry was
	// deleted or superseded (durableGone).
	renewedAfter map[subjects.NodeID]bool
	lastMarkTry  time.Time   // the expiry loop's last retry of pending marks
	failMarks    atomic.Bool // tests: every removal mark this node writes fails, as against a registry without a leader
	pauseBeats   atomic.Bool // tests: this node's heartbeats stop reaching the registry (a partitioned link), its connection up
	joinedAt     time.Time
	rev          uint64 // revision of our own entry
	listeners    map[int]func(Event)
	nextL        int
	confirmed    uint64 // connection reconnect count at the last good heartbeat

	clock registryClock
	// The watcher's progress against this node's own writes: seenRev is
	// the highest revision the watcher delivered, ownRev the revision of
	// this node's last successful write and ownRevAt (unix ns) when the
	// oldest own write the watcher has not delivered succeeded. A watcher that lags its own node's writes is blind (its
	// consumer died with a NATS server) and is restarted (expiry.go).
	seenRev  atomic.Uint64
	ownRev   atomic.Uint64
	ownRevAt atomic.Int64
	// The view's coverage (UnseenTakeoverAt): lastOwn is this node's last
	// successful write (its revision, and when it was issued); covered
	// is the issue time of the newest own write the watcher delivered —
	// every registry write that completed before it is in the view.
	covMu   sync.Mutex
	lastOwn struct {
		rev   uint64
		start time.Time
	}
	covered time.Time
	rewatch chan struct{}
	// rewatches counts watcher restarts for blindness.
	rewatches atomic.Int64

	// The registration lease (lease.go): lapseLogged is the heartbeat
	// goroutine's own.
	lapses      atomic.Int64
	lapseLogged bool
	// Pause detection (lease.go, watchdog): lastTick is the watchdog's
	// last tick (unix ns); suspectAt, when non-zero, is when it saw this
	// process stopped for longer than PauseGap (a SIGSTOP, a freeze) —
	// until a heartbeat issued after it is acknowledged, no turn starts.
	lastTick  atomic.Int64
	suspectAt atomic.Int64

	lost     chan struct{}
	lostOnce sync.Once
	invalid  atomic.Int64 // registry entries ignored: unparsable, misnamed, absurd generation
	foreign  atomic.Int64 // own entry found overwritten by another writer
	// staleReads counts heartbeat mismatches whose read-back showed no
	// newer revision than the write's (a lagging replica answered), and
	// watched entries of this node's name older than its registration.
	staleReads atomic.Int64
	// joinRev is the registry revision this generation registered at:
	// what the watcher delivers at an older revision was written before
	// this generation existed.
	joinRev atomic.Uint64
	// mismatchRead, when set (tests), replaces readEntry after a
	// heartbeat's revision mismatch.
	mismatchRead atomic.Pointer[func(context.Context, string) (Member, uint64, error)]
	lastWrite    [4][]byte // the values this node last tried to write for its entry, newest at lastN%4 (under wmu)
	lastN        int
	leaving      atomic.Bool     // Leave is deleting our entry: our own departure is no news
	supersede    atomic.Bool     // the registration was lost to a newer generation of the name
	judged       subjects.NodeID // the registered generation checkName let this node supersede (zero: none was registered)
	ready        chan struct{}   // the registry's initial state was read
	readyOnce    sync.Once
	beatNow      chan struct{} // a reconnect asks for a heartbeat at once
	status       chan nats.Status
	ctx          context.Context
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	advSub       *nats.Subscription
	movedSub     *nats.Subscription
	closeOnce    sync.Once
}

// liveMember is a live generation and when the registry clock last saw it.
type liveMember struct {
	Member
	seen  time.Duration // registry clock at its last entry write
	rev   uint64        // the revision of that write
	since time.Time     // when this node first saw the generation (wall clock)
}

// Join registers this node with a fresh generation, reads the registry, and
// starts the heartbeat and the watchers. It blocks until the registry's
// current state is known or ctx ends. The generation is in Self().Node.
// Errors: ErrNameInUse (a live generation holds the name and Replace is
// off), ErrInvalidConfig, ctx's error, or the registry's.
func Join(ctx context.Context, cfg Config) (*Membership, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	var kv jetstream.KeyValue
	err = RetryEach(ctx, cfg.Logger, "bind the node registry bucket "+BucketName(cfg.Prefix), func(ctx context.Context) (err error) {
		kv, err = OpenBucket(ctx, js, cfg.Prefix, cfg.TTL, cfg.Replicas, cfg.PlacementCluster)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("membership: registry bucket: %w", err)
	}
	// The mesh's TTL and replicas are the existing bucket's; beat well
	// inside its TTL.
	if st, err := kv.Status(ctx); err == nil {
		if kst, ok := st.(*jetstream.KeyValueBucketStatus); ok && kst.StreamInfo().Config.Replicas != cfg.Replicas {
			cfg.Logger.Info("the registry's replica count differs from this node's; the registry is not reconfigured",
				"registry_replicas", kst.StreamInfo().Config.Replicas, "configured_replicas", cfg.Replicas)
		}
		if ttl := RegistryTTL(st); ttl > 0 && ttl != cfg.TTL {
			cfg.Logger.Info("the registry's TTL differs from this node's; following the registry", "registry_ttl", ttl.String(), "configured_ttl", cfg.TTL.String())
			cfg.TTL = ttl
			cfg.Heartbeat = min(cfg.Heartbeat, cfg.TTL/3)
		}
	}
	mctx, cancel := context.WithCancel(context.Background())
	m := &Membership{
		cfg: cfg, log: cfg.Logger, kv: kv,
		live: map[string]*liveMember{}, departed: map[subjects.NodeID]time.Time{}, proof: map[subjects.NodeID]bool{}, durable: map[subjects.NodeID]time.Time{}, pending: map[subjects.NodeID]pendingMark{}, lastRev: map[subjects.NodeID]uint64{}, renewedAfter: map[subjects.NodeID]bool{},
		listeners: map[int]func(Event){},
		lost:      make(chan struct{}), ready: make(chan struct{}), beatNow: make(chan struct{}, 1), rewatch: make(chan struct{}, 1),
		ctx: mctx, cancel: cancel, joinedAt: cfg.Clock.Now(), clock: registryClock{wall: cfg.Clock},
	}
	m.self = Member{Kinds: slices.Clone(cfg.Kinds), Version: cfg.Version, Started: time.Now().UTC(), Subscriber: cfg.Subscriber} // real clock: Started is in the registry
	slices.Sort(m.self.Kinds)
	for attempt := 0; ; attempt++ {
		if !cfg.Replace {
			if err := m.checkName(ctx); err != nil {
				cancel()
				return nil, err
			}
		}
		err := Retry(ctx, func() error { return m.register(ctx) })
		if errors.Is(err, errRecheck) && attempt < 10 {
			continue // registered by another process since it was judged
		}
		if err != nil {
			cancel()
			return nil, err
		}
		break
	}
	m.log = cfg.Logger.With("node", m.self.Node.String())
	if cfg.AdvisorySubject != "-" {
		sub, err := cfg.Conn.Subscribe(cfg.AdvisorySubject, m.onAdvisory)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("membership: advisory subscription: %w", err)
		}
		m.advSub = sub
	}
	mv, err := cfg.Conn.Subscribe(cfg.Prefix.Sub(MovedToken+".*.*"), m.onMoved)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("membership: moved-notice subscription: %w", err)
	}
	m.movedSub = mv
	m.status = cfg.Conn.StatusChanged(nats.CONNECTED, nats.DISCONNECTED, nats.RECONNECTING)
	m.lastTick.Store(cfg.Clock.Now().UnixNano())
	m.wg.Add(5)
	go m.watch()
	go m.heartbeat()
	go m.linkEvents()
	go m.expiry()
	go m.watchdog()
	select {
	case <-m.ready:
	case <-ctx.Done():
		m.Close()
		return nil, ctx.Err()
	}
	return m, nil
}

// MaxGenerationAhead bounds how far beyond this node's clock a generation
// read from the registry may be (generations are start times in
// nanoseconds, raised by one past a registered one): anything further is
// not a generation any node chose, and is refused (ErrInvalidGeneration,
// or ignored and counted by the watcher).
const MaxGenerationAhead = 365 * 24 * time.Hour

// AttemptTimeout bounds one attempt of RetryEach. JetStream's servers do
// not refuse an API request for a stream they believe has a leader
// elsewhere: while that leader is being elected, or is catching up after a
// server restart, nobody answers and the request waits for its deadline. A
// bound per attempt makes such a request cost one attempt, not the caller's
// whole deadline (a node's start).
const AttemptTimeout = 5 * time.Second

// errCodeNoPeers is JetStream's "no suitable peers for placement".
const errCodeNoPeers jetstream.ErrorCode = 10005

// Self returns this node's registration.
func (m *Membership) Self() Member {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.self
}

// TTL returns the mesh's TTL (the registry's, which may differ from the
// configured one).
func (m *Membership) TTL() time.Duration { return m.cfg.TTL }

// Close stops the heartbeat and watchers without leaving (the entry stays
// until other nodes judge it silent, or the backstop). It is idempotent.
func (m *Membership) Close() {
	m.closeOnce.Do(func() {
		m.cancel()
		if m.advSub != nil {
			_ = m.advSub.Unsubscribe()
		}
		if m.movedSub != nil {
			_ = m.movedSub.Unsubscribe()
		}
		if m.status != nil {
			m.cfg.Conn.RemoveStatusListener(m.status)
		}
		m.wg.Wait()
	})
}
