package syncstream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
)

// TestKVContinuityAcrossMoves: the kv hub's map is durable state, so each
// new activation of the address (here: its owner deactivates it, five times
// over) answers the subscriber's resubscribe with a snapshot holding every
// key set so far, at an epoch greater than the last; no snapshot after the
// first is empty and the mirror never loses a key.
func TestKVContinuityAcrossMoves(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	a, _ := startNode(t, s, "a", true)
	b, _ := startNode(t, s, "b", true)
	sub, _ := startNode(t, s, "sub", false)
	natstest.Eventually(t, 5*time.Second, func() bool { return len(sub.Members().Hosting(hubs.KVKind)) == 2 }, "both owners visible")
	const addr subjects.Address = "kv/continuity"
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, addr, "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	var lastEpoch uint64
	for round := range 5 {
		key := fmt.Sprintf("k%d", round)
		set(t, sub, addr, key+"=v")
		natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get(key); return v == "v" }, "round %d applied", round)
		e, _ := ss.Position()
		if e <= lastEpoch {
			t.Fatalf("round %d: epoch %d after %d", round, e, lastEpoch)
		}
		lastEpoch = e
		for i := 0; i <= round; i++ {
			if v, _ := m.get(fmt.Sprintf("k%d", i)); v != "v" {
				t.Fatalf("round %d: k%d lost: %v", round, i, m.state)
			}
		}
		kvOwnerOf(addr, a, b).Host().Deactivate(addr)
		natstest.Eventually(t, 10*time.Second, func() bool { e, _ := ss.Position(); return e > lastEpoch }, "round %d: resubscribed to the next activation", round)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	snaps := 0
	for _, f := range m.frames {
		if !f.Snapshot {
			continue
		}
		snaps++
		var got map[string]string
		_ = json.Unmarshal(f.Data, &got)
		if snaps > 1 && len(got) == 0 {
			t.Errorf("snapshot %d (epoch %d, version %d) is empty", snaps, f.Epoch, f.Version)
		}
	}
	if snaps < 6 {
		t.Errorf("%d snapshots, want 6", snaps)
	}
}
