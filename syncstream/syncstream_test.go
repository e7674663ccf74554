package syncstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

var quiet = slog.New(slog.DiscardHandler)

var fast = mesh.MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 400 * time.Millisecond, VerifyInterval: 100 * time.Millisecond}

// startNode starts a node with membership; kv says whether it hosts the kv
// hub. It returns the node and its connection.
func startNode(t testing.TB, s *server.Server, name string, kv bool) (*mesh.Node, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	mc := fast
	n, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: name, Membership: &mc, Logger: quiet, DisableControl: true}, mesh.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if kv {
		_ = n.Register(hubs.KVKind, hubs.NewKV(n.Client, quiet))
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, nc
}

// mirror records the frames a subscription applies and checks they only
// move forward.
type mirror struct {
	t      testing.TB
	mu     sync.Mutex
	frames []syncstream.Frame
	state  map[string]string
}

func (m *mirror) apply(f syncstream.Frame) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.frames); n > 0 {
		last := m.frames[n-1]
		if f.Epoch == last.Epoch && f.Version <= last.Version && !f.Snapshot {
			m.t.Errorf("frame (%d, %d) applied after (%d, %d)", f.Epoch, f.Version, last.Epoch, last.Version)
		}
	}
	m.frames = append(m.frames, f)
	if f.Snapshot {
		m.state = map[string]string{}
		_ = json.Unmarshal(f.Data, &m.state)
		return
	}
	var c hubs.KVChange
	_ = json.Unmarshal(f.Data, &c)
	if c.Deleted {
		delete(m.state, c.Key)
	} else {
		m.state[c.Key] = c.Value
	}
}

func (m *mirror) get(k string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.state[k]
	return v, ok
}

func (m *mirror) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.frames)
}

func set(t testing.TB, n *mesh.Node, addr subjects.Address, kv string) {
	t.Helper()
	if _, err := n.Request(context.Background(), mesh.Delivery{To: addr, Type: hubs.KVSet, Payload: []byte(kv)}); err != nil {
		t.Fatalf("set %s on %s: %v", kv, addr, err)
	}
}

func TestSnapshotThenDeltas(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", true)
	sub, _ := startNode(t, s, "sub", false)
	set(t, owner, "kv/x", "a=1")
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, "kv/x", "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	set(t, owner, "kv/x", "b=2")
	set(t, sub, "kv/x", "c=3") // from any node
	natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get("c"); return v == "3" }, "deltas applied")
	if v, _ := m.get("a"); v != "1" {
		t.Errorf("snapshot not applied: %v", m.state)
	}
	if _, v := ss.Position(); v != 3 { // a=1 was version 1, before the subscribe
		t.Errorf("version %d, want 3", v)
	}
	if !m.frames[0].Snapshot {
		t.Errorf("first frame is not the snapshot")
	}
	ss.Stop()
	ss.Stop() // twice is harmless
	<-ss.Closed()
	if ss.Err() != nil {
		t.Errorf("Err after Stop = %v", ss.Err())
	}
}

// capture records every frame delivery that reaches a node's delivery
// subject, as it crossed the wire.
func capture(t testing.TB, s *server.Server, node subjects.NodeID) func() []*nats.Msg {
	nc := natstest.Connect(t, s)
	var mu sync.Mutex
	var msgs []*nats.Msg
	if _, err := nc.Subscribe(subjects.DefaultPrefix.NodeSubscription(node), func(m *nats.Msg) {
		if t := m.Header.Get("Mesh-Type"); t == syncstream.TypeFrame || t == syncstream.TypeFrames {
			mu.Lock()
			msgs = append(msgs, m)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	return func() []*nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		return append([]*nats.Msg(nil), msgs...)
	}
}

// framesOf decodes the frames a captured delivery carries.
func framesOf(t testing.TB, m *nats.Msg) []syncstream.Frame {
	t.Helper()
	if m.Header.Get("Mesh-Type") == syncstream.TypeFrame {
		var f syncstream.Frame
		if err := json.Unmarshal(m.Data, &f); err != nil {
			t.Fatalf("captured frame: %v", err)
		}
		return []syncstream.Frame{f}
	}
	fs, err := syncstream.DecodeFrames(m.Data)
	if err != nil {
		t.Fatalf("captured frames: %v", err)
	}
	return fs
}

// countFrames counts the frames of msgs that match keep.
func countFrames(t testing.TB, msgs []*nats.Msg, keep func(syncstream.Frame) bool) int {
	n := 0
	for _, m := range msgs {
		for _, f := range framesOf(t, m) {
			if keep(f) {
				n++
			}
		}
	}
	return n
}

func all(syncstream.Frame) bool { return true }

// replay re-sends captured frames to their subject under fresh delivery IDs
// (so dedupe does not hide them), in the given order.
func replay(t testing.TB, nc *nats.Conn, frames []*nats.Msg) {
	t.Helper()
	for i, f := range frames {
		m := nats.NewMsg(f.Subject)
		m.Header.Set("Mesh-Id", fmt.Sprintf("replay-%d-%d", i, rand.Int()))
		m.Header.Set("Mesh-Type", f.Header.Get("Mesh-Type"))
		m.Data = f.Data
		r, err := nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := verdict.Decode(r.Header); err != nil {
			t.Fatalf("replayed frame refused: %v", err)
		}
	}
}

// TestReorderedAndDuplicatedFrames: frames reordered and duplicated on the
// wire (replayed at the transport, interleaved with live ones) are never
// applied out of order.
func TestReorderedAndDuplicatedFrames(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", true)
	sub, _ := startNode(t, s, "sub", false)
	frames := capture(t, s, sub.ID())
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, "kv/r", "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	for i := 0; i < 20; i++ {
		set(t, owner, "kv/r", fmt.Sprintf("k%d=%d", i, i))
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return m.count() == 21 }, "21 frames applied")
	natstest.Eventually(t, 5*time.Second, func() bool { return countFrames(t, frames(), all) == 21 }, "21 frames captured")
	wire := frames()
	shuffled := append(append([]*nats.Msg(nil), wire...), wire...) // every frame twice
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	raw := natstest.Connect(t, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		replay(t, raw, shuffled)
	}()
	for i := 20; i < 30; i++ { // live frames meanwhile
		set(t, owner, "kv/r", fmt.Sprintf("k%d=%d", i, i))
	}
	<-done
	natstest.Eventually(t, 5*time.Second, func() bool {
		applied, stale, _ := ss.Stats()
		return applied+stale >= 31+42
	}, "every frame handled")
	applied, stale, _ := ss.Stats()
	t.Logf("applied %d, dropped as stale %d (replayed 42 frames in %d deliveries)", applied, stale, len(shuffled))
	if applied != 31 || stale != 42 {
		t.Errorf("applied %d stale %d; want 31 and 42", applied, stale)
	}
	if v, _ := m.get("k29"); v != "29" {
		t.Errorf("mirror %v", m.state)
	}
}

// kvOwnerOf returns the node among nodes that placement picks for addr.
func kvOwnerOf(addr subjects.Address, nodes ...*mesh.Node) *mesh.Node {
	var ids []subjects.NodeID
	for _, n := range nodes {
		ids = append(ids, n.ID())
	}
	id, _ := directory.Place(addr, ids)
	for _, n := range nodes {
		if n.ID() == id {
			return n
		}
	}
	return nil
}

// TestOwnerKilledResubscribes: the owner's node dies; the subscriber
// resubscribes to the new activation on another node and converges on its
// (greater) epoch with no action from the application, its snapshot holding
// the stored map; late frames of the old epoch are dropped.
func TestOwnerKilledResubscribes(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	a, aConn := startNode(t, s, "a", true)
	b, _ := startNode(t, s, "b", true)
	sub, _ := startNode(t, s, "sub", false)
	natstest.Eventually(t, 5*time.Second, func() bool { return len(sub.Members().Hosting(hubs.KVKind)) == 2 }, "both owners visible")
	// An address that lives on a.
	var addr subjects.Address
	for i := 0; ; i++ {
		addr = subjects.Address(fmt.Sprintf("kv/k%d", i))
		if kvOwnerOf(addr, a, b) == a {
			break
		}
	}
	frames := capture(t, s, sub.ID())
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, addr, "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	set(t, sub, addr, "x=1")
	natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get("x"); return v == "1" }, "first epoch")
	oldEpoch, _ := ss.Position()
	killed := time.Now()
	aConn.Close()
	a.Close()
	natstest.Eventually(t, 10*time.Second, func() bool { e, _ := ss.Position(); return e != oldEpoch }, "converged on a new epoch")
	t.Logf("subscriber converged on the new activation %v after the owner's node died (TTL %v)", time.Since(killed), fast.TTL)
	set(t, sub, addr, "y=2")
	natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get("y"); return v == "2" }, "new epoch's deltas")
	// The kv hub's map is durable state (DESIGN §7a): the new
	// activation's snapshot carried it, at a greater epoch.
	if v, _ := m.get("x"); v != "1" {
		t.Errorf("the move lost the stored state: %v", m.state)
	}
	if e, _ := ss.Position(); e <= oldEpoch {
		t.Errorf("epoch went from %d to %d", oldEpoch, e)
	}
	_, _, resubs := ss.Stats()
	if resubs == 0 {
		t.Error("no resubscribe counted")
	}
	// Late frames of the old epoch arrive: dropped.
	var old []*nats.Msg
	for _, f := range frames() {
		var fr syncstream.Frame
		if json.Unmarshal(f.Data, &fr) == nil && fr.Epoch == oldEpoch {
			old = append(old, f)
		}
	}
	before, _, _ := ss.Stats()
	replay(t, natstest.Connect(t, s), old)
	if after, _, _ := ss.Stats(); after != before {
		t.Errorf("%d old-epoch frames applied", after-before)
	}
	if v, _ := m.get("y"); v != "2" {
		t.Errorf("mirror moved back: %v", m.state)
	}
}

// TestFailedTearsDownOnce: a subscribe attempt answered Failed tears the
// subscription down exactly once, with the error.
func TestFailedTearsDownOnce(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	var refuse atomic.Bool
	var ownerSide atomic.Pointer[syncstream.Owner]
	_ = owner.Register("flaky", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		o := syncstream.NewOwner(owner.Client, addr, func(subjects.Stream) []byte { return nil }, quiet)
		ownerSide.Store(o)
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			if d.Type == syncstream.TypeSubscribe && refuse.Load() {
				return errors.New("no more subscribers")
			}
			_, err := o.Handle(d)
			return err
		}), nil
	})
	sub, _ := startNode(t, s, "sub", false)
	var frames atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss, err := syncstream.Subscribe(ctx, sub, "flaky/x", "", func(syncstream.Frame) { frames.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return frames.Load() == 1 }, "snapshot")
	refuse.Store(true)
	ownerSide.Load().Close() // the owner ends the stream: the subscriber comes back, and is refused
	select {
	case <-ss.Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("not torn down")
	}
	if !errors.Is(ss.Err(), verdict.ErrHandler) || verdict.Classify(ss.Err()) != verdict.Failed {
		t.Errorf("Err = %v", ss.Err())
	}
	ss.Stop() // after teardown: harmless
	if _, _, resubs := ss.Stats(); resubs != 1 {
		t.Errorf("resubscribes %d, want 1 (no retry after Failed)", resubs)
	}
	// A subscribe whose first attempt fails terminally returns the error.
	if _, err := syncstream.Subscribe(context.Background(), sub, "flaky/x", "", func(syncstream.Frame) {}); !errors.Is(err, verdict.ErrHandler) {
		t.Errorf("Subscribe = %v", err)
	}
}

// TestOwnerRestartedNewGeneration: the owner's node is restarted under the
// same name with a new generation: the subscriber converges on the new
// epoch, and late frames of the old epoch are dropped.
func TestOwnerRestartedNewGeneration(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	a, aConn := startNode(t, s, "a", true)
	sub, _ := startNode(t, s, "sub", false)
	natstest.Eventually(t, 5*time.Second, func() bool { return len(sub.Members().Hosting(hubs.KVKind)) == 1 }, "owner visible")
	frames := capture(t, s, sub.ID())
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, "kv/g", "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	set(t, sub, "kv/g", "old=1")
	natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get("old"); return v == "1" }, "old epoch")
	oldEpoch, _ := ss.Position()
	oldGen := a.ID()
	aConn.Close()
	a.Close()
	a2, _ := startNode(t, s, "a", true)
	if a2.ID().Generation <= oldGen.Generation {
		t.Fatalf("restart generation %v not above %v", a2.ID(), oldGen)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { e, _ := ss.Position(); return e != oldEpoch }, "converged on the new epoch")
	set(t, sub, "kv/g", "new=2")
	natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get("new"); return v == "2" }, "new epoch's deltas")
	var old []*nats.Msg
	natstest.Eventually(t, 5*time.Second, func() bool {
		old = old[:0]
		for _, f := range frames() {
			if countFrames(t, []*nats.Msg{f}, func(fr syncstream.Frame) bool { return fr.Epoch == oldEpoch }) > 0 {
				old = append(old, f)
			}
		}
		return countFrames(t, old, func(fr syncstream.Frame) bool { return !fr.Closed }) == 2 // snapshot and one delta
	}, "old-epoch frames captured")
	before, stale0, _ := ss.Stats()
	replay(t, natstest.Connect(t, s), old)
	natstest.Eventually(t, 5*time.Second, func() bool { _, st, _ := ss.Stats(); return st == stale0+2 }, "old frames dropped")
	if after, _, _ := ss.Stats(); after != before {
		t.Errorf("old-epoch frames applied")
	}
	if v, _ := m.get("old"); v != "1" {
		t.Errorf("the restart lost the stored state: %v", m.state)
	}
}
