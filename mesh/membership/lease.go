package membership

import "time"

// The registration lease (DESIGN §12, "a cluster cut off by a gateway
// failure"): a node whose own heartbeat writes have failed for a TTL stops
// starting turns.
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
// No exception for a registry without a leader: a node cannot tell a
// leaderless registry from a leader it cannot reach. A first version went on
// past the TTL while direct gets of the registry showed no entry changing;
// a hostile tester isolated a server from its cluster (its clients still
// attached) and its own cut-off replica answered those gets, unchanging, so
// its node served beside its successors for the whole cut (6 822 turns,
// 7–77 overlaps). The cost instead: a registry leader election longer than
// the TTL pauses turns until a heartbeat is acknowledged. The default TTL
// (8 s) outlasts the elections measured (2.7–5.5 s); a TTL set below that
// trades pauses during elections for faster failure detection.

// leaseHeld reports whether this node's last acknowledged own write was
// issued within the TTL.
func (m *Membership) leaseHeld() bool {
	m.covMu.Lock()
	start := m.lastOwn.start
	m.covMu.Unlock()
	return start.IsZero() || time.Since(start) <= m.cfg.TTL
}

// LeaseLapsed reports whether turns are stopped by the lease: the last
// acknowledged heartbeat was issued more than a TTL ago.
func (m *Membership) LeaseLapsed() bool { return !m.leaseHeld() }

// noteLease runs on the heartbeat goroutine after every heartbeat: it
// logs and counts a lapse of the lease once, and its end.
func (m *Membership) noteLease() {
	lapsed := !m.leaseHeld()
	switch {
	case lapsed && !m.lapseLogged:
		m.lapseLogged = true
		m.lapses.Add(1)
		m.log.Warn("heartbeats unacknowledged for the TTL: turns stop until one is (registration lease)", "ttl", m.cfg.TTL.String())
	case !lapsed && m.lapseLogged:
		m.lapseLogged = false
		m.log.Info("registration lease held again: turns resume")
	}
}

// LeaseLapses counts the times the lease lapsed (turns stopped by it).
func (m *Membership) LeaseLapses() int64 { return m.lapses.Load() }
