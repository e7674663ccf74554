package syncstream_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestBreakerStreamLinkChaos: a kv hub's stream followed by a subscriber
// on another node while thousands of sets are pipelined to the hub and the
// links of both nodes drop every few milliseconds. Frames are deliveries
// on windowed lanes, several to a delivery: one lost or applied twice
// would leave the mirror wrong. Once the links hold, the subscriber is not
// stale: its mirror converges on the hub's own state, key for key.
func TestBreakerStreamLinkChaos(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, onc := startNode(t, s, "owner", true)
	sub, snc := startNode(t, s, "sub", false)
	const addr = subjects.Address("kv/chaos")
	set(t, owner, addr, "k0=0")
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, addr, "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	stop := make(chan struct{})
	drops := make(chan int)
	go func() {
		k := 0
		for {
			select {
			case <-stop:
				drops <- k
				return
			case <-time.After(40 * time.Millisecond):
			}
			if k%2 == 0 {
				_ = onc.ForceReconnect()
			} else {
				_ = snc.ForceReconnect()
			}
			k++
		}
	}()
	const keys = 40
	sets := 300 // the quick suite's shape; the long suite pipelines 1 000
	if natstest.Long() {
		sets = 1000
	}
	chans := make([]<-chan mesh.Result, 0, sets)
	for i := range sets {
		chans = append(chans, owner.Client.DeliverAsync(context.Background(), mesh.Delivery{To: addr, Type: hubs.KVSet,
			Payload: fmt.Appendf(nil, "k%d=%d", i%keys, i)}))
	}
	failed := 0
	why := map[string]int{}
	for _, ch := range chans {
		if r := <-ch; r.Err != nil {
			failed++
			why[verdictOf(r.Err)]++
			if len(why) < 3 && why[verdictOf(r.Err)] == 1 {
				t.Logf("e.g. %v", r.Err)
			}
		}
	}
	t.Logf("sets failed: %v", why)
	close(stop)
	k := <-drops
	natstest.Eventually(t, 10*time.Second, func() bool { return onc.IsConnected() && snc.IsConnected() }, "links back")
	want := map[string]string{}
	for i := range keys {
		key := fmt.Sprint("k", i)
		r, err := owner.Request(context.Background(), mesh.Delivery{To: addr, Type: hubs.KVGet, Payload: []byte(key)})
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		want[key] = string(r.Payload)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		m.mu.Lock()
		diff := 0
		for k, v := range want {
			if m.state[k] != v {
				diff++
			}
		}
		m.mu.Unlock()
		if diff == 0 {
			break
		}
		if time.Now().After(deadline) {
			applied, stale, resubs := ss.Stats()
			e, v := ss.Position()
			t.Fatalf("mirror differs from the hub on %d of %d keys (position %d/%d; applied %d, stale %d, resubscribes %d; %d link drops, %d sets failed)",
				diff, keys, e, v, applied, stale, resubs, k, failed)
		}
		time.Sleep(10 * time.Millisecond)
	}
	applied, stale, resubs := ss.Stats()
	t.Logf("%d sets (%d failed), %d link drops; subscriber applied %d, stale %d, resubscribes %d", sets, failed, k, applied, stale, resubs)
}

func verdictOf(err error) string {
	var v *verdict.Error
	if errors.As(err, &v) {
		return verdict.Classify(err).String() + "/" + string(v.Reason)
	}
	return verdict.Classify(err).String() + ": " + err.Error()
}
