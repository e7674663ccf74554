package mesh

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestLateRefusalDuringResendIsNotTheVerdict: an awaited Request is re-sent
// after its owner's connection moved; while the re-send is out, the owner's
// late refusal of the earlier acceptance arrives (its activation stood
// down before handling: resendable), and then the owner accepts the
// re-send afresh. The refusal is not the verdict — the delivery will run —
// and the Request returns the re-accepted delivery's response. Found by
// the nemesis (a lame-duck move and a stand-down at once): the caller was
// told "safe to send again" of a delivery that then ran.
func TestLateRefusalDuringResendIsNotTheVerdict(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	node := subjects.NodeID{Name: "spy", Generation: 1}
	legs := make(chan *nats.Msg, 16)
	spy := natstest.Connect(t, s)
	if _, err := spy.Subscribe(subjects.DefaultPrefix.NodeSubscription(node), func(m *nats.Msg) { legs <- m }); err != nil {
		t.Fatal(err)
	}
	_ = spy.Flush()
	c, err := NewClient(Config{Conn: natstest.Connect(t, s), Resolver: StaticResolver{Node: node}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	flightOf := func(id string) *flight {
		c.pendingMu.Lock()
		defer c.pendingMu.Unlock()
		return c.pending[id]
	}
	for i := range 20 {
		id := fmt.Sprintf("r%d", i)
		type result struct {
			resp Response
			err  error
		}
		done := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r, err := c.Request(ctx, Delivery{ID: id, To: "k/x"})
			done <- result{r, err}
		}()
		accept(<-legs)
		natstest.Eventually(t, 5*time.Second, func() bool {
			return c.countFlights(func(f *flight) bool { return f.id == id && f.phase == phaseAccepted }) == 1
		}, "round %d: accepted", i)
		c.ownerMoved(node, fmt.Errorf("owner's connection moved: %w", nats.ErrDisconnected))
		resend := <-legs
		if resend.Header.Get("Mesh-Id") != id {
			t.Fatalf("round %d: re-send of %q", i, resend.Header.Get("Mesh-Id"))
		}
		f := flightOf(id)
		f.mu.Lock() // the late refusal of the first acceptance, as takeLocked records it
		f.ans = &answer{err: verdict.New(verdict.ReasonNotOwner, "activation k/x on %s stood down before handling", node), node: node.String()}
		f.wakeLocked()
		f.mu.Unlock()
		accept(resend) // accepted afresh: it will run
		natstest.Eventually(t, 5*time.Second, func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.ans == nil
		}, "round %d: the refusal set aside once the re-send was accepted again", i)
		f.mu.Lock()
		f.ans = &answer{payload: []byte("ran:" + id), node: node.String()}
		f.wakeLocked()
		f.mu.Unlock()
		r := <-done
		if r.err != nil || string(r.resp.Payload) != "ran:"+id {
			t.Fatalf("round %d: %q %v, want the re-accepted delivery's response", i, r.resp.Payload, r.err)
		}
	}
}
