package membership

import (
	"slices"
	"strings"
	"time"

	"github.com/natsmesh/natsmesh/subjects"
)

// View is the cluster view (DESIGN §9): who is alive, who is gone, who
// hosts a kind, when a departed or unseen generation's addresses may be
// taken over, and the events that change it. A node's *Membership is its
// view, replaced with its session on a rejoin; it is the one store of
// liveness the node's parts read — the directory (directory.Config.Members),
// the sender (mesh.WithView: the node itself, whose Gone asks its current
// session's membership), the ingress (it forwards through that sender) and
// sync-stream subscriptions (Node.Session). A process outside membership (a
// standalone mesh.Client) reads Static. Implementations are safe for
// concurrent use and do not block on NATS.
type View interface {
	// Self is this node's own registered generation.
	Self() Member
	// Members are the live generations, sorted by name.
	Members() []Member
	// Alive reports whether node is the live generation of its name.
	Alive(node subjects.NodeID) bool
	// Gone reports whether node is known gone (a newer generation of its
	// name is live, or it departed).
	Gone(node subjects.NodeID) bool
	// Known reports whether the view knows what became of node: alive,
	// departed within its memory, or superseded by a live generation.
	Known(node subjects.NodeID) bool
	// Hosting returns the live generations that host kind and take new
	// placements, sorted by name.
	Hosting(kind string) []subjects.NodeID
	// HostingNear is Hosting restricted to the NATS cluster named
	// cluster when any there host kind.
	HostingNear(kind, cluster string) []subjects.NodeID
	// TakeoverAt is when a departed or superseded node's addresses may be
	// taken over (the fencing delay after the view saw it go and the
	// registry recorded it); the zero time means at once; a time in the
	// near future may be asked again.
	TakeoverAt(node subjects.NodeID) time.Time
	// UnseenTakeoverAt is when a claim naming a generation the view never
	// saw, first read at first, may be taken over.
	UnseenTakeoverAt(first time.Time) time.Time
	// TTL is the registration's time to live.
	TTL() time.Duration
	// OnEvent calls f for every membership event until cancel.
	OnEvent(f func(Event)) (cancel func())
}

var _ View = (*Membership)(nil)

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
	return ok && m.cfg.Clock.Since(at) <= m.cfg.FencingDelay
}

// TakeoverAt returns when this node may take over addresses claimed by
// node, a generation that is not alive: its departure as this node learned
// it — once the departure is also a fact of the registry (its entry marked
// Removed, deleted, or naming a newer generation: the departed process can
// then no longer renew its lease), the later of the two — plus the fencing
// delay; while it is not, a heartbeat from now (ask again). For a
// generation superseded by a newer one of
// its name, when this node first saw the newer one plus the fencing delay;
// and never before this node's own join plus the fencing delay. The zero
// time means at once. A generation this node does not know (Known false)
// is judged by UnseenTakeoverAt instead.
//
// A generation that a newer one of its name superseded with proof that
// its process has exited (Member.Supersedes) may be taken over at once.
func (m *Membership) TakeoverAt(node subjects.NodeID) time.Time {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.provenGoneLocked(node) {
		return time.Time{}
	}
	if at, ok := m.departed[node]; ok {
		d, durable := m.durable[node]
		if !durable {
			// Judged here, not yet in the registry: the departed
			// process could still renew its lease and serve (a node
			// silent past the TTL whose survivor's mark was refused
			// resumed seconds later; the 30-minute soak, round 3).
			// Not yet — ask again after a heartbeat.
			return m.cfg.Clock.Now().Add(m.cfg.Heartbeat)
		}
		return later(at, d).Add(m.cfg.FencingDelay)
	}
	t := m.joinedAt.Add(m.cfg.FencingDelay)
	if v, ok := m.live[node.Name]; ok && v.Node.Generation > node.Generation && v.since.Add(m.cfg.FencingDelay).After(t) {
		t = v.since.Add(m.cfg.FencingDelay)
	}
	if m.cfg.Clock.Now().Before(t) {
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
		if next := m.cfg.Clock.Now().Add(m.cfg.Heartbeat); next.After(at) {
			return next
		}
		return at
	}
	if m.cfg.Clock.Now().Before(at) {
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

// HostingNear returns the live generations that host kind and take new
// placements and whose connection is in the NATS cluster named cluster, if
// there is any; otherwise (or when cluster is empty) it returns
// Hosting(kind). Sorted by name. On a supercluster a sender places a new
// address among the nodes of its own cluster first (DESIGN §12): single
// activation does not depend on it, since the claim decides.
func (m *Membership) HostingNear(kind, cluster string) []subjects.NodeID {
	if cluster == "" {
		return m.Hosting(kind)
	}
	m.mu.RLock()
	var out []subjects.NodeID
	for _, v := range m.live {
		if v.Hosts(kind) && !v.Draining && v.Cluster == cluster {
			out = append(out, v.Node)
		}
	}
	m.mu.RUnlock()
	if len(out) == 0 {
		return m.Hosting(kind)
	}
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
	now := m.cfg.Clock.Now()
	m.mu.Lock()
	v, ok := m.live[node.Name]
	if !ok || v.Node != node {
		m.mu.Unlock()
		return false
	}
	delete(m.live, node.Name)
	m.departed[node] = now
	m.lastRev[node] = v.rev
	keep := m.departedMemory()
	for n, at := range m.departed { // bounded: only recent departures
		if _, ok := m.durable[n]; !ok && len(m.departed) <= maxPendingDepartures {
			continue // kept until its mark is written: TakeoverAt waits for it
		}
		if now.Sub(at) > keep {
			delete(m.departed, n)
			delete(m.proof, n)
			delete(m.durable, n)
			delete(m.pending, n)
			delete(m.lastRev, n)
			delete(m.renewedAfter, n)
		}
	}
	m.mu.Unlock()
	var lat time.Duration
	switch { // real clock: a latency metric, against times from the registry
	case t == Expired:
		lat = time.Since(v.BeatAt)
	case !since.IsZero():
		lat = time.Since(since)
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

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// maxPendingDepartures bounds the departures kept past departedMemory
// because their removal mark is not yet written.
const maxPendingDepartures = 4096

// setDurable records that node's departure is a fact of the registry
// (see Membership.durable), at its first sighting.
func (m *Membership) setDurable(node subjects.NodeID) { m.setDurableAt(node, m.cfg.Clock.Now()) }

// setDurableAt records node's departure durable from at (see
// Membership.durable), or from the later time already recorded; only for a generation this
// node departed (a tombstone replayed at join or on a re-watch names one
// it never saw live: nothing to record).
func (m *Membership) setDurableAt(node subjects.NodeID, at time.Time) {
	m.mu.Lock()
	if _, departed := m.departed[node]; departed {
		if cur, ok := m.durable[node]; !ok || at.After(cur) {
			m.durable[node] = at // the later: a lease renewed after the judgment outlives the mark
		}
	}
	delete(m.pending, node)
	m.mu.Unlock()
}

// pendingMark is a departure judged here whose removal mark is not written
// yet: what the mark will say.
type pendingMark struct {
	t      EventType
	since  time.Time
	reason string
	beat   time.Time // the BeatAt of node's entry as this node judged it
}

// judge departs node as this node judged it (t, since, reason) and marks
// its registry entry Removed; a mark that cannot be written now is retried
// by the expiry loop (retryMarks), and until one is, TakeoverAt waits.
func (m *Membership) judge(node subjects.NodeID, t EventType, since time.Time, reason string) {
	m.mu.RLock()
	var beat time.Time
	if v, ok := m.live[node.Name]; ok && v.Node == node {
		beat = v.BeatAt
	}
	m.mu.RUnlock()
	if !m.depart(node, t, since, reason) {
		return
	}
	if since.IsZero() {
		since = time.Now() // the judgment's time, also on a retried mark; real clock: written in the mark
	}
	if at := m.remove(m.ctx, node, t, since, reason, beat); !at.IsZero() {
		m.setDurableAt(node, at)
		return
	}
	m.mu.Lock()
	if _, ok := m.durable[node]; !ok {
		m.pending[node] = pendingMark{t: t, since: since, reason: reason, beat: beat}
	}
	m.mu.Unlock()
}

// provenGoneLocked reports whether the live generation of node's name, or
// this node itself, superseded node with proof that its process exited
// (Member.Supersedes). Called with mu held.
func (m *Membership) provenGoneLocked(node subjects.NodeID) bool {
	if node.Generation == 0 {
		return false
	}
	if m.proof[node] {
		return true
	}
	if m.self.Node.Name == node.Name && m.self.Supersedes == node.Generation {
		return true
	}
	v, ok := m.live[node.Name]
	return ok && v.Node.Generation > node.Generation && v.Supersedes == node.Generation
}
