package mesh

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestBreakPooledLaneKeepsAnotherPrefix: lanes are pooled process-wide
// (lanePool) and a pooled lane keeps the delivery subject of its last leg
// (lane.subj, deliverySubject), keyed by address, stream and node — not by
// the client's prefix. Two clients of two meshes in one process (DESIGN
// §2: "configurable so several meshes can share one NATS account") that
// address the same node ID and address: the second client's leg can be
// published on the FIRST mesh's delivery subject.
func TestPooledLaneKeepsItsOwnPrefix(t *testing.T) {
	s := natstest.RunServer(t)
	node := subjects.NodeID{Name: "n", Generation: 1}
	p1, p2 := subjects.Prefix("one.v1"), subjects.Prefix("two.v1")
	spy := natstest.Connect(t, s)
	var wrong, right atomic.Int64
	answer := func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		verdict.Encode(r.Header, nil, node.String())
		_ = spy.PublishMsg(r)
	}
	if _, err := spy.Subscribe(p1.Sub("dlv.>"), func(m *nats.Msg) {
		if id := m.Header.Get(hub.HeaderID); len(id) > 2 && id[:2] == "c2" {
			wrong.Add(1)
		}
		answer(m)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := spy.Subscribe(p2.Sub("dlv.>"), func(m *nats.Msg) { right.Add(1); answer(m) }); err != nil {
		t.Fatal(err)
	}
	_ = spy.Flush()
	c1, err := NewClient(Config{Conn: natstest.Connect(t, s), Resolver: StaticResolver{Node: node}, Prefix: p1, Identity: subjects.NodeID{Name: "s1", Generation: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c1.Close)
	c2, err := NewClient(Config{Conn: natstest.Connect(t, s), Resolver: StaticResolver{Node: node}, Prefix: p2, Identity: subjects.NodeID{Name: "s2", Generation: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c2.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 200 {
		if _, err := c1.Deliver(ctx, Delivery{ID: fmt.Sprintf("c1-%d", i), To: "k/a"}); err != nil {
			t.Fatal(err)
		}
		_, _ = c2.Deliver(ctx, Delivery{ID: fmt.Sprintf("c2-%d", i), To: "k/a"})
		if wrong.Load() > 0 {
			break
		}
	}
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d leg(s) of the client of mesh %q published on mesh %q's delivery subject (%d on its own)", n, p2, p1, right.Load())
	}
}
