package syncstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
)

// TestDroppedSubscriberResubscribes: a subscriber whose node has a tiny
// inbox and whose handler stalls on one frame: the owner's frame deliveries
// behind it are refused (inbox-full) and the owner drops the subscriber.
// Once the handler goes on, the subscriber must not stay silently stale
// (DESIGN §7): the owner tells it with a closed frame, it resubscribes and
// catches up with the owner's version. (Deltas accepted behind a refused
// one may be applied past it meanwhile — the §7 guard takes any greater
// version — until the snapshot of the resubscription replaces them.)
func TestDroppedSubscriberResubscribes(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	owned := startPublisher(t, owner)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	mc := fast
	sub, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "sub", Membership: &mc, Logger: quiet, DisableControl: true,
		Host: hub.Config{InboxSize: 1}}, mesh.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	gate := make(chan struct{})
	var mu sync.Mutex
	var last uint64
	var gaps []string
	stalled := false
	addr := subjects.Address("pub/slow")
	ss, err := syncstream.Subscribe(context.Background(), sub, addr, "", func(f syncstream.Frame) {
		mu.Lock()
		if !f.Snapshot && f.Version != last+1 {
			gaps = append(gaps, fmt.Sprintf("delta %d applied after %d", f.Version, last))
		}
		last = f.Version
		// The first delta from version 3 on: under load a delivery may
		// be refused before the stall (the inbox holds one), and the
		// version it carried is then never applied.
		stall := !f.Snapshot && f.Version >= 3 && !stalled
		stalled = stalled || stall
		mu.Unlock()
		if stall {
			<-gate // the fault: a handler stalled on one frame
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	var gateOnce sync.Once
	open := func() { gateOnce.Do(func() { close(gate) }) }
	t.Cleanup(open) // a failed check must not leave the handler (and Stop) blocked
	o := owned(addr)
	for i := range 40 {
		o.Publish("", []byte(fmt.Sprint(i)))
	}
	// Frames published apart, one a poll, until the owner gives up: a
	// loaded machine may batch the 40 above into deliveries few enough to
	// fit the stalled subscriber's inbox, and nothing is refused then.
	i := 40
	natstest.Eventually(t, 20*time.Second, func() bool {
		if o.Subscribers("") == 0 {
			return true
		}
		o.Publish("", []byte(fmt.Sprint(i)))
		i++
		return false
	}, "the owner dropped the stalled subscriber")
	open()
	for i := range 40 {
		o.Publish("", []byte(fmt.Sprint(i)))
	}
	natstest.Eventually(t, 10*time.Second, func() bool { _, v := ss.Position(); return v == o.Version("") },
		"subscriber caught up with the owner: %v", lazy(func() string {
			_, v := ss.Position()
			applied, stale, resubs := ss.Stats()
			return fmt.Sprintf("stale at version %d, owner at %d (applied %d, stale %d, resubscribes %d, subscribers %d)",
				v, o.Version(""), applied, stale, resubs, o.Subscribers(""))
		}))
	if _, _, resubs := ss.Stats(); resubs == 0 {
		t.Errorf("caught up without resubscribing")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("deltas applied past a refused one before the resubscription's snapshot: %v", gaps)
}

// lazy is a message argument formatted only when printed.
type lazy func() string

func (f lazy) String() string { return f() }
