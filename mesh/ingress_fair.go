package mesh

import (
	"sync"
)

// Fair shares of the ingress (DESIGN §10, "every per-caller resource is
// bounded"). An ingress delivery holds one slot of the node's ingress pool
// while it is forwarded (NodeConfig.IngressConcurrency); while it waits for a
// node hosting its kind to appear (the placement wait) it holds a slot of a
// second, smaller pool instead (NodeConfig.IngressPlacementWaits), so that
// deliveries nobody can take cannot crowd out deliveries that are moving.
//
// In each pool a caller (mesh.CallerIdentity; every fire-and-forget delivery
// is the one caller "anon") may hold up to its share; beyond its share it
// may take a slot only while less than half of the pool is held. So one
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
}

func (n *Node) ingressShares() IngressShares {
	held, callers := n.ingressPool.usage()
	pheld, _ := n.placementPool.usage()
	return IngressShares{
		Held: held, Callers: callers, PlacementHeld: pheld,
		ShareRefused: n.ingressShareRefused.Load(), PlacementRefused: n.ingressPlacementRefused.Load(),
	}
}
