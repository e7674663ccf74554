// Package directory maps addresses to their owner node generation in a
// JetStream KV bucket (DESIGN §5–§6) and places unowned addresses.
//
// A node claims an address before it activates it (create-if-absent); a
// claim naming a departed generation is replaced under a revision check.
// Senders resolve an address through a local cache, then the directory, then
// placement: rendezvous hashing over the live nodes that host the address's
// kind, so concurrent senders pick the same node. A cache entry is dropped
// when a delivery meets no responders or "not the owner"; no node watches
// the whole directory. Owners re-verify their claims periodically, so a claim
// lost or overwritten behind an owner's back (the directory is soft state
// kept in memory storage) makes it stand down within one period.
//
// *Directory implements hub.Claims and mesh.Resolver.
package directory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/singleflight"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/clock"
	"github.com/natsmesh/natsmesh/internal/plant"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// ReadTimeout bounds a directory read while resolving: a directory that is
// electing a leader yields a resendable verdict.ErrDirectoryUnavailable and
// the sender retries, rather than a stalled lane.
const ReadTimeout = 2 * time.Second

// DefaultVerifyInterval is how often an owner re-verifies its claims.
const DefaultVerifyInterval = 2 * time.Second

// DefaultVerifyBatch is how many claims one verification request reads.
// MaxVerifyBatch is the most a NATS server answers in one batched read (its
// multi_last limit: more matches than that are refused "413 Too Many
// Results").
const (
	DefaultVerifyBatch = 256
	MaxVerifyBatch     = 1024
)

// errCodeMessageTTLDisabled is JetStream's error code for a per-message TTL
// on a stream that does not allow them (nats-server JSMessageTTLDisabledErr).
const errCodeMessageTTLDisabled jetstream.ErrorCode = 10166

// DefaultMarkerTTL is how long a released claim's marker stays in the
// directory: long enough for every watcher to have seen the release, short
// enough that a burst of cold addresses leaves no lasting state.
const DefaultMarkerTTL = time.Minute

// DefaultCacheSize is how many owners a node caches by default (about
// 100 bytes each).
const DefaultCacheSize = 1 << 16

// ErrInvalidConfig: a required Config field is missing or invalid.
var ErrInvalidConfig = errors.New("directory: invalid config")

// Config holds the directory settings. Conn and Members are required.
type Config struct {
	Conn *nats.Conn
	// Members is this node's cluster view (its membership): who is alive,
	// who hosts a kind, and this node's own generation.
	Members membership.View
	// Prefix names the bucket; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Replicas of the bucket (default 1; 3 on a 3-server cluster).
	Replicas int
	// PlacementCluster places a bucket this node creates in that NATS
	// cluster (membership.Config.PlacementCluster); empty: the server's.
	PlacementCluster string
	// VerifyInterval is how often claims are re-verified (default 2 s).
	VerifyInterval time.Duration
	// VerifyBatch is how many claims one verification request reads: one
	// JetStream batched direct get (nats-server 2.11+; an older server is
	// read one claim at a time). Default DefaultVerifyBatch, at most
	// MaxVerifyBatch.
	VerifyBatch int
	perKey      bool // tests: verify one claim at a time, as on a server without batched reads
	noWatch     bool // tests: no watch of changes (verification by passes only)
	// MarkerTTL is how long the marker a released claim leaves in the
	// bucket is kept (KV limit marker TTL, nats-server 2.11+); zero means
	// DefaultMarkerTTL. Only a bucket this node creates gets it.
	MarkerTTL time.Duration
	// CacheSize bounds the owners this node caches for senders (Resolve,
	// Claim, Redirect); zero means DefaultCacheSize. Past it, entries of
	// generations no longer alive go first, then arbitrary ones (a miss
	// costs one directory read).
	CacheSize int
	// OnLost is called (on the verifier goroutine) with the token of a
	// claim this node lost: it must stand down the activation holding
	// that token (hub.Host.StandDown), and must not block on its turns.
	OnLost func(t hub.ClaimToken)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Clock times the takeover waits (a departed owner's fencing delay,
	// read on the same clock as Members) and the VerifyInterval ticker;
	// nil means the real clock. A claim's Claimed time, written to the
	// bucket, is the real clock's.
	Clock clock.Clock
}

// BucketName returns the directory bucket of a prefix.
func BucketName(p subjects.Prefix) string {
	return "natsmesh_" + strings.ReplaceAll(string(p), ".", "_") + "_dir"
}

// Claim is a directory entry's value.
type Claim struct {
	Owner   subjects.NodeID `json:"owner"`
	Claimed time.Time       `json:"claimed"`
}

// Directory is one node's handle on the directory. Safe for concurrent use.
type Directory struct {
	cfg     Config
	kv      jetstream.KeyValue
	members membership.View
	log     *slog.Logger

	// cache maps addresses to their owners for senders, bounded (cacheSet,
	// cacheDrop keep cacheLen, its entry count); the entries of a departed
	// generation are dropped by the verifier goroutine (pruneDead).
	cache     sync.Map // subjects.Address -> subjects.NodeID
	cacheLen  atomic.Int64
	evicting  atomic.Bool   // an eviction pass runs (cacheSet)
	departure chan struct{} // a generation departed: prune its entries
	stopEv    func()

	// reads coalesces concurrent senders' directory reads of one address
	// (Resolve): one read in flight per address, whatever the number of
	// deliveries waiting for it. resolveReads counts the reads made.
	reads        singleflight.Group
	resolveReads atomic.Int64
	readWaiters  atomic.Int64  // callers waiting for a read (readShared)
	readGate     chan struct{} // tests: a read waits for it before it asks

	mu      sync.Mutex
	owned   map[subjects.Address]held     // address -> the claim this node holds on it
	lastID  uint64                        // the last claim identity issued
	unknown map[subjects.NodeID]time.Time // generations never seen alive -> when a claim of theirs was first read

	invalid atomic.Int64 // claims that did not parse
	foreign atomic.Int64 // own claims found overwritten by a writer that is no live generation

	// bucketSubj is the bucket's subject prefix ("$KV.<bucket>."), and
	// directGet its stream's direct get subject: the verifier reads claims
	// in batches through it.
	bucketSubj, directGet string
	heldBack              atomic.Int64 // batched reads the server cut short (max_bytes): asked again
	swept, sweeps         atomic.Int64 // claims re-read by the rotating sweep, and its passes
	watchChecks           atomic.Int64 // changes to own claims the watch delivered and the verifier checked
	watchFailures         atomic.Int64 // watches of the directory that could not be started
	staleReads            atomic.Int64 // verifier reads older than the claim they checked (a lagging replica)
	noTTL                 atomic.Bool  // the bucket refused a marker TTL: plain deletes
	fullPasses            atomic.Int64 // full verification passes (stream re-created or lost writes, watch restarted)
	streamCreated         time.Time    // the directory stream's creation time at the last look (under mu)
	sweepRound            []ownedClaim // what the rotating sweep has still to re-read this round, by revision (under mu)
	newest                uint64       // the newest revision this node wrote a claim at, in this stream (under mu)
	maxBytes              int          // tests: max_bytes of a batched read (0: the server's)

	pipeline pipeline // pipelined claims (TryClaim, pipeline.go)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// errClosed is the pipeline's state once the directory is closed.
var errClosed = errors.New("directory: closed")

// Stats are counters of this node's directory work: the entries it
// refused, and the reads its senders made.
type Stats struct {
	// InvalidEntries counts claims read that did not parse (treated as
	// unowned).
	InvalidEntries int64 `json:"invalid_entries"`
	// Overwritten counts this node's claims found overwritten by
	// something that is no live generation's claim (and re-written).
	Overwritten int64 `json:"overwritten"`
	// Reads counts the directory reads this node's senders made to
	// resolve an address's owner (a cache miss); concurrent misses of one
	// address share one read.
	Reads int64 `json:"reads"`
}

// Stats returns the counters. Safe for concurrent use.
func (d *Directory) Stats() Stats {
	return Stats{InvalidEntries: d.invalid.Load(), Overwritten: d.foreign.Load(), Reads: d.resolveReads.Load()}
}

// Open binds (or creates) the directory bucket and starts the claim
// verifier.
func Open(ctx context.Context, cfg Config) (*Directory, error) {
	if cfg.Conn == nil || cfg.Members == nil {
		return nil, fmt.Errorf("%w: Conn and Members are required", ErrInvalidConfig)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = subjects.DefaultPrefix
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.VerifyInterval <= 0 {
		cfg.VerifyInterval = DefaultVerifyInterval
	}
	if cfg.MarkerTTL <= 0 {
		cfg.MarkerTTL = DefaultMarkerTTL
	}
	if cfg.VerifyBatch > MaxVerifyBatch {
		return nil, fmt.Errorf("%w: VerifyBatch %d is over %d", ErrInvalidConfig, cfg.VerifyBatch, MaxVerifyBatch)
	}
	if cfg.VerifyBatch <= 0 {
		cfg.VerifyBatch = DefaultVerifyBatch
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	var kv jetstream.KeyValue
	err = membership.RetryEach(ctx, cfg.Logger, "bind the address directory bucket "+BucketName(cfg.Prefix), func(ctx context.Context) (err error) {
		kv, err = membership.BindOrCreate(ctx, js, jetstream.KeyValueConfig{
			Bucket:      BucketName(cfg.Prefix),
			Description: "natsmesh address directory",
			Placement:   membership.Placement(cfg.PlacementCluster),
			Storage:     jetstream.MemoryStorage,
			Replicas:    cfg.Replicas,
			History:     1,
			// Markers of released claims expire (DESIGN §10: a burst of
			// cold addresses leaves nothing lasting); needs nats-server
			// 2.11+, and a bucket created earlier without it is used as
			// it is (its markers stay).
			LimitMarkerTTL: cfg.MarkerTTL,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("directory: bucket: %w", err)
	}
	dctx, cancel := context.WithCancel(context.Background())
	d := &Directory{cfg: cfg, kv: kv, members: cfg.Members, log: cfg.Logger, owned: map[subjects.Address]held{}, unknown: map[subjects.NodeID]time.Time{}, ctx: dctx, cancel: cancel,
		bucketSubj: "$KV." + BucketName(cfg.Prefix) + ".", directGet: "$JS.API.DIRECT.GET.KV_" + BucketName(cfg.Prefix),
		departure: make(chan struct{}, 1)}
	d.stopEv = cfg.Members.OnEvent(func(e membership.Event) {
		if e.Type.Departed() {
			select {
			case d.departure <- struct{}{}:
			default:
			}
		}
	})
	d.wg.Add(1)
	go d.verifier()
	return d, nil
}

func key(addr subjects.Address) string { return subjects.EncodeToken(string(addr)) }

func (d *Directory) self() subjects.NodeID { return d.members.Self().Node }

// unavailable is the resendable directory verdict of a KV failure. The
// failure is kept as text only: a read that timed out is not a leg timeout
// (nothing was sent), and the predicates read a timeout anywhere in the
// chain as one (hub.claimFailed does the same).
func unavailable(op string, err error) error {
	return &verdict.Error{Reason: verdict.ReasonDirectoryDown, Message: "directory " + op + ": " + err.Error()}
}

// read returns the claim on addr and its revision (0 when absent).
func (d *Directory) read(ctx context.Context, addr subjects.Address) (Claim, uint64, error) {
	e, err := d.kv.Get(ctx, key(addr))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Claim{}, 0, nil
	}
	if err != nil {
		return Claim{}, 0, err
	}
	return d.parse(addr, e.Revision(), e.Value()), e.Revision(), nil
}

// parse reads a claim's value; one that does not parse is counted, logged
// and returned as the zero Claim (unowned, replaced under revision).
func (d *Directory) parse(addr subjects.Address, rev uint64, v []byte) Claim {
	var c Claim
	if err := json.Unmarshal(v, &c); err != nil || c.Owner.Validate() != nil {
		if n := d.invalid.Add(1); n&(n-1) == 0 {
			d.log.Warn("directory entry ignored (treated as unowned)", "address", string(addr), "revision", rev, "err", err, "ignored_total", n)
		}
		return Claim{}
	}
	return c
}

// held is one claim this node holds: the identity issued with its token
// and the revision the entry is at now.
type held struct {
	id  uint64
	rev uint64
}

// Claim makes this node the owner of addr and returns the token of the
// claim, or returns the live owner (hub.Claims). The token is the claim's
// own: a claim this node already held (an older activation of addr that is
// being collected) is re-adopted only by re-writing it under a revision
// check, so the new token names a revision the old one does not, and the
// old activation's Release or stand-down is a no-op.
//
// A claim naming a departed generation is replaced under a revision check,
// but not before the fencing delay after that departure
// (membership.TakeoverAt). A claim naming a generation this node has never
// seen alive (a node that joined and claimed before this node's view of the
// registry showed it) is not a departed one: it is replaced only after the
// fencing delay counted from this node's first read of it, once this node's
// registry view has caught up past that read (membership.UnseenTakeoverAt)
// — by then a live one would be in the view. Claim waits for either within
// ctx; it blocks on KV round trips.
func (d *Directory) Claim(ctx context.Context, addr subjects.Address) (hub.Grant, error) {
	self := d.self()
	b, _ := json.Marshal(Claim{Owner: self, Claimed: time.Now().UTC()}) // real clock: written to the bucket
	for range 8 {
		rev, err := d.kv.Create(ctx, key(addr), b)
		if err == nil {
			return d.own(addr, rev), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return hub.Grant{}, err
		}
		c, rev, err := d.read(ctx, addr)
		if err != nil {
			return hub.Grant{}, err
		}
		switch {
		case rev == 0:
			continue // released meanwhile: create again
		case c.Owner == self:
			// Ours already (an older activation's, being released):
			// re-adopt it by re-writing it, so the new token names a
			// revision the older activation's release cannot delete.
			nrev, err := d.kv.Update(ctx, key(addr), b, rev)
			if err == nil {
				return d.own(addr, nrev), nil
			}
			if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return hub.Grant{}, err
			}
			continue // released or re-written meanwhile: read again
		case d.members.Alive(c.Owner):
			d.cacheSet(addr, c.Owner)
			return hub.Grant{Owner: c.Owner}, nil
		}
		// Not alive: take over once it had time to fence itself (the
		// fencing delay), under the revision check. The wait is not
		// charged to the claim's KV work: a wait that would leave less
		// than ClaimWorkReserve of ctx for it is refused at once, as the
		// departure it is (resendable: nothing was accepted), instead of
		// running ctx out in the KV round trips after it and reporting a
		// healthy directory as unavailable (issue 24: a read 10.1 s after
		// an owner's SIGKILL failed "directory-unavailable … context
		// deadline exceeded").
		if wait := d.cfg.Clock.Until(d.takeoverAt(c.Owner)); wait > 0 {
			// Real clock: ctx's deadline is real time.
			if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait+ClaimWorkReserve).After(dl) {
				return hub.Grant{}, &verdict.Error{Reason: verdict.ReasonDeparted,
					Message: fmt.Sprintf("claim %s: its owner %s is gone and its fencing delay has %v to run before the address is taken over", addr, c.Owner, wait.Round(time.Millisecond))}
			}
			t := d.cfg.Clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return hub.Grant{}, fmt.Errorf("directory: claim %s: owner %s is not alive and is within its fencing delay: %w", addr, c.Owner, ctx.Err())
			case <-t.Chan():
			}
			continue // read again: it may have been claimed, or joined, meanwhile
		}
		nrev, err := d.kv.Update(ctx, key(addr), b, rev)
		if err == nil {
			return d.own(addr, nrev), nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return hub.Grant{}, err
		}
	}
	return hub.Grant{}, fmt.Errorf("directory: claim %s: contended", addr)
}

// ClaimWorkReserve is what a claim that waits for a departed owner's
// fencing delay keeps of its context for the KV round trips after the wait;
// a longer wait is refused at once (verdict.ErrDeparted, resendable).
const ClaimWorkReserve = time.Second

// takeoverAt is when a claim naming owner, a generation that is not alive,
// may be taken over: for a generation this node saw depart (or, by a newer
// generation of its name, superseded), membership.TakeoverAt; for one it
// has never seen, the fencing delay after this node first read a claim of
// it, once its registry view caught up past that read.
func (d *Directory) takeoverAt(owner subjects.NodeID) time.Time {
	if d.members.Known(owner) {
		return d.members.TakeoverAt(owner)
	}
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	first, ok := d.unknown[owner]
	if !ok {
		first = now
		if len(d.unknown) >= maxUnknown {
			for n, at := range d.unknown { // bounded: forget the stale ones
				if now.Sub(at) > d.members.TTL() {
					delete(d.unknown, n)
				}
			}
		}
		d.unknown[owner] = first
	}
	d.mu.Unlock()
	return d.members.UnseenTakeoverAt(first)
}

// maxUnknown bounds the generations never seen alive whose first read
// Claim remembers before it prunes those older than the registry's TTL.
const maxUnknown = 4096

// own records a claim written at rev as this node's, under a new identity,
// and returns its grant.
func (d *Directory) own(addr subjects.Address, rev uint64) hub.Grant {
	d.mu.Lock()
	d.lastID++
	id := d.lastID
	d.owned[addr] = held{id: id, rev: rev}
	d.newest = max(d.newest, rev)
	d.mu.Unlock()
	self := d.self()
	d.cacheSet(addr, self)
	return hub.Grant{Owner: self, Token: hub.ClaimToken{Addr: addr, ID: id, Rev: rev}}
}

// Holds reports whether t is this node's current claim on its address.
func (d *Directory) Holds(t hub.ClaimToken) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.owned[t.Addr]
	return ok && h.id == t.ID
}

// Release removes the claim t (hub.Claims), if it is still this node's
// current claim on its address, under a revision check so a newer owner's
// claim survives. A token a newer activation's claim replaced releases
// nothing. It blocks on one KV round trip (at most 2 s).
func (d *Directory) Release(t hub.ClaimToken) {
	if plant.On(plant.ReleaseByAddress) {
		// Planted, the release also runs late, as round 2's did (its
		// collection released one activation after another, each behind
		// the KV round trips of those before it): a next delivery's claim
		// lands first, and the release by address deletes it.
		d.cfg.Clock.Sleep(plant.ReleaseDelay)
	}
	d.mu.Lock()
	h, ok := d.owned[t.Addr]
	if !ok || h.id != t.ID && !plant.On(plant.ReleaseByAddress) {
		d.mu.Unlock()
		return
	}
	delete(d.owned, t.Addr)
	d.mu.Unlock()
	d.cacheDrop(t.Addr, d.self())
	ctx, cancel := context.WithTimeout(d.ctx, 2*time.Second)
	defer cancel()
	if err := d.remove(ctx, t.Addr, h.rev); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && d.ctx.Err() == nil {
		d.log.Warn("release claim", "address", string(t.Addr), "err", err)
	}
}

// remove deletes the claim on addr if it is still at rev: a purge whose
// marker expires after MarkerTTL, or, on a bucket without per-message TTLs
// (created before, or by a server older than 2.11), a plain delete whose
// marker stays.
func (d *Directory) remove(ctx context.Context, addr subjects.Address, rev uint64) error {
	if !d.noTTL.Load() {
		err := d.kv.Purge(ctx, key(addr), jetstream.LastRevision(rev), jetstream.PurgeTTL(d.cfg.MarkerTTL))
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeMessageTTLDisabled {
			return err
		}
		d.noTTL.Store(true) // the bucket takes no TTLs: delete as before
	}
	return d.kv.Delete(ctx, key(addr), jetstream.LastRevision(rev))
}

// Owned returns how many addresses this node holds claims on.
func (d *Directory) Owned() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.owned)
}

// Close stops the verifier. Claims stay until released or replaced.
func (d *Directory) Close() {
	d.once.Do(func() {
		d.stopEv()
		d.cancel()
		d.closePipeline()
		d.wg.Wait()
	})
}
