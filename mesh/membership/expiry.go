package membership

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/clock"
	"github.com/natsmesh/natsmesh/subjects"
)

// registryClock measures time during which the registry took writes and
// this node saw them: it advances by one tick per tick interval only if a
// fresh write (any node's heartbeat, this node's own included) was
// delivered by this node's registry watcher within the last slack.
// Silence is measured on it, so a registry without a leader (no heartbeat
// of anyone is taken), this node's own lost link (it sees nobody's) and a
// blind watcher (its consumer lived on a NATS server that died: this
// node's heartbeats succeed, but it sees no one's, its own included) all
// stop every member's silence from growing. A write this node made counts
// only once its watcher delivers it: its success alone does not show that
// the others' writes would have been seen.
type registryClock struct {
	mu        sync.Mutex
	t         time.Duration // registry time
	lastWrite time.Time     // wall time of the last write seen
	wall      clock.Clock   // the wall clock (Config.Clock); nil: the real one
}

func (c *registryClock) wrote() {
	c.mu.Lock()
	c.lastWrite = clock.Or(c.wall).Now()
	c.mu.Unlock()
}

func (c *registryClock) now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// tick advances the clock by d if a write was seen within slack.
func (c *registryClock) tick(d, slack time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastWrite.IsZero() && clock.Or(c.wall).Since(c.lastWrite) <= slack {
		c.t += d
	}
	return c.t
}

// expiry declares members gone whose entries the registry clock has not
// seen rewritten for a TTL, and removes their entries (revision check).
func (m *Membership) expiry() {
	defer m.wg.Done()
	every := max(m.cfg.Heartbeat/4, 5*time.Millisecond)
	slack := m.cfg.Heartbeat + every
	t := m.cfg.Clock.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.Chan():
		}
		now := m.clock.tick(every, slack)
		m.checkBlind()
		self := m.Self().Node
		var silent []subjects.NodeID
		m.mu.RLock()
		for _, v := range m.live {
			if v.Node != self && now-v.seen > m.cfg.TTL {
				silent = append(silent, v.Node)
			}
		}
		m.mu.RUnlock()
		for _, n := range silent {
			const why = "heartbeat silent past the TTL while the registry took writes"
			m.judge(n, Expired, time.Time{}, why)
		}
		m.retryMarks()
	}
}

// seen records that the watcher delivered revision rev and reports
// whether it is newer than any it delivered before (a new write, not a
// re-watch's replay).
func (m *Membership) seen(rev uint64) bool {
	for {
		cur := m.seenRev.Load()
		if rev <= cur {
			return false
		}
		if m.seenRev.CompareAndSwap(cur, rev) {
			m.cover(rev)
			return true
		}
	}
}

// wroteOwn records a successful write of this node's entry at rev, issued
// at start. The lag starts at the oldest own write the watcher has not
// delivered.
func (m *Membership) wroteOwn(rev uint64, start time.Time) {
	if m.seenRev.Load() >= m.ownRev.Load() {
		m.ownRevAt.Store(m.cfg.Clock.Now().UnixNano())
	}
	m.ownRev.Store(rev)
	m.covMu.Lock()
	if rev > m.lastOwn.rev {
		m.lastOwn.rev, m.lastOwn.start = rev, start
	}
	m.covMu.Unlock()
	m.cover(m.seenRev.Load())
}

// cover advances the view's coverage once the watcher delivered revision
// seen: if that reaches this node's last own write, every write that
// completed before that write was issued has been delivered too (the
// watcher delivers in stream order).
func (m *Membership) cover(seen uint64) {
	m.covMu.Lock()
	if m.lastOwn.rev != 0 && seen >= m.lastOwn.rev && m.lastOwn.start.After(m.covered) {
		m.covered = m.lastOwn.start
	}
	m.covMu.Unlock()
}

// departedMemory is how long a departure is remembered (Known, and a late
// write of a departed generation ignored): a few TTLs, at least the fencing
// delay. The map is pruned on each departure.
func (m *Membership) departedMemory() time.Duration {
	return max(m.cfg.FencingDelay, 4*m.cfg.TTL)
}

// blindAfter is how long the watcher may lag this node's own successful
// write before it is judged blind and restarted.
func (m *Membership) blindAfter() time.Duration {
	return 2*m.cfg.Heartbeat + 500*time.Millisecond
}

// checkBlind restarts the registry watcher when it has not delivered this
// node's own write for blindAfter: its consumer is gone (it lived on a NATS
// server that died; nats.go would notice only after two missed idle
// heartbeats, 10–20 s). Meanwhile the registry clock stands still (see
// registryClock), so nobody is expired for what a blind watcher missed.
func (m *Membership) checkBlind() {
	own := m.ownRev.Load()
	if own == 0 || m.seenRev.Load() >= own {
		return
	}
	at := m.ownRevAt.Load()
	if m.cfg.Clock.Since(time.Unix(0, at)) < m.blindAfter() {
		return
	}
	if !m.ownRevAt.CompareAndSwap(at, m.cfg.Clock.Now().UnixNano()) {
		return
	}
	select {
	case m.rewatch <- struct{}{}:
		m.rewatches.Add(1)
		m.log.Info("the registry watcher has not delivered this node's own heartbeat; watching afresh",
			"own_revision", own, "seen_revision", m.seenRev.Load())
	default:
	}
}

// disconnectAdvisory is the part of server.DisconnectEventMsg we read.
type disconnectAdvisory struct {
	Time   time.Time `json:"timestamp"`
	Server struct {
		ID string `json:"id"`
	} `json:"server"`
	Client struct {
		ID   uint64 `json:"id"`
		Name string `json:"name"`
	} `json:"client"`
	Reason string `json:"reason"`
}

// ProvesDeparture reports whether a disconnect advisory's reason (the
// server's ClosedState string) proves the client's process gone or cut off:
// the client side closed the socket ("Client Closed": a crash closes it;
// "Read Error"/"Write Error": it was reset), or it stopped answering pings
// ("Stale Connection": frozen or partitioned; it fences itself when it
// returns). Anything else — "Server Shutdown" (a restart, lame duck), a slow
// consumer, an authentication event — says the connection ended, not the
// process: the node reconnects with its generation.
func ProvesDeparture(reason string) bool {
	switch reason {
	case "Client Closed", "Read Error", "Write Error", "Stale Connection":
		return true
	}
	return false
}

// onAdvisory declares a member gone when the server reports its connection
// closed for a reason that proves it (ProvesDeparture), and reports it Moved
// otherwise. The member is found by its connection (server ID and client
// ID, from its registry entry), so names reused across incarnations do not
// matter.
func (m *Membership) onAdvisory(msg *nats.Msg) {
	var a disconnectAdvisory
	if json.Unmarshal(msg.Data, &a) != nil || a.Server.ID == "" {
		return
	}
	var v Member
	m.mu.RLock()
	for _, lm := range m.live {
		if lm.ServerID == a.Server.ID && lm.ClientID == a.Client.ID {
			v = lm.Member
			break
		}
	}
	m.mu.RUnlock()
	if v.Node.IsZero() || v.Node == m.Self().Node {
		return // not a member, or our own link: the heartbeat decides about us
	}
	if !ProvesDeparture(a.Reason) {
		m.log.Info("a node's connection closed without proof of departure; it keeps its generation", "member", v.Node.String(), "reason", a.Reason)
		m.emit(Event{Type: Moved, Member: v, At: m.cfg.Clock.Now(), Reason: a.Reason})
		return
	}
	m.judge(v.Node, Disconnected, a.Time, a.Reason)
}

// MovedToken is the subject token of connection-moved notices:
// <prefix>.mv.<name>.<gen>, published by a node on each reconnect.
const MovedToken = "mv"

// movedNotice is the payload of a connection-moved notice.
type movedNotice struct {
	ServerID string `json:"server_id"`
	ClientID uint64 `json:"client_id"`
}

// announceMoved tells the mesh at once, over core NATS, that this node's
// connection moved (a reconnect): senders re-send what was in flight to it
// without waiting for its next heartbeat, which a registry electing a
// leader (its server was the one that died) may hold back for seconds.
func (m *Membership) announceMoved() {
	self := m.Self().Node
	sid, cid := m.connIdentity()
	b, _ := json.Marshal(movedNotice{ServerID: sid, ClientID: cid})
	_ = m.cfg.Conn.Publish(m.cfg.Prefix.Sub(MovedToken+"."+self.String()), b)
}

// onMoved reports a live member's connection-moved notice as Moved and
// records its new connection, so a late advisory about its old connection
// does not depart it.
func (m *Membership) onMoved(msg *nats.Msg) {
	tail, ok := strings.CutPrefix(msg.Subject, m.cfg.Prefix.Sub(MovedToken+"."))
	if !ok {
		return
	}
	node, err := subjects.ParseNodeID(tail)
	if err != nil || node == m.Self().Node {
		return
	}
	var n movedNotice
	if json.Unmarshal(msg.Data, &n) != nil || n.ServerID == "" {
		return
	}
	m.mu.Lock()
	v, ok := m.live[node.Name]
	if !ok || v.Node != node {
		m.mu.Unlock()
		return
	}
	v.ServerID, v.ClientID = n.ServerID, n.ClientID
	member := v.Member
	m.mu.Unlock()
	m.emit(Event{Type: Moved, Member: member, At: m.cfg.Clock.Now(), Reason: "reconnected"})
}
