package mesh

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestIngressQuiescentWhenStopped: an ingress message the subscription
// handed over just before the node stopped its ingress (its callback
// descheduled between taking the message and registering the forward) is
// never forwarded once the ingress stopped: Drain and Close wait for every
// forward that began, and none begins after them — the ingress wait group is
// never added to from zero while it is waited on. Checked at each lifecycle
// event that stops the ingress (Close; Drain; Drain while another forward is
// in flight and the paused one resumes during it), many times each; a
// forward is seen by its ingress span.
func TestIngressQuiescentWhenStopped(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	cnc := natstest.Connect(t, s)
	const reps = 8
	for _, stop := range []string{"close", "drain", "drain-in-flight"} {
		t.Run(stop, func(t *testing.T) {
			for i := range reps {
				tr := newTraced(t)
				nc := natstest.Connect(t, s)
				n, err := NewNode(NodeConfig{Conn: nc, Name: fmt.Sprintf("%s-%d", stop, i), TracerProvider: tr.tp})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { n.Close() })
				rec := newRecorder()
				hold := make(chan struct{})
				var holdOnce sync.Once
				unhold := func() { holdOnce.Do(func() { close(hold) }) }
				t.Cleanup(unhold)
				rec.fn = func(_ context.Context, d *hub.Delivery) error {
					<-hold
					return d.Respond([]byte("done"))
				}
				if err := n.Register("rec", rec.factory); err != nil {
					t.Fatal(err)
				}
				paused, release := make(chan struct{}), make(chan struct{})
				pauseAt := 1 // the callback of the message to pause (after the one in flight)
				if stop == "drain-in-flight" {
					pauseAt = 2
				}
				var calls atomic.Int32
				n.ingressHook = func() {
					if calls.Add(1) == int32(pauseAt) {
						close(paused)
						<-release
					}
				}
				if err := n.Start(); err != nil {
					t.Fatal(err)
				}
				ask := func(id string, request bool) <-chan *nats.Msg {
					m := nats.NewMsg(subjects.DefaultPrefix.Ingress("rec/x", ""))
					m.Header.Set(hub.HeaderID, id)
					if request {
						m.Header.Set(hub.HeaderExpectResponse, "true")
					}
					ch := make(chan *nats.Msg, 1)
					go func() {
						r, err := cnc.RequestMsg(m, 20*time.Second)
						if err != nil {
							t.Errorf("%s: ingress request: %v", id, err)
						}
						ch <- r
					}()
					return ch
				}
				var inFlight <-chan *nats.Msg
				if stop == "drain-in-flight" {
					inFlight = ask("in-flight", true)
					natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 1 }, "the in-flight request's handler running")
				}
				late := ask("late", false)
				select {
				case <-paused:
				case <-time.After(10 * time.Second):
					t.Fatal("the ingress callback never ran")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				switch stop {
				case "close":
					n.Close()
					close(release)
				case "drain":
					if err := n.Drain(ctx); err != nil {
						t.Errorf("drain: %v", err)
					}
					close(release)
				case "drain-in-flight":
					done := make(chan error, 1)
					go func() { done <- n.Drain(ctx) }()
					// The paused callback resumes while the drain waits
					// for the forward in flight.
					natstest.Eventually(t, 5*time.Second, func() bool { return !n.ingressSub.IsValid() }, "the ingress stopped")
					close(release)
					r := <-late
					late = nil
					if _, err := verdict.Decode(r.Header); verdict.Classify(err) != verdict.ShuttingDown {
						t.Errorf("the paused message: %v, want ShuttingDown", err)
					}
					unhold()
					if r := <-inFlight; r == nil || string(r.Data) != "done" {
						t.Errorf("the forward in flight: %v", r)
					}
					if err := <-done; err != nil {
						t.Errorf("drain: %v", err)
					}
				}
				cancel()
				if late != nil {
					r := <-late
					if _, err := verdict.Decode(r.Header); verdict.Classify(err) != verdict.ShuttingDown {
						t.Errorf("the paused message: %v, want ShuttingDown", err)
					}
				}
				for _, sp := range tr.sr.Started() {
					if !strings.HasPrefix(sp.Name(), "ingress ") {
						continue
					}
					for _, kv := range sp.Attributes() {
						if kv.Key == attribute.Key("messaging.message.id") && kv.Value.AsString() == "late" {
							t.Fatalf("rep %d: the message taken before the ingress stopped was forwarded after it stopped (%s)", i, sp.Name())
						}
					}
				}
			}
		})
	}
}
