package hub

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestTurnRegatedAfterAPause: a turn that passed its serving gate but
// reaches its handler more than regateAfter later — its process stopped in
// between (the 30-minute soak, round 3: frozen 5.9 s, declared gone and
// taken over meanwhile, it ran the turn 1 ms after waking) — asks the gate
// again, and a gate that now refuses fails the delivery with the gate's
// verdict, unhandled. A turn that reaches its handler at once is not asked
// again. The pause is made inside the gate's first answer (the gate time
// is taken before it is asked), for a turn of a plain handler and for a
// batch.
func TestTurnRegatedAfterAPause(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pause  time.Duration
		batch  bool
		handle bool
	}{
		{"paused", 3 * regateAfter, false, false},
		{"paused batch", 3 * regateAfter, true, false},
		{"prompt", 0, false, true},
		{"prompt batch", 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t)
			nc := natstest.Connect(t, s)
			var asked atomic.Int32
			fenced := verdict.New(verdict.ReasonHubShuttingDown, "generation declared gone while paused")
			h, err := New(Config{Conn: nc, Node: subjects.NodeID{Name: "g", Generation: 1}, TurnFence: func() error {
				if asked.Add(1) == 1 {
					time.Sleep(tc.pause) // stopped after the gate time was taken
					return nil
				}
				return fenced
			}})
			if err != nil {
				t.Fatal(err)
			}
			var handled atomic.Int32
			_ = h.Register("k", func(context.Context, subjects.Address) (Hub, error) {
				if tc.batch {
					return batchFunc(func(_ context.Context, ds []*Delivery) error {
						handled.Add(int32(len(ds)))
						return nil
					}), nil
				}
				return HandlerFunc(func(context.Context, *Delivery) error {
					handled.Add(1)
					return nil
				}), nil
			})
			if err := h.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Close)
			ans, err := nc.SubscribeSync("mesh.v1.ans.c.1")
			if err != nil {
				t.Fatal(err)
			}
			subj := subjects.DefaultPrefix.Delivery(h.Node(), "k/a", "")
			if _, err := request(t, nc, subj, map[string]string{HeaderID: "r1", HeaderAnswerTo: "mesh.v1.ans.c.1"}, "x"); err != nil {
				t.Fatalf("not accepted: %v", err)
			}
			if tc.handle {
				natstest.Eventually(t, 5*time.Second, func() bool { return handled.Load() == 1 }, "handled")
				return
			}
			m, err := ans.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("no late verdict: %v (handled %d)", err, handled.Load())
			}
			if _, verr := verdict.Decode(m.Header); !errors.Is(verr, verdict.ErrHubShuttingDown) {
				t.Fatalf("late verdict %v, want the gate's", verr)
			}
			if n := handled.Load(); n != 0 {
				t.Fatalf("handled %d times after the pause", n)
			}
		})
	}
}

// batchFunc is a Hub that also handles batches (Batcher).
type batchFunc func(context.Context, []*Delivery) error

func (f batchFunc) Handle(ctx context.Context, d *Delivery) error { return f(ctx, []*Delivery{d}) }
func (f batchFunc) HandleBatch(ctx context.Context, ds []*Delivery) error {
	return f(ctx, ds)
}
