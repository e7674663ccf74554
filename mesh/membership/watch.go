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

// remove deletes node's registry entry if it still names node (revision
// check), so every node converges and the departed process, should it come
// back, finds itself gone.
func (m *Membership) remove(node subjects.NodeID) {
	ctx, cancel := context.WithTimeout(m.ctx, 2*time.Second)
	defer cancel()
	for range 3 { // a heartbeat of node may land between the read and the delete
		e, err := m.kv.Get(ctx, node.Name)
		if err != nil {
			return
		}
		var v Member
		if json.Unmarshal(e.Value(), &v) != nil || v.Node != node {
			return
		}
		if err := m.kv.Delete(ctx, node.Name, jetstream.LastRevision(e.Revision())); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return
		}
	}
}
