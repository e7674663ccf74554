package syncstream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestFailedSubscribeLeavesNothing: a Subscribe whose first attempt fails
// terminally, and a subscription torn down later by a Failed verdict, leave
// no activation, no claim and no goroutine behind on the subscriber's node.
func TestFailedSubscribeLeavesNothing(t *testing.T) {
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	_ = owner.Register("refuse", func(context.Context, subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(context.Context, *hub.Delivery) error { return errors.New("no subscribers here") }), nil
	})
	sub, _ := startNode(t, s, "sub", false)
	natstest.Eventually(t, 5*time.Second, func() bool { return len(sub.Members().Hosting("refuse")) == 1 }, "owner visible")
	// One failed Subscribe first: what the node starts once (the first
	// subscriber activation, the directory watch's consumer settling) is
	// not what each failed Subscribe must leave nothing of.
	if _, err := syncstream.Subscribe(context.Background(), sub, subjects.Address("refuse/x"), "", func(syncstream.Frame) {}); !errors.Is(err, verdict.ErrHandler) {
		t.Fatalf("warm-up Subscribe = %v", err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		return sub.Host().Stats().Activations == 0 && sub.Directory().Owned() == 0
	}, "warm-up left an activation or a claim")
	before := natstest.SnapshotGoroutines()
	for i := range 5 {
		_, err := syncstream.Subscribe(context.Background(), sub, subjects.Address("refuse/x"), "", func(syncstream.Frame) {})
		if !errors.Is(err, verdict.ErrHandler) {
			t.Fatalf("Subscribe %d = %v", i, err)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		return sub.Host().Stats().Activations == 0 && sub.Directory().Owned() == 0
	}, "no subscriber activation or claim left (activations %d, claims %d)", sub.Host().Stats().Activations, sub.Directory().Owned())
	natstest.NoGoroutineLeak(t, before, 2, 5*time.Second)
}

// TestSubscriberRearmsOnRejoin: when the subscriber's own node is fenced
// and rejoins under a new generation, the subscription re-arms on the new
// session (its address activated and claimed there), resubscribes once, and
// keeps receiving frames: never silently stale, never closed.
func TestSubscriberRearmsOnRejoin(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	startNode(t, s, "owner", true)
	sub, _ := startNode(t, s, "sub", false)
	natstest.Eventually(t, 5*time.Second, func() bool { return len(sub.Members().Hosting(hubs.KVKind)) == 1 }, "owner visible")
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, "kv/r", "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	set(t, sub, "kv/r", "a=1")
	natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get("a"); return v == "1" }, "first session's frames")
	old := sub.ID()
	// Declare the subscriber's generation gone behind its back: it fences
	// itself and rejoins under a new generation.
	js, _ := jetstream.New(natstest.Connect(t, s))
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), old.Name); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return sub.ID() != old && sub.Host().Stats().Node == sub.ID() }, "rejoined")
	natstest.Eventually(t, 10*time.Second, func() bool { _, _, r := ss.Stats(); return r >= 1 }, "resubscribed from the new session")
	set(t, sub, "kv/r", "b=2")
	natstest.Eventually(t, 10*time.Second, func() bool { v, _ := m.get("b"); return v == "2" }, "frames after the rejoin")
	select {
	case <-ss.Closed():
		t.Fatalf("closed across a rejoin: %v", ss.Err())
	default:
	}
	if _, _, r := ss.Stats(); r != 1 {
		t.Errorf("resubscribes %d, want 1 (once per change)", r)
	}
	if n := sub.Host().Stats().Activations; n != 1 {
		t.Errorf("%d activations on the new session, want the subscriber's 1", n)
	}
	t.Logf("re-armed from %s on %s", old, sub.ID())
}
