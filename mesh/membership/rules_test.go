package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// advisory publishes a disconnect advisory for m's connection with reason.
func advisory(t *testing.T, pub interface {
	Publish(string, []byte) error
}, subject string, m *Membership, reason string) {
	t.Helper()
	self := m.Self()
	b, _ := json.Marshal(map[string]any{
		"timestamp": time.Now(),
		"server":    map[string]any{"id": self.ServerID},
		"client":    map[string]any{"id": self.ClientID, "name": ConnName(self.Node)},
		"reason":    reason,
	})
	if err := pub.Publish(subject, b); err != nil {
		t.Fatal(err)
	}
}

// TestAdvisoryReasons: a connection is not a generation. Only reasons that
// prove the process gone or cut off depart a member; "Server Shutdown" (a
// restart, lame duck) and others are reported Moved and keep it.
func TestAdvisoryReasons(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	pub := natstest.Connect(t, s)
	const subj = "test.advisory"
	for _, tc := range []struct {
		reason string
		proof  bool
	}{
		{"Server Shutdown", false},
		{"Slow Consumer (Pending Bytes)", false},
		{"Authentication Expired", false},
		{"Kicked", false},
		{"Client Closed", true},
		{"Stale Connection", true},
		{"Read Error", true},
		{"Write Error", true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if ProvesDeparture(tc.reason) != tc.proof {
				t.Fatalf("ProvesDeparture(%q) = %v", tc.reason, !tc.proof)
			}
			w := join(t, natstest.Connect(t, s), "w", Config{AdvisorySubject: subj, Replace: true})
			var rec recorder
			w.OnEvent(rec.add)
			a := join(t, natstest.Connect(t, s), "a", Config{AdvisorySubject: subj, Replace: true})
			natstest.Eventually(t, 5*time.Second, func() bool { return w.Alive(a.Self().Node) }, "a joined")
			advisory(t, pub, subj, a, tc.reason)
			if tc.proof {
				natstest.Eventually(t, 5*time.Second, func() bool { _, ok := rec.find(Disconnected, a.Self().Node); return ok }, "departure")
				select {
				case <-a.Lost():
				case <-time.After(5 * time.Second):
					t.Fatal("the departed generation did not learn it was removed")
				}
				return
			}
			natstest.Eventually(t, 5*time.Second, func() bool { _, ok := rec.find(Moved, a.Self().Node); return ok }, "moved event")
			// Several heartbeats later it is still alive and registered.
			beat := a.Self().Beat
			natstest.Eventually(t, 5*time.Second, func() bool { return a.Self().Beat > beat+3 }, "heartbeats go on")
			if !w.Alive(a.Self().Node) || !a.Confirmed() {
				t.Fatalf("%q departed the member (alive %v, confirmed %v)", tc.reason, w.Alive(a.Self().Node), a.Confirmed())
			}
			if _, ok := rec.find(Disconnected, a.Self().Node); ok {
				t.Fatal("a departure event for a non-proof reason")
			}
			a.Close()
		})
	}
}

// TestLostHeartbeatReplyDoesNotFence: a heartbeat whose reply was lost (the
// node's revision is stale, the stored entry is still its own) re-reads the
// entry and goes on; it never fences the node.
func TestLostHeartbeatReplyDoesNotFence(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	a := join(t, natstest.Connect(t, s), "a", Config{})
	for range 5 {
		natstest.Eventually(t, 5*time.Second, func() bool { return a.Self().Beat > 0 }, "beating")
		// A write landed but its reply was lost: our revision is behind.
		a.mu.Lock()
		a.rev--
		a.mu.Unlock()
		beat := a.Self().Beat
		natstest.Eventually(t, 5*time.Second, func() bool { return a.Self().Beat > beat+1 }, "heartbeats go on")
		select {
		case <-a.Lost():
			t.Fatal("a lost heartbeat reply fenced the node")
		default:
		}
	}
	// The stored entry was this node's own write each time: no overwrite
	// by another writer is reported.
	if n := a.Stats().Overwritten; n != 0 {
		t.Errorf("%d lost heartbeat replies reported as overwrites by another writer", n)
	}
}

// TestSameNameRefused: a live, heartbeating generation of a name is not
// superseded without Replace, and nothing is written; with Replace it is.
// A generation that stopped beating does not hold its name.
func TestSameNameRefused(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: time.Second}
	old := join(t, nc, "same", cfg)
	rev := old.rev
	cfg.Conn, cfg.Name, cfg.Kinds = natstest.Connect(t, s), "same", []string{"echo"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	announced := false
	cfg.BeforeAnnounce = func(subjects.NodeID) (func(), error) { announced = true; return nil, nil }
	_, err := Join(ctx, cfg)
	if !errors.Is(err, ErrNameInUse) {
		t.Fatalf("Join with a live name: %v, want ErrNameInUse", err)
	}
	if announced {
		t.Error("BeforeAnnounce ran although the name is live")
	}
	if _, cur, _ := old.readEntry(ctx, "same"); cur < rev {
		t.Errorf("registry revision %d went back from %d", cur, rev)
	}
	select {
	case <-old.Lost():
		t.Fatal("the live generation was superseded")
	default:
	}
	// Replace: a deliberate takeover.
	cfg.Replace, cfg.BeforeAnnounce = true, nil
	fresh, err := Join(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fresh.Close)
	select {
	case <-old.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced generation was not told")
	}
	if !old.Superseded() {
		t.Error("not superseded")
	}
	// A generation that stopped beating (crashed) does not hold the name.
	fresh.Close()
	cfg.Replace = false
	start := time.Now()
	third, err := Join(ctx, cfg)
	if err != nil {
		t.Fatalf("Join after the name's generation went silent: %v", err)
	}
	t.Cleanup(third.Close)
	t.Logf("a silent generation's name was free after %v (TTL 1s)", time.Since(start))
}

// TestJoinOrder: BeforeAnnounce runs with the generation before it is in
// the registry.
func TestJoinOrder(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	probe := join(t, natstest.Connect(t, s), "probe", Config{})
	var seenBefore bool
	var gen subjects.NodeID
	m := join(t, nc, "n", Config{BeforeAnnounce: func(id subjects.NodeID) (func(), error) {
		gen = id
		cur, _, err := probe.readEntry(context.Background(), "n")
		seenBefore = err != nil || cur.Node == id
		return nil, nil
	}})
	if seenBefore {
		t.Fatal("the generation was in the registry before BeforeAnnounce ran")
	}
	if m.Self().Node != gen {
		t.Fatalf("announced %v, BeforeAnnounce saw %v", m.Self().Node, gen)
	}
}

// TestTakeoverAfterFencingDelay: survivors may take a departed generation's
// addresses over only a fencing delay after they learned the departure.
func TestTakeoverAfterFencingDelay(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	w := join(t, natstest.Connect(t, s), "w", Config{FencingDelay: 300 * time.Millisecond})
	a := join(t, natstest.Connect(t, s), "a", Config{})
	natstest.Eventually(t, 5*time.Second, func() bool { return w.Alive(a.Self().Node) }, "a joined")
	if err := a.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return !w.Alive(a.Self().Node) }, "a left")
	at := w.TakeoverAt(a.Self().Node)
	if d := time.Until(at); d <= 0 || d > 300*time.Millisecond {
		t.Fatalf("takeover in %v, want within (0, 300ms]", d)
	}
	if !w.Gone(a.Self().Node) {
		t.Fatal("a generation that just left is not Gone")
	}
	// Gone only within the fencing delay; the departure itself is
	// remembered (Known) for departedMemory and then pruned, so the view
	// does not grow with every departure.
	natstest.Eventually(t, 5*time.Second, func() bool { return !w.Gone(a.Self().Node) }, "not Gone after the fencing delay")
	if !w.Known(a.Self().Node) || !w.TakeoverAt(a.Self().Node).IsZero() && time.Until(w.TakeoverAt(a.Self().Node)) > 0 {
		t.Fatal("a departure within departedMemory is not Known, or not yet ready for takeover after the fencing delay")
	}
	w.mu.Lock()
	w.departed[a.Self().Node] = time.Now().Add(-w.departedMemory() - time.Second) // as if long ago
	w.mu.Unlock()
	b := join(t, natstest.Connect(t, s), "b", Config{})
	natstest.Eventually(t, 5*time.Second, func() bool { return w.Alive(b.Self().Node) }, "b joined")
	if err := b.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return !w.Alive(b.Self().Node) }, "b left")
	w.mu.RLock()
	n := len(w.departed)
	w.mu.RUnlock()
	if n != 1 {
		t.Fatalf("%d departures remembered, want 1 (the pruned one gone)", n)
	}
	older := subjects.NodeID{Name: w.Self().Node.Name, Generation: w.Self().Node.Generation - 1}
	if !w.Gone(older) {
		t.Fatal("an older generation of a live name is not Gone")
	}
}

// TestRegistryClock: silence is counted only while writes are seen.
func TestRegistryClock(t *testing.T) {
	t.Parallel()
	var c registryClock
	if c.tick(time.Second, time.Second) != 0 {
		t.Fatal("the clock ran before any write")
	}
	c.wrote()
	if c.tick(time.Second, time.Second) != time.Second {
		t.Fatal("the clock did not run after a write")
	}
	c.mu.Lock()
	c.lastWrite = time.Now().Add(-2 * time.Second)
	c.mu.Unlock()
	if c.tick(time.Second, time.Second) != time.Second {
		t.Fatal("the clock ran without recent writes")
	}
}

// TestMovedNoticeOnReconnect: a node whose connection moves tells the mesh
// at once over core NATS (no registry write needed): the others report it
// Moved — not departed — with its new connection.
func TestMovedNoticeOnReconnect(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	w := join(t, natstest.Connect(t, s), "w", Config{})
	var rec recorder
	w.OnEvent(rec.add)
	anc := natstest.Connect(t, s, nats.ReconnectWait(10*time.Millisecond))
	a := join(t, anc, "a", Config{Heartbeat: time.Second, TTL: 10 * time.Second})
	natstest.Eventually(t, 5*time.Second, func() bool { return w.Alive(a.Self().Node) }, "a joined")
	before, _ := anc.GetClientID()
	if err := anc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { _, ok := rec.find(Moved, a.Self().Node); return ok }, "moved event")
	after, _ := anc.GetClientID()
	if after == before {
		t.Fatal("the connection did not move")
	}
	if !w.Alive(a.Self().Node) {
		t.Fatal("a moved connection departed the member")
	}
	w.mu.RLock()
	cid := w.live["a"].ClientID
	w.mu.RUnlock()
	if cid != after {
		t.Errorf("the view records client %d, want the new connection's %d", cid, after)
	}
}

// TestBlindWatcherExpiresNobody: a node whose registry watcher is cut off
// (its consumer lived on a NATS server that died: nats.go notices only
// after two missed idle heartbeats, 10–20 s) while its own heartbeats
// succeed does not see the others' heartbeats; it must not count that as
// their silence. Nobody is expired, nobody's registration is lost.
func TestBlindWatcherExpiresNobody(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	a := join(t, natstest.Connect(t, s), "a", Config{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.Stream(ctx, "KV_"+BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range st.ConsumerNames(ctx).Name() {
		names = append(names, n)
	}
	if len(names) != 1 {
		t.Fatalf("consumers of the registry: %v, want a's watcher only", names)
	}
	b := join(t, natstest.Connect(t, s), "b", Config{})
	natstest.Eventually(t, 5*time.Second, func() bool { return a.Alive(b.Self().Node) }, "a sees b")
	var rec recorder
	a.OnEvent(rec.add)
	if err := st.DeleteConsumer(ctx, names[0]); err != nil {
		t.Fatal(err)
	}
	// Many TTLs (400 ms) of a's own heartbeats succeeding, blind.
	beat := a.Self().Beat
	natstest.Eventually(t, 10*time.Second, func() bool { return a.Self().Beat >= beat+25 }, "a heartbeats")
	if e, ok := rec.find(Expired, b.Self().Node); ok {
		t.Fatalf("a, whose watcher was cut off, expired b: %+v", e)
	}
	if b.IsLost() || a.IsLost() {
		t.Fatalf("a registration was lost (a %v, b %v)", a.IsLost(), b.IsLost())
	}
	// The blind watcher is restarted: a follows b's heartbeats again.
	seenBeat := func() uint64 {
		a.mu.RLock()
		defer a.mu.RUnlock()
		if v, ok := a.live["b"]; ok {
			return v.Beat
		}
		return 0
	}
	bb := b.Self().Beat
	natstest.Eventually(t, 10*time.Second, func() bool { return seenBeat() >= bb }, "a sees b's heartbeats again")
	if a.Stats().WatcherRestarts == 0 {
		t.Error("the blind watcher was not restarted")
	}
}

// TestSameNameStaleReadsNotLive: a generation that stopped beating holds
// its name for no more than a TTL even when the registry's replicas answer
// the name's reads differently — one behind the other, so that reads step
// between its last two beats (the 30-minute soak, round 3: a node
// restarted after a drain whose leave failed was refused its own name as
// "live"). Only a beat rising past the highest seen, twice, is live.
func TestSameNameStaleReadsNotLive(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: time.Second}
	old := join(t, natstest.Connect(t, s), "stale", cfg)
	natstest.Eventually(t, 5*time.Second, func() bool { return old.Self().Beat >= 2 }, "a few beats")
	old.Close() // no leave: its entry stays, its last beat recent
	var calls int
	cfg.Conn, cfg.Name, cfg.Kinds = natstest.Connect(t, s), "stale", []string{"echo"}
	cfg.nameRead = func(ctx context.Context, name string) (Member, uint64, error) {
		v, rev, err := old.readEntry(ctx, name)
		calls++
		if err == nil && rev > 1 && calls%2 == 1 {
			v.Beat-- // a replica one beat behind
			rev--
		}
		return v, rev, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, cfg)
	if err != nil {
		t.Fatalf("Join after the name's generation stopped, its reads from replicas a beat apart: %v", err)
	}
	t.Cleanup(m.Close)
}

// TestRejoinFirstReadOfAnOlderGeneration (the 30-minute soak's third stop,
// round 3): a process whose generation was declared gone rejoins, and its
// first read of the name, served by a replica that lags, shows the name's
// generation before its own lost one, still beating. That generation was
// superseded by the lost one's registration, so it is not a live process
// that took the name: the rejoin goes on. Before, the rejoin watched it,
// then read its own lost generation as "registered meanwhile" and stood
// down (ErrNameInUse).
func TestRejoinFirstReadOfAnOlderGeneration(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: time.Second}
	older := join(t, natstest.Connect(t, s), "rj", cfg)
	natstest.Eventually(t, 5*time.Second, func() bool { return older.Self().Beat >= 2 }, "a few beats")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	olderEntry, olderRev, err := older.readEntry(ctx, "rj")
	if err != nil || olderRev == 0 {
		t.Fatalf("read the older generation's entry: rev %d, %v", olderRev, err)
	}
	older.Close() // no leave
	lcfg := cfg
	lcfg.Replace = true
	lost := join(t, natstest.Connect(t, s), "rj", lcfg)
	natstest.Eventually(t, 5*time.Second, func() bool { return lost.Self().Beat >= 2 }, "a few beats")
	lost.Close() // declared gone, say: no leave
	var calls atomic.Int32
	rcfg := cfg
	rcfg.Conn, rcfg.Name, rcfg.Kinds, rcfg.Rejoin = natstest.Connect(t, s), "rj", []string{"echo"}, lost.Self().Node
	rcfg.nameRead = func(ctx context.Context, name string) (Member, uint64, error) {
		if calls.Add(1) == 1 {
			v := olderEntry // a replica that lags: the older generation, beating
			v.BeatAt = time.Now().UTC()
			return v, olderRev, nil
		}
		return lost.readEntry(ctx, name)
	}
	m, err := Join(ctx, rcfg)
	if err != nil {
		t.Fatalf("rejoin after a first read of an older generation: %v", err)
	}
	t.Cleanup(m.Close)
	if g := m.Self().Node.Generation; g <= lost.Self().Node.Generation {
		t.Fatalf("rejoined as %v, not above the lost generation %v", m.Self().Node, lost.Self().Node)
	}
}

// watchedEntry is a registry entry as a watch delivers it (for
// TestWatchReplayBeforeRegistration).
type watchedEntry struct {
	jetstream.KeyValueEntry
	key   string
	value []byte
	rev   uint64
	op    jetstream.KeyValueOp
}

func (e watchedEntry) Key() string                     { return e.key }
func (e watchedEntry) Value() []byte                   { return e.value }
func (e watchedEntry) Revision() uint64                { return e.rev }
func (e watchedEntry) Operation() jetstream.KeyValueOp { return e.op }
func (e watchedEntry) Created() time.Time              { return time.Now() }

// TestWatchReplayBeforeRegistration (the 30-minute soak's third stop, round
// 3): a registry watch served by a replica that lags replays the name's
// older generation — or its removal mark, or its deletion — from before
// this generation registered. That is history, not the loss of this
// registration: the node keeps serving. What does end it, in both
// directions: a newer generation of the name, and a deletion or removal mark
// written after this generation registered. Before, the replay made a node
// that had just joined drop its activations and rejoin.
func TestWatchReplayBeforeRegistration(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: 5 * time.Second}
	name := "wr"
	older := join(t, natstest.Connect(t, s), name, cfg)
	older.Close() // no leave
	rcfg := cfg
	rcfg.Replace = true
	self := func(m *Membership) Member { return m.Self() }
	member := func(v Member, removed bool) []byte {
		if removed {
			v.Removed = &Removal{How: Expired.String(), At: time.Now().UTC()}
		}
		b, _ := json.Marshal(v)
		return b
	}
	lostAfter := func(m *Membership, e watchedEntry) bool {
		m.apply(e)
		select {
		case <-m.lost:
			return true
		default:
			return false
		}
	}
	// replay: the watch delivers the entry before this generation's own
	// (a replica that lags, or a watch started afresh on one): the node's
	// view holds no entry of its name yet.
	for _, tc := range []struct {
		name   string
		replay bool
		entry  func(m *Membership) watchedEntry
		lost   bool
	}{
		{"older generation, earlier revision", true, func(m *Membership) watchedEntry {
			return watchedEntry{key: name, value: member(self(older), false), rev: m.joinRev.Load() - 1, op: jetstream.KeyValuePut}
		}, false},
		{"older generation's removal mark, earlier revision", true, func(m *Membership) watchedEntry {
			return watchedEntry{key: name, value: member(self(older), true), rev: m.joinRev.Load() - 1, op: jetstream.KeyValuePut}
		}, false},
		{"deletion, earlier revision", true, func(m *Membership) watchedEntry {
			return watchedEntry{key: name, rev: m.joinRev.Load() - 1, op: jetstream.KeyValueDelete}
		}, false},
		{"deletion, earlier revision, own entry seen", false, func(m *Membership) watchedEntry {
			return watchedEntry{key: name, rev: m.joinRev.Load() - 1, op: jetstream.KeyValueDelete}
		}, false},
		{"newer generation", false, func(m *Membership) watchedEntry {
			v := self(m)
			v.Node.Generation++
			return watchedEntry{key: name, value: member(v, false), rev: m.joinRev.Load() + 1000, op: jetstream.KeyValuePut}
		}, true},
		{"newer generation, replayed", true, func(m *Membership) watchedEntry {
			v := self(m)
			v.Node.Generation++
			return watchedEntry{key: name, value: member(v, false), rev: m.joinRev.Load() + 1000, op: jetstream.KeyValuePut}
		}, true},
		{"newer generation, earlier revision", true, func(m *Membership) watchedEntry {
			v := self(m)
			v.Node.Generation++
			return watchedEntry{key: name, value: member(v, false), rev: m.joinRev.Load() - 1, op: jetstream.KeyValuePut}
		}, true},
		{"deletion, later revision", false, func(m *Membership) watchedEntry {
			return watchedEntry{key: name, rev: m.joinRev.Load() + 1000, op: jetstream.KeyValueDelete}
		}, true},
		{"own removal mark, later revision", false, func(m *Membership) watchedEntry {
			return watchedEntry{key: name, value: member(self(m), true), rev: m.joinRev.Load() + 1000, op: jetstream.KeyValuePut}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := join(t, natstest.Connect(t, s), name, rcfg)
			if m.joinRev.Load() < 2 {
				t.Fatalf("registered at revision %d", m.joinRev.Load())
			}
			// No heartbeat reaches the watch meanwhile: the view stays as
			// the replay leaves it.
			m.pauseBeats.Store(true)
			if tc.replay {
				m.mu.Lock()
				delete(m.live, name)
				m.mu.Unlock()
			}
			if got := lostAfter(m, tc.entry(m)); got != tc.lost {
				t.Fatalf("registration lost = %v, want %v", got, tc.lost)
			}
			if tc.lost {
				return
			}
			if !tc.replay && !m.Alive(m.Self().Node) {
				t.Fatalf("%v no longer alive in its own view", m.Self().Node)
			}
			m.mu.RLock()
			v, ok := m.live[name]
			m.mu.RUnlock()
			if ok && v.Node != m.Self().Node {
				t.Fatalf("the view names %v for the name, not %v", v.Node, m.Self().Node)
			}
			// The registry, asked by the heartbeats, still names this
			// generation: it stays registered.
			m.pauseBeats.Store(false)
			beat := m.Self().Beat
			natstest.Eventually(t, 5*time.Second, func() bool { return m.Self().Beat >= beat+2 }, "two more heartbeats")
			select {
			case <-m.lost:
				t.Fatal("registration lost after the heartbeats")
			default:
			}
		})
	}
}

// TestHeartbeatRegistryRevisionsFell: the registry's stream holds the
// node's name at a revision below the node's last write — it was created
// afresh, or lost acknowledged writes (Jepsen's NATS 2.12.1 finding). A
// heartbeat refused there reads back a revision no newer than its own
// write, which is also what a replica that lags shows; the leader tells
// them apart, and the node acts on its entry: an older generation's is
// written over, a newer generation's ends the registration. Before, every
// beat counted the read as a lagging replica's, for good: the lease lapsed
// and the node neither served nor rejoined.
func TestHeartbeatRegistryRevisionsFell(t *testing.T) {
	t.Parallel()
	for _, newer := range []bool{false, true} {
		t.Run(fmt.Sprintf("newer=%v", newer), func(t *testing.T) {
			s := natstest.RunServer(t)
			nc := natstest.Connect(t, s)
			cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: 5 * time.Second}
			older := join(t, natstest.Connect(t, s), "rf", cfg)
			olderSelf := older.Self()
			older.Close()
			rcfg := cfg
			rcfg.Replace = true
			m := join(t, natstest.Connect(t, s), "rf", rcfg)
			natstest.Eventually(t, 5*time.Second, func() bool { return m.revision() > 5 }, "a few heartbeats")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			if err := js.DeleteKeyValue(ctx, BucketName(subjects.DefaultPrefix)); err != nil {
				t.Fatal(err)
			}
			kv, err := OpenBucket(ctx, js, subjects.DefaultPrefix, cfg.TTL, 1, "")
			if err != nil {
				t.Fatal(err)
			}
			v := olderSelf
			if newer {
				v = m.Self()
				v.Node.Generation++
			}
			b, _ := json.Marshal(v)
			if _, err := kv.Create(ctx, "rf", b); err != nil {
				t.Fatal(err)
			}
			natstest.Eventually(t, 10*time.Second, func() bool {
				select {
				case <-m.lost:
					return true
				default:
				}
				cur, _, err := m.readEntry(ctx, "rf")
				return err == nil && cur.Node == m.Self().Node
			}, "the node acts on the registry's entry")
			select {
			case <-m.lost:
				if !newer {
					t.Fatal("registration lost, although the registry held an older generation of the name")
				}
			default:
				if newer {
					t.Fatal("the node wrote over a newer generation of its name")
				}
			}
		})
	}
}

// TestStaleReplayDoesNotMakeADepartureDurable: a departure judged here
// becomes a fact of the registry — and its generation's addresses may be
// taken over after the fencing delay — when the registry's entry for the
// name is deleted, or names a newer generation, in a write after the last
// one this node saw of the departed generation's entry. A re-watch served
// by a replica that lags replays older history: a deletion of the name,
// or an older write, from before the departed generation's entry. Before,
// a replayed deletion (with no live entry of the name left here) made
// every pending departure of the name durable, so TakeoverAt let the
// addresses of a generation that could still renew its lease be taken
// over.
func TestStaleReplayDoesNotMakeADepartureDurable(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: 5 * time.Second}
	m := join(t, natstest.Connect(t, s), "observer", cfg)
	durable := func(n subjects.NodeID) bool {
		m.mu.RLock()
		defer m.mu.RUnlock()
		_, ok := m.durable[n]
		return ok
	}
	for i, tc := range []struct {
		name    string
		entry   func(node subjects.NodeID, rev uint64) watchedEntry
		durable bool
	}{
		{"deletion replayed from before its entry", func(node subjects.NodeID, rev uint64) watchedEntry {
			return watchedEntry{key: node.Name, rev: rev - 1, op: jetstream.KeyValueDelete}
		}, false},
		{"purge replayed from before its entry", func(node subjects.NodeID, rev uint64) watchedEntry {
			return watchedEntry{key: node.Name, rev: rev - 1, op: jetstream.KeyValuePurge}
		}, false},
		{"newer generation's entry at an earlier revision", func(node subjects.NodeID, rev uint64) watchedEntry {
			return watchedEntry{key: node.Name, value: newerValue(node), rev: rev - 1, op: jetstream.KeyValuePut}
		}, false},
		// After: well past any write of it still in flight when it
		// closed, which the watch would record as its last entry.
		{"deletion after its entry", func(node subjects.NodeID, rev uint64) watchedEntry {
			return watchedEntry{key: node.Name, rev: rev + 50, op: jetstream.KeyValueDelete}
		}, true},
		{"newer generation's entry after its entry", func(node subjects.NodeID, rev uint64) watchedEntry {
			return watchedEntry{key: node.Name, value: newerValue(node), rev: rev + 50, op: jetstream.KeyValuePut}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, rev := departedHere(t, s, m, fmt.Sprintf("sr%d", i), cfg)
			m.apply(tc.entry(node, rev))
			if got := durable(node); got != tc.durable {
				t.Fatalf("durable after the entry: %v, want %v (the entry's revision %v, the departed entry's %d)", got, tc.durable, tc.entry(node, rev).rev, rev)
			}
		})
	}
}

// A generation judged gone here whose heartbeat still landed afterwards
// (it was alive: a freeze past the TTL, a link cut while its heartbeats
// got through another way) renewed its lease: a deletion of its entry, or
// a newer generation's, after that heartbeat makes the departure durable
// only a TTL later — not at once, which let its addresses be taken over
// while it could still serve under the lease it renewed. A deletion
// replayed from between the judged entry and the late heartbeat proves
// nothing at all.
func TestLateHeartbeatDelaysADurableDeparture(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: 5 * time.Second}
	m := join(t, natstest.Connect(t, s), "observer", cfg)
	durableAt := func(n subjects.NodeID) (time.Time, bool) {
		m.mu.RLock()
		defer m.mu.RUnlock()
		at, ok := m.durable[n]
		return at, ok
	}
	for i, tc := range []struct {
		name    string
		after   func(node subjects.NodeID, lateRev uint64) watchedEntry
		durable bool
	}{
		{"deletion after the late heartbeat", func(node subjects.NodeID, lateRev uint64) watchedEntry {
			return watchedEntry{key: node.Name, rev: lateRev + 1, op: jetstream.KeyValueDelete}
		}, true},
		{"newer generation after the late heartbeat", func(node subjects.NodeID, lateRev uint64) watchedEntry {
			return watchedEntry{key: node.Name, value: newerValue(node), rev: lateRev + 1, op: jetstream.KeyValuePut}
		}, true},
		{"deletion replayed from before the late heartbeat", func(node subjects.NodeID, lateRev uint64) watchedEntry {
			return watchedEntry{key: node.Name, rev: lateRev - 1, op: jetstream.KeyValueDelete}
		}, false},
		{"newer generation replayed from before the late heartbeat", func(node subjects.NodeID, lateRev uint64) watchedEntry {
			return watchedEntry{key: node.Name, value: newerValue(node), rev: lateRev - 1, op: jetstream.KeyValuePut}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("lh%d", i)
			node, rev := departedHere(t, s, m, name, cfg)
			// Its heartbeat lands after the judgment, well past any
			// write of it still in flight when it closed (room for a
			// replay between).
			lateRev := rev + 50
			m.apply(watchedEntry{key: name, value: beatValue(node), rev: lateRev, op: jetstream.KeyValuePut})
			if m.Alive(node) {
				t.Fatalf("%s alive again after a late heartbeat", node)
			}
			before := time.Now()
			m.apply(tc.after(node, lateRev))
			at, ok := durableAt(node)
			if ok != tc.durable {
				t.Fatalf("durable: %v, want %v", ok, tc.durable)
			}
			if !ok {
				if time.Until(m.TakeoverAt(node)) <= 0 {
					t.Fatalf("takeover at once, the departure not durable")
				}
				return
			}
			if at.Before(before.Add(cfg.TTL)) {
				t.Fatalf("durable at %v, %v after the entry went: the lease renewed after the judgment lasts up to the TTL (%v)", at.Format(time.RFC3339Nano), at.Sub(before), cfg.TTL)
			}
			if tk := m.TakeoverAt(node); tk.Before(before.Add(cfg.TTL)) {
				t.Fatalf("takeover at %v, before the renewed lease could have run out", tk.Sub(before))
			}
		})
	}
}

// A departure judged here whose mark could not be written, and whose
// generation's heartbeat then landed (seen by the watch): when the retried
// mark is written, the departure is durable no earlier than a TTL on —
// whatever the retried mark found (the entry, a newer generation, none),
// the late heartbeat renewed the lease. And a re-watch replaying the mark
// does not push the takeover back again.
func TestRetriedMarkWaitsOutALateHeartbeat(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: 5 * time.Second}
	m := join(t, natstest.Connect(t, s), "observer", cfg)
	x := join(t, natstest.Connect(t, s), "rm", cfg)
	node := x.Self().Node
	natstest.Eventually(t, 10*time.Second, func() bool { return m.Alive(node) }, "%s not seen alive", node)
	x.Close()
	m.failMarks.Store(true)
	m.judge(node, Expired, time.Time{}, "judged by the test")
	m.mu.RLock()
	_, pending := m.pending[node]
	_, durable := m.durable[node]
	rev := m.lastRev[node]
	m.mu.RUnlock()
	if !pending || durable {
		t.Fatalf("after a refused mark: pending %v, durable %v", pending, durable)
	}
	m.apply(watchedEntry{key: node.Name, value: beatValue(node), rev: rev + 50, op: jetstream.KeyValuePut})
	before := time.Now()
	m.failMarks.Store(false) // the expiry loop retries the mark
	var at time.Time
	natstest.Eventually(t, 10*time.Second, func() bool {
		m.mu.RLock()
		defer m.mu.RUnlock()
		var ok bool
		at, ok = m.durable[node]
		return ok
	}, "the retried mark never made the departure durable")
	if at.Before(before.Add(cfg.TTL)) {
		t.Fatalf("durable %v after the mark was retried: the lease the late heartbeat renewed lasts up to the TTL (%v)", at.Sub(before), cfg.TTL)
	}
	// The mark, replayed by a re-watch a while later, leaves it.
	e, err := m.kv.Get(context.Background(), node.Name)
	if err != nil {
		t.Fatal(err)
	}
	m.apply(watchedEntry{key: node.Name, value: e.Value(), rev: e.Revision(), op: jetstream.KeyValuePut})
	m.mu.RLock()
	again := m.durable[node]
	m.mu.RUnlock()
	if !again.Equal(at) {
		t.Fatalf("a replayed mark moved the departure's durable time by %v", again.Sub(at))
	}
}

// departedHere joins a node of name on s, waits until m sees it, closes it
// without a leave and departs it in m as judged, its mark unwritten (as
// when the registry refused the mark): it returns the generation and the
// revision of its last write m saw.
func departedHere(t *testing.T, s *server.Server, m *Membership, name string, cfg Config) (subjects.NodeID, uint64) {
	t.Helper()
	x := join(t, natstest.Connect(t, s), name, cfg)
	node := x.Self().Node
	natstest.Eventually(t, 10*time.Second, func() bool { return m.Alive(node) }, "%s not seen alive", node)
	x.Close()
	m.mu.RLock()
	rev := m.live[name].rev
	m.mu.RUnlock()
	if !m.depart(node, Expired, time.Time{}, "judged by the test") {
		t.Fatalf("%s not departed", node)
	}
	m.mu.RLock()
	_, durable := m.durable[node]
	m.mu.RUnlock()
	if durable {
		t.Fatalf("%s durable before any registry write", node)
	}
	if at := m.TakeoverAt(node); time.Until(at) <= 0 {
		t.Fatalf("%s: takeover at once, with its departure not durable", node)
	}
	return node, rev
}

// beatValue is a registry entry of node heartbeating now, as its JSON value.
func beatValue(node subjects.NodeID) []byte {
	b, _ := json.Marshal(Member{Node: node, Kinds: []string{"echo"}, BeatAt: time.Now().UTC(), Started: time.Now().UTC()})
	return b
}

// newerValue is beatValue of the generation after node's.
func newerValue(node subjects.NodeID) []byte {
	return beatValue(subjects.NodeID{Name: node.Name, Generation: node.Generation + 1})
}
