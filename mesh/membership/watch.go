package membership

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/subjects"
)

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
			case <-m.cfg.Clock.After(m.cfg.Heartbeat):
			}
			continue
		}
		// Revisions are compared within one watch: a registry created
		// afresh numbers its entries from 1 again.
		m.seenRev.Store(0)
		m.follow(w)
		// Not waited for: nats.go drops the subscription at once, then
		// asks JetStream to delete the consumer, which waits out the
		// JetStream API timeout (5 s) when the server is unreachable, and
		// Close waits for this goroutine. The consumer is ephemeral: the
		// server removes it without us.
		go func() { _ = w.Stop() }()
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
		if name == m.cfg.Name && rev < m.joinRev.Load() && v.Node.Generation < m.Self().Node.Generation {
			m.replayedBeforeJoin()
			return
		}
		if fresh && time.Since(v.BeatAt) < m.cfg.TTL { // real clock: BeatAt is the writer's
			// A fresh write seen through the watcher: the registry takes
			// writes and this node's view of it is current (the watcher
			// delivers in stream order, so every earlier write was seen).
			m.clock.wrote()
		}
		if v.Removed != nil {
			// A survivor's removal: the departure it judged, told to
			// every node before the entry is deleted — and durable.
			m.depart(v.Node, v.Removed.event(), v.Removed.At, v.Removed.Reason)
			at := m.cfg.Clock.Now()
			m.mu.RLock()
			_, already := m.durable[v.Node]
			if p, ok := m.pending[v.Node]; (ok && v.BeatAt.After(p.beat)) || m.renewedAfter[v.Node] {
				// It renewed its lease after this node judged it: it
				// may hold it up to a TTL after this mark.
				at = at.Add(m.cfg.TTL)
			}
			m.mu.RUnlock()
			if !already {
				// Once durable, the departed generation can renew
				// nothing more: a re-watch replaying this mark must not
				// push its takeover back each time.
				m.setDurableAt(v.Node, at)
			}
			break
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
				m.emit(Event{Type: Moved, Member: v, At: m.cfg.Clock.Now(), Reason: "heartbeat from a new connection"})
			}
			return
		case had && old.Node.Generation > v.Node.Generation:
			m.mu.Unlock()
			return // a stale write of an older generation
		}
		if _, gone := m.departed[v.Node]; gone {
			// A late write of a generation already judged gone: not
			// taken back into the view, but recorded — it is that
			// generation's last entry now (a deletion only before it
			// proves nothing), and it renewed the lease (durableGone).
			if rev > m.lastRev[v.Node] {
				m.lastRev[v.Node] = rev
				m.renewedAfter[v.Node] = true
			}
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		if had {
			reason := ""
			if v.Supersedes == old.Node.Generation {
				reason = "its successor proved its process gone (it holds the data directory's lock): taken over at once"
				m.mu.Lock()
				m.proof[old.Node] = true // before the departure's listeners ask TakeoverAt
				m.mu.Unlock()
			}
			m.depart(old.Node, Superseded, v.Started, reason)
			m.setDurable(old.Node) // the entry names the newer generation
		}
		m.mu.Lock()
		m.live[name] = &liveMember{Member: v, seen: now, rev: rev, since: m.cfg.Clock.Now()}
		m.mu.Unlock()
		m.durableGone(name, v.Node.Generation, rev) // older generations judged here: their entry is this one's now
		m.emit(Event{Type: Joined, Member: v, At: m.cfg.Clock.Now()})
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		if name == m.cfg.Name && rev < m.joinRev.Load() {
			m.replayedBeforeJoin()
			return
		}
		m.mu.RLock()
		old, had := m.live[name]
		m.mu.RUnlock()
		if !had {
			// Departed here already (its mark pending), or unknown: the
			// entry is gone from the registry all the same — if this
			// deletion came after the departed generation's entry, not
			// a replica's replay of an older one (durableGone).
			m.durableGone(name, math.MaxUint64, rev)
			break
		}
		if rev < old.rev {
			// Older than the entry this node holds for the name: a
			// re-watch served by a replica that lags replays history.
			// (In a registry created afresh, whose revisions start
			// again, a genuine deletion is ignored here too: the node
			// departs by its advisory or its silence instead.)
			m.staleReads.Add(1)
			return
		}
		t := Left
		if e.Operation() == jetstream.KeyValuePurge {
			t = Expired // a MaxAge marker (the backstop)
		}
		m.depart(old.Node, t, time.Time{}, "")
		m.setDurable(old.Node)
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

// replayedBeforeJoin handles an entry of this node's name that its watch
// delivered from before this generation registered — an older generation
// of the name, its removal mark, a deletion, at a revision below the
// registration's: a watch served by a replica that lags (the 30-minute
// soak's third stop, round 3: such a replay made a node that had just
// joined drop everything and rejoin). It is not taken as the loss of the
// registration, nor put in the view; but revisions can also fall for real
// (a registry created afresh, acknowledged writes lost), so the heartbeat
// is asked to write at once: its write is revision-checked at the leader,
// and what it meets there decides (heartbeat).
func (m *Membership) replayedBeforeJoin() {
	m.staleReads.Add(1)
	select {
	case m.beatNow <- struct{}{}:
	default:
	}
}

// durableGone records as durable every departure judged here and still
// pending of name's generations older than below: the registry's entry for
// the name is deleted (below math.MaxUint64) or names generation below, in
// a write at rev. Only a write after the last one this node saw of the
// departed generation's entry counts: a re-watch served by a replica that
// lags replays older history — a deletion of the name from before that
// generation registered — and taking that for its removal would let its
// addresses be taken over while it may still renew its lease. A departed
// generation whose heartbeat landed after it was judged here holds the
// lease that heartbeat renewed: durable then means a TTL from now (as
// remove says of a mark written over such a heartbeat).
func (m *Membership) durableGone(name string, below, rev uint64) {
	m.mu.Lock()
	for n := range m.departed {
		if _, ok := m.durable[n]; !ok && n.Name == name && n.Generation < below && rev > m.lastRev[n] {
			at := m.cfg.Clock.Now()
			if m.renewedAfter[n] {
				at = at.Add(m.cfg.TTL)
			}
			m.durable[n] = at
			delete(m.pending, n)
		}
	}
	m.mu.Unlock()
}

// retryMarks writes the removal marks of departures judged here that are
// not yet durable (their first write failed: the registry had no leader,
// or a heartbeat of the departed node kept landing between the read and
// the write), at most once a heartbeat and within one heartbeat for the
// round, so that the expiry loop is not held; called by the expiry loop.
func (m *Membership) retryMarks() {
	if m.cfg.Clock.Since(m.lastMarkTry) < m.cfg.Heartbeat {
		return
	}
	defer func() { m.lastMarkTry = m.cfg.Clock.Now() }()
	m.mu.RLock()
	pending := make(map[subjects.NodeID]pendingMark, len(m.pending))
	for n, p := range m.pending {
		pending[n] = p
	}
	m.mu.RUnlock()
	if len(pending) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.Heartbeat)
	defer cancel()
	for n, p := range pending {
		if ctx.Err() != nil {
			return
		}
		if at := m.remove(ctx, n, p.t, p.since, p.reason, p.beat); !at.IsZero() {
			m.mu.RLock()
			renewed := m.renewedAfter[n]
			m.mu.RUnlock()
			if renewed {
				// Its heartbeat landed after the judgment (the watch saw
				// it): whichever way remove found the entry gone —
				// superseded, absent — that lease lasts up to a TTL.
				at = later(at, m.cfg.Clock.Now().Add(m.cfg.TTL))
			}
			m.setDurableAt(n, at)
		}
	}
}

// remove marks node's registry entry Removed with the departure it judged
// (t, since, reason) if it still names node (revision check), so every node
// converges and the departed process, should it come back, finds itself
// gone. The mark is not followed by a delete: the registry keeps one
// revision per key (History 1), so a delete right behind it could replace
// the mark before a watcher was sent it, and a node still waiting for its
// own notice would read the delete as the generation's leave. The marked
// entry is the departed generation's tombstone: every reader treats it as
// gone; the next registration of the name replaces it, or the bucket's
// MaxAge backstop removes it. A survivor that finds it marked already
// writes nothing.
//
// It reports whether node's departure is now durable in the registry, and
// from when on node can hold no lease (durable, zero if not): the mark
// written (by this node or another), the entry absent (a Removed tombstone
// is created in its place: a direct get may be served by a replica behind
// node's registration, and only the leader's answer to a create proves the
// key absent), or naming a newer generation — each of which fails node's
// next heartbeat, so it cannot renew its lease. If the entry this node
// marks carries a heartbeat of node issued after the one judged
// (judgedBeat, its BeatAt), node renewed its lease meanwhile: it may hold
// it up to a TTL after the mark, so durable is the mark's time plus the
// TTL. Not durable
// means the registry could not be read or written (no leader, this node's
// link down, a heartbeat of node landing between each read and write):
// the caller retries. ctx bounds it.
func (m *Membership) remove(ctx context.Context, node subjects.NodeID, t EventType, since time.Time, reason string, judgedBeat time.Time) (durable time.Time) {
	if m.failMarks.Load() {
		return time.Time{}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if since.IsZero() {
		since = time.Now() // real clock: written in the mark
	}
	mark := func(v Member) []byte {
		v.Removed = &Removal{How: t.String(), Reason: reason, At: since.UTC(), By: m.Self().Node}
		b, _ := json.Marshal(v)
		return b
	}
	for range 3 { // a heartbeat of node may land between the read and the write
		e, err := m.kv.Get(ctx, node.Name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			// Absent, or so says a replica: a tombstone created at the
			// leader proves it (and fails node's next heartbeat).
			_, err := m.kv.Create(ctx, node.Name, mark(Member{Node: node}))
			if err == nil {
				return m.cfg.Clock.Now()
			}
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // it is there: read again
			}
			return time.Time{}
		}
		if err != nil {
			return time.Time{}
		}
		var v Member
		if json.Unmarshal(e.Value(), &v) != nil {
			return time.Time{} // not an entry this node can judge: not durable by it
		}
		renewed := v.Node == node && v.BeatAt.After(judgedBeat)
		switch {
		case v.Node.Name == node.Name && v.Node.Generation > node.Generation && !AbsurdGeneration(v.Node.Generation):
			return m.cfg.Clock.Now() // superseded: node's heartbeat fails
		case v.Node == node && v.Removed != nil:
			if renewed {
				return m.cfg.Clock.Now().Add(m.cfg.TTL)
			}
			return m.cfg.Clock.Now() // marked already
		case v.Node != node:
			return time.Time{} // an older generation's entry, or an absurd one node's heartbeat overwrites
		}
		_, err = m.kv.Update(ctx, node.Name, mark(v), e.Revision())
		if err == nil {
			if renewed {
				return m.cfg.Clock.Now().Add(m.cfg.TTL)
			}
			return m.cfg.Clock.Now()
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return time.Time{}
		}
	}
	return time.Time{}
}
