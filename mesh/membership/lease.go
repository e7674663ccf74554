package membership

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The registration lease (DESIGN §12, "a cluster cut off by a gateway
// failure"): a node whose own heartbeat writes have failed for a TTL stops
// starting turns, unless it can show that nobody else's are taken either.
//
// Why: survivors declare a generation gone after heartbeat silence past the
// TTL while the registry took other nodes' writes, and take its addresses
// over a fencing delay later. A node whose link to its own NATS server is
// up but whose server cannot reach the registry's leader — its cluster cut
// off by a gateway failure, or a server partitioned from the rest of its
// cluster — sees no link drop, so the link fence never stops it. Its last
// acknowledged write was issued at some time w; no survivor's registry
// clock can count the TTL from before it saw that write, so none expires it
// before w + TTL, and none takes over before w + TTL + FencingDelay. The
// node stops starting turns at w + TTL: a fencing delay of margin for a
// turn that is already running.
//
// The exception keeps a registry without a leader (a JetStream leader
// election: 2.7–5.5 s measured) from pausing the whole mesh when the TTL is
// short: nobody can be expired while nobody's write is taken (the registry
// clock stops), so a node may go on while it reads the registry's entries
// (any replica serves a direct get) and finds that none changed over a
// heartbeat period. A node that cannot read them at all, or sees another
// member's entry advance while its own writes fail, is the one cut off.
// Residual risk, written down: a node that reads only from a replica
// itself cut off from a leader that takes the others' writes sees no
// change and goes on; it is stopped by its claims' verification instead
// (DESIGN §6), not by the lease.

// leaseHeld reports whether this node's last acknowledged own write was
// issued within the TTL, or the registry is known to take nobody's writes.
func (m *Membership) leaseHeld() bool {
	m.covMu.Lock()
	start := m.lastOwn.start
	m.covMu.Unlock()
	if start.IsZero() || time.Since(start) <= m.cfg.TTL {
		return true
	}
	return m.stalled.Load()
}

// LeaseLapsed reports whether turns are stopped by the lease: the last
// acknowledged heartbeat was issued more than a TTL ago and the registry is
// not known to be without a leader.
func (m *Membership) LeaseLapsed() bool { return !m.leaseHeld() }

// probeRegistry runs on the heartbeat goroutine after a failed heartbeat
// once the last acknowledged one is half a TTL old: it reads every entry
// the view holds (this node's own too) and records whether they are all
// unchanged since the last probe at least a heartbeat period ago
// (m.stalled). Any read error, or any change, clears it.
func (m *Membership) probeRegistry() {
	m.covMu.Lock()
	start := m.lastOwn.start
	m.covMu.Unlock()
	if start.IsZero() || time.Since(start) < m.cfg.TTL/2 {
		m.resetProbe()
		return
	}
	m.mu.RLock()
	names := make([]string, 0, len(m.live)+1)
	names = append(names, m.cfg.Name)
	for name := range m.live {
		if name != m.cfg.Name {
			names = append(names, name)
		}
	}
	m.mu.RUnlock()
	revs := make(map[string]uint64, len(names))
	ctx, cancel := context.WithTimeout(m.ctx, max(m.cfg.Heartbeat, time.Second))
	defer cancel()
	for _, name := range names {
		e, err := m.kv.Get(ctx, name)
		switch {
		case err == nil:
			revs[name] = e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound):
			revs[name] = 0
		default:
			m.setStalled(false, "the registry cannot be read")
			m.probe.revs = nil
			return
		}
	}
	now := time.Now()
	switch {
	case m.probe.revs == nil:
		m.probe.revs, m.probe.at = revs, now
	case !maps.Equal(m.probe.revs, revs):
		m.setStalled(false, "other members' heartbeats are taken")
		m.probe.revs, m.probe.at = revs, now
	case now.Sub(m.probe.at) >= m.cfg.Heartbeat:
		m.setStalled(true, "")
	}
}

// resetProbe forgets the probe once a heartbeat is acknowledged again.
func (m *Membership) resetProbe() {
	m.probe.revs = nil
	m.setStalled(false, "")
}

// setStalled records the probe's finding and logs a change of what the
// lease allows.
func (m *Membership) setStalled(stalled bool, why string) {
	was := m.stalled.Swap(stalled)
	lapsed := !m.leaseHeld()
	switch {
	case lapsed && !m.lapseLogged:
		m.lapseLogged = true
		m.log.Warn("heartbeats unacknowledged for the TTL: turns stop until one is (registration lease)", "ttl", m.cfg.TTL.String(), "why", why)
		m.lapses.Add(1)
	case !lapsed && m.lapseLogged:
		m.lapseLogged = false
		m.log.Info("registration lease held again: turns resume")
	case stalled && !was:
		m.log.Info("the registry takes nobody's heartbeat (no leader): turns go on past the TTL")
	}
}

// LeaseLapses counts the times the lease lapsed (turns stopped by it).
func (m *Membership) LeaseLapses() int64 { return m.lapses.Load() }
