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
// issued within the TTL, and this process was not found paused since.
func (m *Membership) leaseHeld() bool {
	held, _ := m.lease()
	return held
}

// lease is leaseHeld, with why the lease is not held: the process was
// paused (no heartbeat issued since is acknowledged yet), or just woke (the
// watchdog has not ticked yet), or its heartbeats went unacknowledged for
// the TTL.
func (m *Membership) lease() (held bool, why string) {
	// lastTick before suspectAt: the watchdog stores suspectAt, then
	// lastTick, so a fresh tick read here means its suspicion, if any, is
	// read below too (read the other way round, a turn woken beside the
	// watchdog's first tick after a pause could read the suspicion before
	// it was stored and the tick after: a lease that looked held).
	tick := m.lastTick.Load()
	m.covMu.Lock()
	start := m.lastOwn.start
	m.covMu.Unlock()
	if s := m.suspectAt.Load(); s != 0 && (start.IsZero() || start.UnixNano() <= s) {
		return false, "this process was paused: no heartbeat issued since is acknowledged yet"
	}
	if m.cfg.Clock.Since(time.Unix(0, tick)) > PauseGap {
		return false, "this process was paused: it has just woken"
	}
	if start.IsZero() || m.cfg.Clock.Since(start) <= m.cfg.TTL {
		return true, ""
	}
	return false, "heartbeats unacknowledged for the TTL"
}

// PauseGap is how long this process may go without its watchdog ticking
// (every PauseGap/10) before it counts as having been paused — stopped by
// SIGSTOP, frozen — rather than merely scheduled late.
const PauseGap = time.Second

// watchdog ticks every PauseGap/10. A gap above PauseGap means the process
// was stopped: its link may have been closed and its generation declared
// gone meanwhile, and queued deliveries must not run before it knows.
// Found by the nemesis: a node frozen for 4 s (past detection and
// takeover, within the 8 s TTL, so the lease still held) woke and ran the
// deliveries it had accepted before the freeze, 0.5 s after their re-sends
// had run on the successor. So after a gap no turn starts until a
// heartbeat issued after it is acknowledged (it asks for one at once); a
// generation declared gone meanwhile finds out from that heartbeat and is
// fenced.
func (m *Membership) watchdog() {
	defer m.wg.Done()
	t := m.cfg.Clock.NewTicker(PauseGap / 10)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.Chan():
		}
		now := m.cfg.Clock.Now().UnixNano()
		if gap := time.Duration(now - m.lastTick.Load()); gap > PauseGap {
			m.suspectAt.Store(now)
			m.log.Warn("this process was paused: turns wait for a heartbeat", "paused_for", gap.Round(time.Millisecond).String())
			select {
			case m.beatNow <- struct{}{}:
			default:
			}
		}
		m.lastTick.Store(now)
	}
}

// LeaseLapsed reports whether turns are stopped by the lease: the last
// acknowledged heartbeat was issued more than a TTL ago.
func (m *Membership) LeaseLapsed() bool { return !m.leaseHeld() }

// noteLease runs on the heartbeat goroutine after every heartbeat: it
// logs and counts a lapse of the lease once, and its end.
func (m *Membership) noteLease() {
	held, why := m.lease()
	lapsed := !held
	switch {
	case lapsed && !m.lapseLogged:
		m.lapseLogged = true
		m.lapses.Add(1)
		m.log.Warn(why+": turns stop until a heartbeat is acknowledged (registration lease)", "ttl", m.cfg.TTL.String())
	case !lapsed && m.lapseLogged:
		m.lapseLogged = false
		m.log.Info("registration lease held again: turns resume")
	}
}

// LeaseLapses counts the times the lease lapsed (turns stopped by it).
func (m *Membership) LeaseLapses() int64 { return m.lapses.Load() }
