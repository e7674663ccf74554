package hub

import (
	"context"
	"errors"
	"fmt"
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
	t.Parallel()
	const n = 3 // deliveries, parked while the hub builds: a batch takes them all
	for _, tc := range []struct {
		name  string
		pause bool
		batch bool
	}{
		{"paused", true, false},
		{"paused batch", true, true},
		{"prompt", false, false},
		{"prompt batch", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t)
			nc := natstest.Connect(t, s)
			var asked atomic.Int32
			fenced := verdict.New(verdict.ReasonHubShuttingDown, "generation declared gone while paused")
			h, err := New(Config{Conn: nc, Node: subjects.NodeID{Name: "g", Generation: 1}, TurnFence: func() error {
				if !tc.pause {
					return nil
				}
				if asked.Add(1) == 1 {
					time.Sleep(3 * regateAfter) // stopped after the gate time was taken
					return nil
				}
				return fenced
			}})
			if err != nil {
				t.Fatal(err)
			}
			var handled, batches atomic.Int32
			built := make(chan struct{})
			_ = h.Register("k", func(context.Context, subjects.Address) (Hub, error) {
				<-built // deliveries park meanwhile
				if tc.batch {
					return batchFunc(func(_ context.Context, ds []*Delivery) error {
						if len(ds) > 1 {
							batches.Add(1)
						}
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
			for i := range n {
				id := fmt.Sprintf("r%d", i)
				if _, err := request(t, nc, subj, map[string]string{HeaderID: id, HeaderAnswerTo: "mesh.v1.ans.c.1"}, "x"); err != nil {
					t.Fatalf("%s not accepted: %v", id, err)
				}
			}
			close(built)
			if !tc.pause {
				natstest.Eventually(t, 5*time.Second, func() bool { return handled.Load() == n }, "all handled")
				if tc.batch && batches.Load() == 0 {
					t.Fatal("no batch turn ran")
				}
				return
			}
			want := n
			if !tc.batch {
				want = 1 // the first turn's delivery; the later ones meet the refusing gate at once
			}
			for range want {
				m, err := ans.NextMsg(5 * time.Second)
				if err != nil {
					t.Fatalf("no late verdict: %v (handled %d)", err, handled.Load())
				}
				if _, verr := verdict.Decode(m.Header); !errors.Is(verr, verdict.ErrHubShuttingDown) {
					t.Fatalf("late verdict %v, want the gate's", verr)
				}
			}
			if n := handled.Load(); n != 0 {
				t.Fatalf("handled %d deliveries after the pause", n)
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
