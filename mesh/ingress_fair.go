package mesh

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Fair shares of the ingress (DESIGN §10, "every per-caller resource is
// bounded"). An ingress delivery holds one slot of the node's ingress pool
// while it is forwarded (NodeConfig.IngressConcurrency); while it waits for a
// node hosting its kind to appear (the placement wait) it holds a slot of a
// second, smaller pool instead (NodeConfig.IngressPlacementWaits), so that
// deliveries nobody can take cannot crowd out deliveries that are moving.
//
// In each pool a caller (mesh.CallerIdentity; every fire-and-forget delivery
// is the one caller "anon") may take slots up to its share while any is
// free; beyond its share only while less than half of the pool is held. So one
// caller alone can use half the pool, and however hard it floods, the other
// half stays for callers under their share: a flood makes only its own
// deliveries Ignored (or, waiting for placement, Unavailable).

// Defaults of the fair shares, as fractions of the pool they divide.
const (
	// DefaultIngressCallerShareDivisor: a caller's share of the ingress
	// pool is IngressConcurrency / 16 (256 of the default 4096) unless
	// NodeConfig.IngressCallerShare says otherwise.
	DefaultIngressCallerShareDivisor = 16
	// DefaultIngressPlacementWaitsDivisor: the placement-wait pool holds
	// IngressConcurrency / 8 deliveries (512 of the default 4096) unless
	// NodeConfig.IngressPlacementWaits says otherwise; a caller's share of
	// it is a sixteenth of it.
	DefaultIngressPlacementWaitsDivisor = 8
)

// fairPool is a counting semaphore of size total in which each caller may
// hold share slots, and more only while fewer than open slots are held in
// all. Safe for concurrent use. Its per-caller map holds only callers that
// hold a slot, so it never has more than total entries.
type fairPool struct {
	total, share, open int

	mu   sync.Mutex
	held int
	by   map[string]int
}

func newFairPool(total, share int) *fairPool {
	total = max(total, 1)
	share = min(max(share, 1), total)
	return &fairPool{total: total, share: share, open: max(total/2, share), by: map[string]int{}}
}

// acquire takes a slot for caller and reports whether it got one.
func (p *fairPool) acquire(caller string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.by[caller]
	if p.held >= p.total || h >= p.share && p.held >= p.open {
		return false
	}
	p.by[caller] = h + 1
	p.held++
	return true
}

// release gives back a slot caller holds.
func (p *fairPool) release(caller string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.by[caller]; h > 1 {
		p.by[caller] = h - 1
	} else {
		delete(p.by, caller)
	}
	p.held--
}

// usage returns the slots held and the callers holding them.
func (p *fairPool) usage() (held, callers int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, len(p.by)
}

// ingressSlot is what one forwarded ingress delivery holds: a slot of the
// ingress pool, until its first attempt finds no node hosting its kind;
// then a slot of the placement-wait pool instead (placing), or nothing if
// that pool has none for its caller (the delivery then fails at once with
// verdict.ErrNoPlacement instead of waiting). Used by one forward goroutine
// at a time (the delivery's attempts run on it).
type ingressSlot struct {
	n       *Node
	caller  string
	ingress bool // holds an ingress-pool slot
	placing bool // holds a placement-wait slot
}

// unplaced is the Delivery hook the sender calls when an attempt first
// finds no live node hosting the kind: it reports whether the delivery may
// wait for one.
func (s *ingressSlot) unplaced() bool {
	if s.placing {
		return true
	}
	ok := s.n.placementPool.acquire(s.caller)
	if ok {
		s.placing = true
	} else {
		s.n.ingressPlacementRefused.Add(1)
	}
	if s.ingress {
		s.ingress = false
		s.n.ingressPool.release(s.caller)
	}
	return ok
}

func (s *ingressSlot) release() {
	if s.ingress {
		s.ingress = false
		s.n.ingressPool.release(s.caller)
	}
	if s.placing {
		s.placing = false
		s.n.placementPool.release(s.caller)
	}
}

// IngressShares reports the node's fair ingress shares (ingress_fair.go):
// gauges of what is held now, and counters since the node was built.
type IngressShares struct {
	Held             int   `json:"held"`              // ingress slots held now
	Callers          int   `json:"callers"`           // callers holding ingress slots now
	PlacementHeld    int   `json:"placement_held"`    // placement-wait slots held now
	ShareRefused     int64 `json:"share_refused"`     // deliveries answered Ignored: the pool or the caller's share was full
	PlacementRefused int64 `json:"placement_refused"` // deliveries failed no-placement at once: no placement wait left for their caller
	RateLimited      int64 `json:"rate_limited"`      // deliveries answered Ignored: over their caller's rate (NodeConfig.IngressCallerRate)
	// Busiest are the busiest callers by deliveries (at most
	// MaxListedCallers, the rest summed as OtherCallers): bounded label
	// cardinality for per-caller metrics.
	Busiest []IngressCaller `json:"busiest,omitempty"`
}

func (n *Node) ingressShares() IngressShares {
	held, callers := n.ingressPool.usage()
	pheld, _ := n.placementPool.usage()
	return IngressShares{
		Held: held, Callers: callers, PlacementHeld: pheld,
		ShareRefused: n.ingressShareRefused.Load(), PlacementRefused: n.ingressPlacementRefused.Load(),
		RateLimited: n.ingressRateLimited.Load(), Busiest: n.callerCounts.busiest(),
	}
}

// callerRates is the optional per-caller rate limit of the ingress
// (NodeConfig.IngressCallerRate): a token bucket per caller, refilled at
// rate per second up to burst. It tracks at most maxRateCallers callers;
// when that many are tracked, the buckets that have refilled (idle
// callers) are forgotten, and if none has, a new caller shares one
// overflow bucket with every other untracked caller — so callers made up
// by the dozen (reply prefixes in CallerFromInbox mode) are limited
// together. Safe for concurrent use.
type callerRates struct {
	rate, burst float64

	mu       sync.Mutex
	m        map[string]*tokenBucket
	overflow tokenBucket
}

type tokenBucket struct {
	tokens float64
	at     time.Time
}

// maxRateCallers bounds the callers callerRates tracks one by one.
const maxRateCallers = 4096

func newCallerRates(rate float64, burst int) *callerRates {
	if rate <= 0 {
		return nil
	}
	b := float64(burst)
	if b < 1 {
		b = max(1, rate)
	}
	return &callerRates{rate: rate, burst: b, m: map[string]*tokenBucket{}, overflow: tokenBucket{tokens: b}}
}

// allow takes a token of caller's bucket at now and reports whether there
// was one.
func (r *callerRates) allow(caller string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.m[caller]
	if b == nil {
		if len(r.m) >= maxRateCallers {
			for k, v := range r.m {
				if v.tokens+now.Sub(v.at).Seconds()*r.rate >= r.burst {
					delete(r.m, k)
				}
			}
		}
		if len(r.m) < maxRateCallers {
			b = &tokenBucket{tokens: r.burst, at: now}
			r.m[caller] = b
		} else {
			b = &r.overflow
		}
	}
	b.tokens = min(r.burst, b.tokens+now.Sub(b.at).Seconds()*r.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// callerCounts counts ingress deliveries per caller for NodeStatus
// (IngressShares.Callers), with bounded cardinality: at most
// maxCountedCallers callers are counted by name, every later one under
// OtherCallers. Safe for concurrent use.
type callerCounts struct {
	mu sync.Mutex
	m  map[string]*IngressCaller
}

// Bounds of the per-caller counts: how many callers are counted by name,
// and how many of them a status lists (the busiest).
const (
	maxCountedCallers = 1024
	// MaxListedCallers bounds IngressShares.Busiest (the busiest callers
	// by deliveries taken, plus OtherCallers): the label cardinality of
	// per-caller metrics.
	MaxListedCallers = 16
)

// OtherCallers names the sum of the callers not counted or not listed one
// by one.
const OtherCallers = "other"

// IngressCaller counts one caller's ingress deliveries (CallerIdentity's
// value: "acc:<account>:<user>", "inbox:<prefix>" or "anon").
type IngressCaller struct {
	Caller      string `json:"caller"`
	Taken       int64  `json:"taken"`        // deliveries given an ingress slot
	ShareFull   int64  `json:"share_full"`   // answered Ignored: the pool or its share was full
	RateLimited int64  `json:"rate_limited"` // answered Ignored: over the per-caller rate
}

func (c *callerCounts) add(caller string, f func(*IngressCaller)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*IngressCaller{}
	}
	e := c.m[caller]
	if e == nil {
		if len(c.m) >= maxCountedCallers {
			caller = OtherCallers
			e = c.m[caller]
		}
		if e == nil {
			e = &IngressCaller{Caller: caller}
			c.m[caller] = e
		}
	}
	f(e)
}

// busiest returns up to MaxListedCallers callers by deliveries taken, the
// rest summed under OtherCallers (last, if any).
func (c *callerCounts) busiest() []IngressCaller {
	c.mu.Lock()
	all := make([]IngressCaller, 0, len(c.m))
	for _, e := range c.m {
		all = append(all, *e)
	}
	c.mu.Unlock()
	slices.SortFunc(all, func(a, b IngressCaller) int {
		if a.Caller == OtherCallers || b.Caller == OtherCallers {
			return cmp.Compare(boolInt(a.Caller == OtherCallers), boolInt(b.Caller == OtherCallers))
		}
		if c := cmp.Compare(b.Taken+b.ShareFull+b.RateLimited, a.Taken+a.ShareFull+a.RateLimited); c != 0 {
			return c
		}
		return strings.Compare(a.Caller, b.Caller)
	})
	if len(all) <= MaxListedCallers {
		return all
	}
	other := IngressCaller{Caller: OtherCallers}
	for _, e := range all[MaxListedCallers-1:] {
		other.Taken += e.Taken
		other.ShareFull += e.ShareFull
		other.RateLimited += e.RateLimited
	}
	return append(all[:MaxListedCallers-1:MaxListedCallers-1], other)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
