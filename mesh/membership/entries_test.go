package membership

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

func registry(t *testing.T, m *Membership) jetstream.KeyValue {
	t.Helper()
	return m.kv
}

func put(t *testing.T, kv jetstream.KeyValue, key string, v any) {
	t.Helper()
	var b []byte
	switch v := v.(type) {
	case []byte:
		b = v
	default:
		b, _ = json.Marshal(v)
	}
	if _, err := kv.Put(context.Background(), key, b); err != nil {
		t.Fatal(err)
	}
}

// ownEntry reports whether the registry holds m's own generation under its
// name.
func ownEntry(m *Membership) bool {
	e, err := m.kv.Get(context.Background(), m.cfg.Name)
	if err != nil {
		return false
	}
	var v Member
	return json.Unmarshal(e.Value(), &v) == nil && v.Node == m.Self().Node
}

// Entries that fail to parse, name another key, or hold an absurd
// generation are ignored and counted; written over this node's own entry
// they are reported (log and Stats().Overwritten) and replaced by the
// node's entry — the node is neither fenced nor superseded.
func TestRegistryForeignEntries(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	a := join(t, natstest.Connect(t, s), "a", Config{})
	w := join(t, natstest.Connect(t, s), "w", Config{})
	kv := registry(t, a)
	self := a.Self().Node

	for i, v := range []any{
		[]byte("not json"),
		Member{Node: subjects.NodeID{Name: "somebody-else", Generation: self.Generation + 1}},
		Member{Node: subjects.NodeID{Name: "a", Generation: math.MaxUint64}},
		Member{Node: subjects.NodeID{Name: "a", Generation: self.Generation - 1}},
		[]byte(`{"node":{"name":"a","generation":-1}}`),
	} {
		before := a.Stats().Overwritten
		put(t, kv, "zzz", v) // not a member's key
		put(t, kv, "a", v)
		natstest.Eventually(t, 10*time.Second, func() bool { return a.Stats().Overwritten > before && ownEntry(a) },
			"entry %d over a's own: not reported and replaced", i)
		select {
		case <-a.Lost():
			t.Fatalf("entry %d fenced the node", i)
		default:
		}
		if a.Superseded() || !w.Alive(self) {
			t.Fatalf("entry %d: superseded %v, alive at w %v", i, a.Superseded(), w.Alive(self))
		}
	}
	if n := w.Stats().InvalidEntries; n < 4 {
		t.Fatalf("w counted %d invalid entries, want at least 4", n)
	}
	natstest.Eventually(t, 5*time.Second, a.Confirmed, "a not confirmed")
}

// A generation read from the registry is validated: the next start of a
// name whose entry holds 2^64-1 (or any generation far beyond the clock)
// is refused with a clear error instead of wrapping to generation 0.
func TestRegisterRefusesAbsurdGeneration(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	w := join(t, natstest.Connect(t, s), "w", Config{})
	kv := registry(t, w)
	for _, g := range []uint64{math.MaxUint64, math.MaxUint64 - 1, uint64(time.Now().Add(10 * 365 * 24 * time.Hour).UnixNano())} {
		put(t, kv, "x", Member{Node: subjects.NodeID{Name: "x", Generation: g}, BeatAt: time.Now().Add(-time.Hour)})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := Join(ctx, Config{Conn: natstest.Connect(t, s), Name: "x", Kinds: []string{"echo"}, Heartbeat: 100 * time.Millisecond, TTL: 400 * time.Millisecond})
		cancel()
		if err == nil {
			gen := m.Self().Node.Generation
			m.Close()
			t.Fatalf("generation %d in the registry: joined with generation %d", g, gen)
		}
		if !errors.Is(err, ErrInvalidGeneration) {
			t.Fatalf("generation %d: %v, want ErrInvalidGeneration", g, err)
		}
	}
}

// A heartbeat refused for a revision mismatch whose read-back shows no
// newer revision than the write's — a direct get answered by a replica
// that lags, as after a server restart — waits for the next beat instead
// of re-adopting the stale revision and beating again at once: found by
// the 30-minute soak, where every node and the sender spun thousands of
// refused writes a second against the registry stream while it elected a
// leader ("own registry entry overwritten by another writer", revision
// 1825, 8 329 times). The entry is not reported overwritten, the node is
// not fenced, and it recovers once the reads catch up.
func TestHeartbeatStaleReadWaitsForTheNextBeat(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	a := join(t, natstest.Connect(t, s), "a", Config{})
	kv := registry(t, a)
	var refused atomic.Int64 // beats refused and read back
	stale := func(context.Context, string) (Member, uint64, error) {
		refused.Add(1)
		return a.Self(), a.revision(), nil // what the failed write was on: nothing newer
	}
	a.mismatchRead.Store(&stale)
	put(t, kv, "a", a.Self()) // a newer revision: a's next beat is refused
	natstest.Eventually(t, 5*time.Second, func() bool { return refused.Load() > 0 }, "a beat refused and read back")
	before := refused.Load()
	time.Sleep(time.Second) // an observation window: the refused beats in it are counted
	n := refused.Load() - before
	// The heartbeat is 100 ms: about ten beats in the window. Spinning,
	// each refused write was re-read and rewritten at once: thousands.
	if n > 40 || a.Stats().Overwritten != 0 {
		t.Fatalf("in a second: %d refused beats, %d overwrites reported; want about one a heartbeat and none", n, a.Stats().Overwritten)
	}
	if a.Stats().StaleReads == 0 {
		t.Error("no stale read counted")
	}
	a.mismatchRead.Store(nil) // the reads catch up: the next beat adopts the stored revision
	select {
	case <-a.Lost():
		t.Fatal("a stale read fenced the node")
	default:
	}
	natstest.Eventually(t, 5*time.Second, a.Confirmed, "a not confirmed")
}
