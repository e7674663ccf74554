package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestDrainDeclaredGoneDoesNotRejoin: a node whose generation is declared
// gone while it drains (its drain held open by an ingress forward in
// flight) does not rejoin under a new generation — one that registered
// without draining took placements while the node drained and stayed
// registered after Drain returned (found by a hostile tester: "a's new
// generation is registered NOT draining while a drains"; after Drain "the
// registry still names a"). The forward in flight is still answered, and
// after Drain nothing of the node is registered or alive.
func TestDrainDeclaredGoneDoesNotRejoin(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	longTTL := MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second, VerifyInterval: 100 * time.Millisecond}
	rec := newRecorder()
	block := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(block) }) }
	defer release()
	rec.fn = func(context.Context, *hub.Delivery) error { <-block; return nil }
	mb, ma := longTTL, longTTL
	b := startTestNode(t, NodeConfig{Conn: natstest.Connect(t, s), Name: "b", Membership: &mb, DisableIngress: true}, rec)
	a := startTestNode(t, NodeConfig{Conn: natstest.Connect(t, s), Name: "a", Membership: &ma}, nil)
	js, _ := jetstream.New(natstest.Connect(t, s))
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return len(a.Members().Hosting("rec")) == 1 }, "b visible to a")
	plain := natstest.Connect(t, s)
	answered := make(chan error, 1)
	go func() {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("rec/x", ""))
		m.Header.Set(hub.HeaderExpectResponse, "true")
		_, err := plain.RequestMsg(m, 30*time.Second)
		answered <- err
	}()
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 1 }, "the forward's handler runs on b")
	first := a.Session()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- a.Drain(ctx) }()
	natstest.Eventually(t, 5*time.Second, func() bool { return a.Status().Draining }, "draining")
	if err := kv.Delete(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, first.Members.IsLost, "a's generation lost")
	// A rejoin took well under a second before the fix; watch two.
	if natstest.Poll(2*time.Second, func() bool { return a.ID() != first.ID }) {
		t.Errorf("a rejoined as %s while draining", a.ID())
	}
	release()
	select {
	case <-drained:
	case <-time.After(15 * time.Second):
		t.Fatal("Drain did not return")
	}
	if err := <-answered; err != nil {
		t.Errorf("the ingress request in flight: %v", err)
	}
	select {
	case <-first.Done:
	default:
		t.Error("the session's Done is open after Drain")
	}
	if e, err := kv.Get(context.Background(), "a"); err == nil {
		var m membership.Member
		_ = json.Unmarshal(e.Value(), &m)
		t.Errorf("after Drain the registry names a: %s (draining %v); b sees it alive: %v", m.Node, m.Draining, b.Members().Alive(m.Node))
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
		t.Errorf("registry get: %v", err)
	}
}
