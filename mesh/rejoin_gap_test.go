package mesh

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestWorkSentDuringRejoinReachesSender: like
// TestDepartureDuringRejoinReachesSender, but the Request is sent by a
// while it rejoins (after the old session closed, before the new one is
// announced: from the rejoin's OnGeneration hook), to a peer b that the old
// session's directory cache still names; b accepts it and departs, still
// inside a's rejoin. The new session never saw b alive, and nothing was
// addressed to b when the old session closed: the generations addressed at
// the new session's install count too (DESIGN §4: outcome unknown at once,
// not the deadline's timeout). Found by a hostile review; failed every run
// before.
func TestWorkSentDuringRejoinReachesSender(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	admin := natstest.Connect(t, s)
	js, _ := jetstream.New(admin)
	b, bConn, recB := holdingPeer(t, s)
	var a *Node
	var mu sync.Mutex
	calls := 0
	type result struct {
		err  error
		took time.Duration
	}
	results := make(chan result, 1)
	mc := steadyMembership
	mc.OnGeneration = func(id subjects.NodeID) error {
		mu.Lock()
		calls++
		second := calls == 2
		mu.Unlock()
		if !second {
			return nil
		}
		// a rejoins: its user sends a Request now, to b (cached).
		before := recB.total()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			start := time.Now()
			_, err := a.Request(ctx, Delivery{To: "rec/held"})
			results <- result{err, time.Since(start)}
		}()
		deadline := time.Now().Add(5 * time.Second)
		for recB.total() == before && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if recB.total() == before {
			t.Errorf("the request sent during the rejoin did not reach b")
		}
		return departPeer(js, bConn, "b")
	}
	a, _ = clusterNodeWith(t, s, "a", nil, mc)
	waitMembers(t, 2, a, b)
	// warm a's cache for rec/held: one delivery answered by b.
	if _, err := a.Deliver(context.Background(), Delivery{To: "rec/held", ID: "warm"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return recB.total() == 1 }, "warm-up handled")
	old := a.ID()
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), old.Name); err != nil {
		t.Fatal(err)
	}
	r := <-results
	t.Logf("request sent during a's rejoin to b (departed inside the rejoin): %v after %v", r.err, r.took)
	if verdict.ReasonOf(r.err) != verdict.ReasonOutcomeUnknown || verdict.IsResendable(r.err) {
		t.Errorf("got %v (reason %q) after %v, want outcome unknown promptly (not the deadline's timeout)", r.err, verdict.ReasonOf(r.err), r.took)
	}
}

// holdingPeer starts node "b" hosting kind rec on s, whose turns are held
// until the test ends (a delivery with ID "warm" excepted): a Request
// accepted by b gets no response. It returns b, its connection and its
// recorder.
func holdingPeer(t *testing.T, s *server.Server) (*Node, *nats.Conn, *recorder) {
	t.Helper()
	release := make(chan struct{})
	rec := newRecorder()
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.ID == "warm" {
			return nil
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	b, nc := clusterNodeWith(t, s, "b", rec, steadyMembership)
	t.Cleanup(func() { close(release) })
	return b, nc, rec
}

// departPeer makes the peer named name on nc depart: its process first
// (closing its connection, so that no response of an ended turn reaches a
// sender), then its registry entry (expired, say).
func departPeer(js jetstream.JetStream, nc *nats.Conn, name string) error {
	nc.Close()
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		return err
	}
	return kv.Delete(context.Background(), name)
}
