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
	"bytes"
	"context"
	"encoding/json"
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
	// Subscriber: a process that only follows sync streams (meshctl
	// subscribe). It registers so that owners can reach its address, but
	// it is not a mesh node: listings show it apart and membership
	// metrics leave it out.
	Subscriber bool `json:"subscriber,omitempty"`
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

// Config holds the membership settings. Conn and Name are required; zero
// fields mean their documented defaults.
type Config struct {
	// Conn is the node's NATS connection; its name should be
	// ConnName(Self) for advisories to identify it, its ping settings
	// ClientPingInterval and ClientMaxPingsOut.
	Conn *nats.Conn
	// Prefix names the buckets; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Name is the node name. Required.
	Name string
	// Kinds are the hub kinds the node hosts.
	Kinds []string
	// Version is the software version the node announces.
	Version string
	// Subscriber registers the process as a subscriber, not a node
	// (Member.Subscriber).
	Subscriber bool
	// Heartbeat is how often the entry is refreshed (default 1 s).
	Heartbeat time.Duration
	// TTL declares a generation gone after this much heartbeat silence
	// while the registry took writes (default 8 s). The first node to
	// create the registry sets it for the mesh; later nodes follow it.
	TTL time.Duration
	// FencingDelay is how long after a generation's departure survivors
	// wait before taking its addresses over (default 2 s); it must cover
	// the client ping bound of the departed node's connection.
	FencingDelay time.Duration
	// Replicas of the KV buckets (default 1; use 3 on a 3-server cluster).
	Replicas int
	// AdvisorySubject receives client-disconnect advisories; zero means
	// DefaultAdvisorySubject, "-" disables listening.
	AdvisorySubject string
	// Replace lets this process supersede a live, still-heartbeating
	// generation of its name (a deliberate takeover). Without it Join
	// returns ErrNameInUse before writing anything.
	Replace bool
	// BeforeAnnounce, if set, is called with the generation Join is about
	// to write, before it is written: the node subscribes its delivery
	// subject there, so a sender that reads the new generation never meets
	// no responders (join order). If the write then loses a race, undo is
	// called and BeforeAnnounce again with another generation.
	BeforeAnnounce func(subjects.NodeID) (undo func(), err error)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.Conn == nil {
		return fmt.Errorf("%w: Conn is nil", ErrInvalidConfig)
	}
	if err := subjects.ValidateNodeName(c.Name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.FencingDelay <= 0 {
		c.FencingDelay = DefaultFencingDelay
	}
	if c.TTL <= c.Heartbeat {
		return fmt.Errorf("%w: TTL %v must exceed the heartbeat %v", ErrInvalidConfig, c.TTL, c.Heartbeat)
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.AdvisorySubject == "" {
		c.AdvisorySubject = DefaultAdvisorySubject
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
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

	wmu       sync.Mutex // serialises writes of our own entry (revision chain)
	mu        sync.RWMutex
	live      map[string]*liveMember // by name: the live generation
	departed  map[subjects.NodeID]time.Time
	joinedAt  time.Time
	rev       uint64 // revision of our own entry
	listeners map[int]func(Event)
	nextL     int
	confirmed uint64 // connection reconnect count at the last good heartbeat

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

	lost      chan struct{}
	lostOnce  sync.Once
	invalid   atomic.Int64 // registry entries ignored: unparsable, misnamed, absurd generation
	foreign   atomic.Int64 // own entry found overwritten by another writer
	lastWrite [4][]byte    // the values this node last tried to write for its entry, newest at lastN%4 (under wmu)
	lastN     int
	leaving   atomic.Bool   // Leave is deleting our entry: our own departure is no news
	supersede atomic.Bool   // the registration was lost to a newer generation of the name
	ready     chan struct{} // the registry's initial state was read
	readyOnce sync.Once
	beatNow   chan struct{} // a reconnect asks for a heartbeat at once
	status    chan nats.Status
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	advSub    *nats.Subscription
	movedSub  *nats.Subscription
	closeOnce sync.Once
}

// liveMember is a live generation and when the registry clock last saw it.
type liveMember struct {
	Member
	seen  time.Duration // registry clock at its last entry write
	rev   uint64        // the revision of that write
	since time.Time     // when this node first saw the generation (wall clock)
}

// OpenBucket creates or binds the registry bucket: memory storage, the
// configured replicas, history 1, the mesh's TTL in its metadata, a MaxAge
// backstop of BackstopFactor × TTL, and markers on expiry so watchers see
// backstop removals.
//
// An existing bucket is used as it is, never reconfigured: the mesh's TTL
// is the bucket's, set by the first node, so one node with other settings
// cannot change every node's expiry (Join adapts its heartbeat to it).
func OpenBucket(ctx context.Context, js jetstream.JetStream, p subjects.Prefix, ttl time.Duration, replicas int) (jetstream.KeyValue, error) {
	return bindOrCreate(ctx, js, jetstream.KeyValueConfig{
		Bucket:         BucketName(p),
		Description:    "natsmesh node registry",
		Storage:        jetstream.MemoryStorage,
		Replicas:       replicas,
		History:        1,
		TTL:            BackstopFactor * ttl,
		LimitMarkerTTL: max(ttl, time.Second),
		Metadata:       map[string]string{metaTTL: ttl.String()},
	})
}

// RegistryTTL returns the mesh's TTL as the registry bucket records it (in
// its metadata; for a registry of an older version, its MaxAge).
func RegistryTTL(st jetstream.KeyValueStatus) time.Duration {
	if kst, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		if v, ok := kst.StreamInfo().Config.Metadata[metaTTL]; ok {
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				return d
			}
		}
	}
	return st.TTL() // a registry of an older version: its MaxAge is the TTL
}

// bindOrCreate binds the bucket if it exists, else creates it.
func bindOrCreate(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, err
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, cfg.Bucket) // created concurrently
	}
	return kv, err
}

// BindOrCreate is bindOrCreate for the directory's bucket.
func BindOrCreate(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return bindOrCreate(ctx, js, cfg)
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
		kv, err = OpenBucket(ctx, js, cfg.Prefix, cfg.TTL, cfg.Replicas)
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
		live: map[string]*liveMember{}, departed: map[subjects.NodeID]time.Time{},
		listeners: map[int]func(Event){},
		lost:      make(chan struct{}), ready: make(chan struct{}), beatNow: make(chan struct{}, 1), rewatch: make(chan struct{}, 1),
		ctx: mctx, cancel: cancel, joinedAt: time.Now(),
	}
	m.self = Member{Kinds: slices.Clone(cfg.Kinds), Version: cfg.Version, Started: time.Now().UTC(), Subscriber: cfg.Subscriber}
	slices.Sort(m.self.Kinds)
	if !cfg.Replace {
		if err := m.checkName(ctx); err != nil {
			cancel()
			return nil, err
		}
	}
	if err := Retry(ctx, func() error { return m.register(ctx) }); err != nil {
		cancel()
		return nil, err
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
	m.wg.Add(4)
	go m.watch()
	go m.heartbeat()
	go m.linkEvents()
	go m.expiry()
	select {
	case <-m.ready:
	case <-ctx.Done():
		m.Close()
		return nil, ctx.Err()
	}
	return m, nil
}

// checkName refuses to go on while a live generation heartbeats under the
// name: it reads the entry and, unless it is plainly stale, watches it for up
// to one TTL for a newer heartbeat. It writes nothing.
func (m *Membership) checkName(ctx context.Context) error {
	name := m.cfg.Name
	var first Member
	var firstRev uint64
	var err error
	err = Retry(ctx, func() error {
		first, firstRev, err = m.readEntry(ctx, name)
		return err
	})
	if err != nil {
		return fmt.Errorf("membership: read registry: %w", err)
	}
	if firstRev == 0 {
		return nil
	}
	if time.Since(first.BeatAt) > m.cfg.TTL+m.cfg.Heartbeat {
		return nil // stale by its own clock: a crashed generation
	}
	deadline := time.Now().Add(m.cfg.TTL)
	m.cfg.Logger.Info("a generation of this node's name is registered; waiting to see whether it still heartbeats",
		"generation", first.Node.String(), "up_to", m.cfg.TTL.String())
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(m.cfg.Heartbeat / 2):
		}
		cur, rev, err := m.readEntry(ctx, name)
		switch {
		case err != nil:
			continue
		case rev == 0:
			return nil // it left or was removed
		case cur.Node != first.Node || cur.Beat != first.Beat || rev != firstRev:
			return fmt.Errorf("%w: %s is live (heartbeating); start with --replace to take its name over, or pick another name", ErrNameInUse, cur.Node)
		}
	}
	return nil // silent for a TTL: gone
}

// readEntry returns name's registry entry and revision (0 when absent).
func (m *Membership) readEntry(ctx context.Context, name string) (Member, uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	e, err := m.kv.Get(rctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Member{}, 0, nil
	}
	if err != nil {
		return Member{}, 0, err
	}
	v, _ := m.parse(e)
	return v, e.Revision(), nil
}

// MaxGenerationAhead bounds how far beyond this node's clock a generation
// read from the registry may be (generations are start times in
// nanoseconds, raised by one past a registered one): anything further is
// not a generation any node chose, and is refused (ErrInvalidGeneration,
// or ignored and counted by the watcher).
const MaxGenerationAhead = 365 * 24 * time.Hour

// AbsurdGeneration reports whether g is beyond MaxGenerationAhead of the
// local clock (2^64-1 always is).
func AbsurdGeneration(g uint64) bool {
	limit := time.Now().Add(MaxGenerationAhead).UnixNano()
	return limit <= 0 || g > uint64(limit)
}

// Stats are counters of what the registry held that this node refused.
type Stats struct {
	// InvalidEntries counts registry entries ignored: not JSON, naming
	// another key, an invalid or absurd generation.
	InvalidEntries int64 `json:"invalid_entries"`
	// Overwritten counts times this node found its own entry overwritten
	// by another writer without a newer generation (and rewrote it).
	Overwritten int64 `json:"overwritten"`
	// WatcherRestarts counts restarts of this node's registry watcher
	// after it failed to deliver this node's own heartbeat in time (its
	// consumer was lost with a NATS server).
	WatcherRestarts int64 `json:"watcher_restarts"`
}

// Stats returns the counters. Safe for concurrent use.
func (m *Membership) Stats() Stats {
	return Stats{InvalidEntries: m.invalid.Load(), Overwritten: m.foreign.Load(), WatcherRestarts: m.rewatches.Load()}
}

// parse reads a registry entry: false (counted, logged at the first and
// every power of two) when it is not a member of its key with a valid,
// plausible generation.
func (m *Membership) parse(e jetstream.KeyValueEntry) (Member, bool) {
	var v Member
	err := json.Unmarshal(e.Value(), &v)
	switch {
	case err != nil:
	case v.Node.Name != e.Key():
		err = fmt.Errorf("entry names %q", v.Node.Name)
	case v.Node.Generation == 0 || AbsurdGeneration(v.Node.Generation):
		err = fmt.Errorf("%w: %d", ErrInvalidGeneration, v.Node.Generation)
	default:
		return v, true
	}
	if n := m.invalid.Add(1); n&(n-1) == 0 {
		m.log.Warn("registry entry ignored", "key", e.Key(), "revision", e.Revision(), "err", err, "ignored_total", n)
	}
	return Member{}, false
}

// wroteValue remembers a value about to be written for this node's entry.
// Called with wmu held.
func (m *Membership) wroteValue(b []byte) {
	m.lastN++
	m.lastWrite[m.lastN%len(m.lastWrite)] = b
}

// ownWrite reports whether the stored entry at rev is a value this node
// recently tried to write (the write whose reply was lost is not the
// latest attempt: the attempt that met the revision mismatch came after
// it); if not, it reports the overwrite (log and Stats). A read that fails
// tells nothing and reports nothing.
func (m *Membership) ownWrite(rev uint64) bool {
	ctx, cancel := context.WithTimeout(m.ctx, 2*time.Second)
	defer cancel()
	e, err := m.kv.Get(ctx, m.cfg.Name)
	if err != nil {
		return true
	}
	m.wmu.Lock()
	own := false
	for _, b := range m.lastWrite {
		own = own || b != nil && bytes.Equal(e.Value(), b)
	}
	m.wmu.Unlock()
	if own && e.Revision() == rev {
		return true
	}
	n := m.foreign.Add(1)
	m.log.Warn("own registry entry overwritten by another writer; rewriting it (SECURITY.md: give other clients no write access to the registry)",
		"revision", rev, "overwritten_total", n)
	return false
}

// register writes a new generation for the name, strictly above any
// registered one, under a revision check. BeforeAnnounce runs before each
// write with the generation about to be written.
func (m *Membership) register(ctx context.Context) error {
	name := m.cfg.Name
	for range 10 {
		gen := uint64(time.Now().UnixNano())
		var prev uint64
		e, err := m.kv.Get(ctx, name)
		switch {
		case err == nil:
			var raw Member
			if json.Unmarshal(e.Value(), &raw) == nil && raw.Node.Name == name && AbsurdGeneration(raw.Node.Generation) {
				return fmt.Errorf("%w: %q holds generation %d, beyond any clock (more than %v ahead): refusing to register above it; if no such node runs, delete the entry (nats kv del %s %s)",
					ErrInvalidGeneration, name, raw.Node.Generation, MaxGenerationAhead, BucketName(m.cfg.Prefix), name)
			}
			// An entry that does not parse is replaced (under the revision
			// check) by a generation from the clock.
			if old, ok := m.parse(e); ok && old.Node.Generation >= gen {
				gen = old.Node.Generation + 1
			}
			prev = e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound):
		default:
			return fmt.Errorf("membership: read registry: %w", err)
		}
		self := m.self
		self.Node = subjects.NodeID{Name: name, Generation: gen}
		self.ServerID, self.ClientID = m.connIdentity()
		self.BeatAt = time.Now().UTC()
		m.mu.Lock()
		m.self = self
		m.mu.Unlock()
		undo := func() {}
		if f := m.cfg.BeforeAnnounce; f != nil {
			u, err := f(self.Node)
			if err != nil {
				return fmt.Errorf("membership: before announcing %s: %w", self.Node, err)
			}
			if u != nil {
				undo = u
			}
		}
		b, _ := json.Marshal(self)
		m.wmu.Lock()
		m.wroteValue(b)
		m.wmu.Unlock()
		confirmed := m.cfg.Conn.Stats().Reconnects
		start := time.Now()
		var rev uint64
		if prev == 0 {
			rev, err = m.kv.Create(ctx, name, b)
		} else {
			rev, err = m.kv.Update(ctx, name, b, prev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			undo()
			continue // raced with another incarnation: read again
		}
		if err != nil {
			undo()
			return fmt.Errorf("membership: register: %w", err)
		}
		m.mu.Lock()
		m.rev, m.confirmed = rev, confirmed
		m.mu.Unlock()
		m.wroteOwn(rev, start)
		return nil
	}
	return fmt.Errorf("membership: register %q: too many concurrent registrations", name)
}

// Retry runs op until it succeeds, fails with an error that is not a
// JetStream start-up condition, or ctx ends. Right after a JetStream cluster
// forms or a bucket is created, its stream may have no leader yet: requests
// meet no responders or time out for a moment.
func Retry(ctx context.Context, op func() error) error {
	wait := 50 * time.Millisecond
	for {
		err := op()
		if err == nil || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// AttemptTimeout bounds one attempt of RetryEach. JetStream's servers do
// not refuse an API request for a stream they believe has a leader
// elsewhere: while that leader is being elected, or is catching up after a
// server restart, nobody answers and the request waits for its deadline. A
// bound per attempt makes such a request cost one attempt, not the caller's
// whole deadline (a node's start).
const AttemptTimeout = 5 * time.Second

// RetryEach is Retry with each attempt given its own ctx, bounded by
// AttemptTimeout within ctx. While it keeps failing it logs what it waits
// for (what, the attempt count and the last error) on log, at most every
// two seconds, so a node that cannot start says why; log may be nil.
func RetryEach(ctx context.Context, log *slog.Logger, what string, op func(ctx context.Context) error) error {
	return retryEach(ctx, AttemptTimeout, log, what, op)
}

func retryEach(ctx context.Context, per time.Duration, log *slog.Logger, what string, op func(ctx context.Context) error) error {
	start, logged, attempts := time.Now(), time.Time{}, 0
	return Retry(ctx, func() error {
		attempts++
		actx, cancel := context.WithTimeout(ctx, per)
		err := op(actx)
		cancel()
		if err != nil && log != nil && transient(err) && time.Since(logged) >= 2*time.Second {
			logged = time.Now()
			log.Warn("waiting for JetStream: "+what, "attempts", attempts, "waited", time.Since(start).Round(time.Millisecond).String(), "err", err)
		}
		return err
	})
}

func transient(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		// "no suitable peers for placement": right after a cluster forms
		// (or a server restarts) its peers may still be reported offline.
		errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNoPeers
}

// errCodeNoPeers is JetStream's "no suitable peers for placement".
const errCodeNoPeers jetstream.ErrorCode = 10005

// connIdentity returns the server ID and client ID of the connection now.
func (m *Membership) connIdentity() (string, uint64) {
	cid, _ := m.cfg.Conn.GetClientID()
	return m.cfg.Conn.ConnectedServerId(), cid
}

// Self returns this node's registration.
func (m *Membership) Self() Member {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.self
}

// TTL returns the mesh's TTL (the registry's, which may differ from the
// configured one).
func (m *Membership) TTL() time.Duration { return m.cfg.TTL }

// Lost is closed when this node's registration was removed or superseded:
// it was declared gone and must stop serving (fencing). After a removal it
// may rejoin with a new generation; after a supersession (Superseded) another
// live incarnation holds the name and this one must not rejoin.
func (m *Membership) Lost() <-chan struct{} { return m.lost }

// IsLost reports whether the registration was lost (Lost is closed).
func (m *Membership) IsLost() bool {
	select {
	case <-m.lost:
		return true
	default:
		return false
	}
}

// Superseded reports whether the registration was lost to a newer
// generation of the same name.
func (m *Membership) Superseded() bool { return m.supersede.Load() }

// Confirmed reports whether this node may start turns now: its link is up
// and its registration was confirmed by a heartbeat on the connection as it
// is now. It is false from the moment the link drops until the first good
// heartbeat after the reconnect, and for good once lost (self-fencing).
func (m *Membership) Confirmed() bool {
	select {
	case <-m.lost:
		return false
	default:
	}
	if m.cfg.Conn.Status() != nats.CONNECTED {
		return false
	}
	m.mu.RLock()
	c := m.confirmed
	m.mu.RUnlock()
	return c == m.cfg.Conn.Stats().Reconnects
}

// WaitConfirmed blocks until the registration is confirmed on the current
// connection (nil), it is lost (ErrLost), or ctx ends (ctx's error). A node
// pauses handling while unconfirmed after a reconnect instead of failing
// what it holds.
func (m *Membership) WaitConfirmed(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.lost:
			return ErrLost
		default:
		}
		if m.Confirmed() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.lost:
			return ErrLost
		case <-t.C:
		}
	}
}

// Members returns the live generations, sorted by name.
func (m *Membership) Members() []Member {
	m.mu.RLock()
	out := make([]Member, 0, len(m.live))
	for _, v := range m.live {
		out = append(out, v.Member)
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Node.Name, b.Node.Name) })
	return out
}

// Alive reports whether node is the live generation of its name.
func (m *Membership) Alive(node subjects.NodeID) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.live[node.Name]
	return ok && v.Node == node
}

// Gone reports whether node is known to be gone: a newer generation of its
// name is live, or it departed within the last fencing delay. It is the
// cluster view's answer for work addressed to node (fail it at once rather
// than send), bounded in memory: an older departure is no longer
// remembered, and a leg to it meets no responders at once anyway.
func (m *Membership) Gone(node subjects.NodeID) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if v, ok := m.live[node.Name]; ok && v.Node.Generation > node.Generation {
		return true
	}
	at, ok := m.departed[node]
	return ok && time.Since(at) <= m.cfg.FencingDelay
}

// TakeoverAt returns when this node may take over addresses claimed by
// node, a generation that is not alive: its departure as this node learned
// it plus the fencing delay; for a generation superseded by a newer one of
// its name, when this node first saw the newer one plus the fencing delay;
// and never before this node's own join plus the fencing delay. The zero
// time means at once. A generation this node does not know (Known false)
// is judged by UnseenTakeoverAt instead.
func (m *Membership) TakeoverAt(node subjects.NodeID) time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if at, ok := m.departed[node]; ok {
		return at.Add(m.cfg.FencingDelay)
	}
	t := m.joinedAt.Add(m.cfg.FencingDelay)
	if v, ok := m.live[node.Name]; ok && v.Node.Generation > node.Generation && v.since.Add(m.cfg.FencingDelay).After(t) {
		t = v.since.Add(m.cfg.FencingDelay)
	}
	if time.Now().Before(t) {
		return t
	}
	return time.Time{}
}

// Known reports whether this node's view knows what became of node: it is
// alive, it departed within the view's memory (a few TTLs), or a newer
// generation of its name is alive. A claim of a generation that is not
// known is not proof of a departure: it may be a node that joined before
// this node's view shows it (DESIGN §5, claims are tokens).
func (m *Membership) Known(node subjects.NodeID) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if v, ok := m.live[node.Name]; ok && v.Node.Generation >= node.Generation {
		return true
	}
	_, ok := m.departed[node]
	return ok
}

// UnseenTakeoverAt returns when a claim of a generation this node's view
// does not know (Known false), first read at first, may be taken over: the
// fencing delay after first, and only once the view has caught up past
// first — the registry watcher has delivered a write of this node's own
// issued after first, so every registration that completed before first
// (a claimer registers before it claims) is in the view. Until the view
// has caught up it returns a time one heartbeat ahead: ask again then. A
// registry without a leader thus holds takeovers of unknown generations
// back, never lets them through.
func (m *Membership) UnseenTakeoverAt(first time.Time) time.Time {
	at := first.Add(m.cfg.FencingDelay)
	m.covMu.Lock()
	covered := m.covered
	m.covMu.Unlock()
	if !covered.After(first) {
		if next := time.Now().Add(m.cfg.Heartbeat); next.After(at) {
			return next
		}
		return at
	}
	if time.Now().Before(at) {
		return at
	}
	return time.Time{}
}

// Hosting returns the live generations that host kind and take new
// placements (not draining), sorted by name.
func (m *Membership) Hosting(kind string) []subjects.NodeID {
	m.mu.RLock()
	var out []subjects.NodeID
	for _, v := range m.live {
		if v.Hosts(kind) && !v.Draining {
			out = append(out, v.Node)
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b subjects.NodeID) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// OnEvent registers f for every membership event from now on; it returns a
// function that unregisters it. f runs on the watcher goroutine, one event at
// a time, never under a lock; it must not block for long.
func (m *Membership) OnEvent(f func(Event)) (cancel func()) {
	m.mu.Lock()
	id := m.nextL
	m.nextL++
	m.listeners[id] = f
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.listeners, id)
		m.mu.Unlock()
	}
}

func (m *Membership) emit(e Event) {
	m.mu.RLock()
	ls := make([]func(Event), 0, len(m.listeners))
	for _, f := range m.listeners {
		ls = append(ls, f)
	}
	m.mu.RUnlock()
	for _, f := range ls {
		f(e)
	}
}

// depart removes node's generation from the live set and emits the event,
// once per generation. since is when the departure happened, if known.
func (m *Membership) depart(node subjects.NodeID, t EventType, since time.Time, reason string) bool {
	now := time.Now()
	m.mu.Lock()
	v, ok := m.live[node.Name]
	if !ok || v.Node != node {
		m.mu.Unlock()
		return false
	}
	delete(m.live, node.Name)
	m.departed[node] = now
	keep := m.departedMemory()
	for n, at := range m.departed { // bounded: only recent departures
		if now.Sub(at) > keep {
			delete(m.departed, n)
		}
	}
	m.mu.Unlock()
	var lat time.Duration
	switch {
	case t == Expired:
		lat = now.Sub(v.BeatAt)
	case !since.IsZero():
		lat = now.Sub(since)
	}
	lat = max(lat, 0)
	if v.Subscriber {
		// meshctl subscribe and the like come and go with CLI use.
		m.log.Debug("subscriber departed", "departed", node.String(), "how", t.String(), "reason", reason)
	} else {
		m.log.Info("node departed", "departed", node.String(), "how", t.String(), "reason", reason, "detected_after", lat.String())
	}
	m.emit(Event{Type: t, Member: v.Member, At: now, Latency: lat, Reason: reason})
	return true
}

// watch follows the registry.
func (m *Membership) watch() {
	defer m.wg.Done()
	for m.ctx.Err() == nil {
		w, err := m.kv.WatchAll(m.ctx)
		if err != nil {
			m.log.Warn("registry watch failed; retrying", "err", err)
			select {
			case <-m.ctx.Done():
				return
			case <-time.After(m.cfg.Heartbeat):
			}
			continue
		}
		// Revisions are compared within one watch: a registry created
		// afresh numbers its entries from 1 again.
		m.seenRev.Store(0)
		m.follow(w)
		_ = w.Stop()
	}
}

func (m *Membership) follow(w jetstream.KeyWatcher) {
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.rewatch:
			return // blind: watch afresh
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil { // initial values done
				m.readyOnce.Do(func() { close(m.ready) })
				continue
			}
			m.apply(e)
		}
	}
}

func (m *Membership) apply(e jetstream.KeyValueEntry) {
	name := e.Key()
	rev := e.Revision()
	fresh := m.seen(rev)
	if m.leaving.Load() && name == m.cfg.Name {
		return
	}
	switch e.Operation() {
	case jetstream.KeyValuePut:
		v, ok := m.parse(e)
		if !ok {
			return
		}
		if fresh && time.Since(v.BeatAt) < m.cfg.TTL {
			// A fresh write seen through the watcher: the registry takes
			// writes and this node's view of it is current (the watcher
			// delivers in stream order, so every earlier write was seen).
			m.clock.wrote()
		}
		now := m.clock.now()
		m.mu.Lock()
		old, had := m.live[name]
		switch {
		case had && old.Node == v.Node && old.rev == rev:
			m.mu.Unlock()
			return // the same write again (a re-watch replays the entries)
		case had && old.Node == v.Node:
			moved := old.ClientID != v.ClientID || old.ServerID != v.ServerID
			m.live[name] = &liveMember{Member: v, seen: now, rev: rev, since: old.since} // a heartbeat
			m.mu.Unlock()
			if moved && old.ClientID != 0 {
				m.emit(Event{Type: Moved, Member: v, At: time.Now(), Reason: "heartbeat from a new connection"})
			}
			return
		case had && old.Node.Generation > v.Node.Generation:
			m.mu.Unlock()
			return // a stale write of an older generation
		}
		if _, gone := m.departed[v.Node]; gone {
			m.mu.Unlock()
			return // a late write of a generation already judged gone
		}
		m.mu.Unlock()
		if had {
			m.depart(old.Node, Superseded, v.Started, "")
		}
		m.mu.Lock()
		m.live[name] = &liveMember{Member: v, seen: now, rev: rev, since: time.Now()}
		m.mu.Unlock()
		m.emit(Event{Type: Joined, Member: v, At: time.Now()})
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		m.mu.RLock()
		old, had := m.live[name]
		m.mu.RUnlock()
		if !had {
			break
		}
		t := Left
		if e.Operation() == jetstream.KeyValuePurge {
			t = Expired // a MaxAge marker (the backstop)
		}
		m.depart(old.Node, t, time.Time{}, "")
	}
	self := m.Self()
	if name == self.Node.Name {
		m.mu.RLock()
		cur, ok := m.live[name]
		m.mu.RUnlock()
		if !ok || cur.Node != self.Node {
			if ok && cur.Node.Generation > self.Node.Generation {
				m.supersede.Store(true)
			}
			m.markLost("registry no longer names this generation")
		}
	}
}

// remove deletes node's registry entry if it still names node (revision
// check), so every node converges and the departed process, should it come
// back, finds itself gone.
func (m *Membership) remove(node subjects.NodeID) {
	ctx, cancel := context.WithTimeout(m.ctx, 2*time.Second)
	defer cancel()
	for range 3 { // a heartbeat of node may land between the read and the delete
		e, err := m.kv.Get(ctx, node.Name)
		if err != nil {
			return
		}
		var v Member
		if json.Unmarshal(e.Value(), &v) != nil || v.Node != node {
			return
		}
		if err := m.kv.Delete(ctx, node.Name, jetstream.LastRevision(e.Revision())); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return
		}
	}
}

// heartbeat refreshes the entry, every Heartbeat and at once after a
// reconnect. A revision mismatch whose stored entry is still this
// generation's (the reply of an earlier write was lost) adopts the stored
// revision; one that names no entry or another generation means the
// registration is lost.
func (m *Membership) heartbeat() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.lost:
			return
		case <-t.C:
		case <-m.beatNow:
		}
		err := m.beat()
		switch {
		case err == nil:
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
			cur, rev, gerr := m.readEntry(m.ctx, m.cfg.Name)
			self := m.Self()
			switch {
			case gerr != nil:
				// Cannot tell: try again next beat.
			case rev != 0 && (cur.Node == self.Node || !(cur.Node.Generation > self.Node.Generation && !AbsurdGeneration(cur.Node.Generation))):
				// Still this generation's (the reply of our write was
				// lost), or written by someone else without a newer
				// generation (garbage, an older or absurd generation,
				// our generation with other content): rewrite ours on
				// the stored revision.
				if m.ownWrite(rev) {
					m.log.Info("heartbeat reply was lost; the stored entry is still this generation's", "revision", rev)
				}
				m.mu.Lock()
				m.rev = rev
				m.mu.Unlock()
				select {
				case m.beatNow <- struct{}{}:
				default:
				}
			default:
				if rev != 0 && cur.Node.Generation > self.Node.Generation {
					m.supersede.Store(true)
				}
				m.markLost("heartbeat found the entry removed or superseded")
				return
			}
		default:
			if m.ctx.Err() == nil {
				m.log.Warn("heartbeat failed", "err", err)
			}
		}
	}
}

// beat writes one heartbeat.
func (m *Membership) beat() error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.mu.RLock()
	self, rev := m.self, m.rev
	m.mu.RUnlock()
	self.Beat++
	self.BeatAt = time.Now().UTC()
	self.ServerID, self.ClientID = m.connIdentity()
	b, _ := json.Marshal(self)
	m.wroteValue(b)
	reconnects := m.cfg.Conn.Stats().Reconnects
	ctx, cancel := context.WithTimeout(m.ctx, max(m.cfg.Heartbeat, time.Second))
	start := time.Now()
	nrev, err := m.kv.Update(ctx, self.Node.Name, b, rev)
	cancel()
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.self, m.rev, m.confirmed = self, nrev, reconnects
	m.mu.Unlock()
	m.wroteOwn(nrev, start)
	return nil
}

// linkEvents asks for a heartbeat at once when the link comes back, so the
// registration is confirmed (and turns resume) without waiting a period.
func (m *Membership) linkEvents() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case s, ok := <-m.status:
			if !ok {
				return
			}
			if s == nats.CONNECTED {
				m.announceMoved()
				select {
				case m.beatNow <- struct{}{}:
				default:
				}
			}
		}
	}
}

func (m *Membership) markLost(why string) {
	m.lostOnce.Do(func() {
		m.log.Warn("registration lost: this generation must stop serving", "why", why)
		close(m.lost)
	})
}

// SetKinds announces the hub kinds this generation hosts (kinds registered
// after it joined), so that placement can use them. It blocks on one or two
// registry round trips, bounded by ctx. An error matching [ErrLost] says
// the registry no longer names this generation (it was declared gone).
func (m *Membership) SetKinds(ctx context.Context, kinds []string) error {
	return m.updateSelf(ctx, func(self *Member) {
		self.Kinds = slices.Clone(kinds)
		slices.Sort(self.Kinds)
	})
}

// SetDraining marks this generation draining in the registry: it keeps what
// it holds but takes no new placements.
func (m *Membership) SetDraining(ctx context.Context) error {
	return m.updateSelf(ctx, func(self *Member) { self.Draining = true })
}

// updateSelf rewrites this generation's entry with change applied, under
// the revision chain the heartbeat also follows.
func (m *Membership) updateSelf(ctx context.Context, change func(*Member)) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.mu.RLock()
	self, rev := m.self, m.rev
	m.mu.RUnlock()
	change(&self)
	b, _ := json.Marshal(self)
	m.wroteValue(b)
	nrev, err := m.kv.Update(ctx, self.Node.Name, b, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// An earlier write's reply may have been lost: retry on the
		// stored revision if the entry is still ours.
		cur, crev, gerr := m.readEntry(ctx, self.Node.Name)
		switch {
		case gerr == nil && crev != 0 && cur.Node == self.Node:
			nrev, err = m.kv.Update(ctx, self.Node.Name, b, crev)
		case gerr == nil:
			// Removed, or another generation's: this one was declared
			// gone (the watcher marks it lost).
			return fmt.Errorf("%w: the registry no longer names %s: %w", ErrLost, self.Node, err)
		}
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.self, m.rev = self, nrev
	m.mu.Unlock()
	return nil
}

// Leave deletes this generation's entry (a graceful departure every node
// sees at once) and stops. It is idempotent.
func (m *Membership) Leave(ctx context.Context) error {
	m.wmu.Lock()
	m.mu.RLock()
	self, rev := m.self, m.rev
	m.mu.RUnlock()
	var err error
	m.leaving.Store(true)
	select {
	case <-m.lost:
	default:
		err = m.kv.Delete(ctx, self.Node.Name, jetstream.LastRevision(rev))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			if cur, crev, gerr := m.readEntry(ctx, self.Node.Name); gerr == nil && crev != 0 && cur.Node == self.Node {
				err = m.kv.Delete(ctx, self.Node.Name, jetstream.LastRevision(crev))
			} else {
				err = nil // already gone or superseded
			}
		}
	}
	m.wmu.Unlock()
	m.Close()
	return err
}

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
