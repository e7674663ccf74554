package membership

import (
	"context"
	"encoding/json"
	"errors"
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
			case <-time.After(m.cfg.Heartbeat):
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
		if fresh && time.Since(v.BeatAt) < m.cfg.TTL {
			// A fresh write seen through the watcher: the registry takes
			// writes and this node's view of it is current (the watcher
			// delivers in stream order, so every earlier write was seen).
			m.clock.wrote()
		}
		if v.Removed != nil {
			// A survivor's removal: the departure it judged, told to
			// every node before the entry is deleted.
			m.depart(v.Node, v.Removed.event(), v.Removed.At, v.Removed.Reason)
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
			reason := ""
			if v.Supersedes == old.Node.Generation {
				reason = "its successor proved its process gone (it holds the data directory's lock): taken over at once"
				m.mu.Lock()
				m.proof[old.Node] = true // before the departure's listeners ask TakeoverAt
				m.mu.Unlock()
			}
			m.depart(old.Node, Superseded, v.Started, reason)
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
func (m *Membership) remove(node subjects.NodeID, t EventType, since time.Time, reason string) {
	ctx, cancel := context.WithTimeout(m.ctx, 2*time.Second)
	defer cancel()
	if since.IsZero() {
		since = time.Now()
	}
	for range 3 { // a heartbeat of node may land between the read and the write
		e, err := m.kv.Get(ctx, node.Name)
		if err != nil {
			return
		}
		var v Member
		if json.Unmarshal(e.Value(), &v) != nil || v.Node != node || v.Removed != nil {
			return
		}
		v.Removed = &Removal{How: t.String(), Reason: reason, At: since.UTC(), By: m.Self().Node}
		b, _ := json.Marshal(v)
		if _, err := m.kv.Update(ctx, node.Name, b, e.Revision()); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return
		}
	}
}
