package mesh

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
)

// TestDrainBoundNATSUnreachable: Drain returns by its ctx's deadline even
// when NATS is gone (the registry write, the leave and the settlement all
// stall): a hard bound, not a wish. The margin is for scheduling on a busy
// machine; before this bound the same drain took over 10 s.
func TestDrainBoundNATSUnreachable(t *testing.T) {
	for _, deadline := range []time.Duration{0, 100 * time.Millisecond, 400 * time.Millisecond} {
		t.Run(deadline.String(), func(t *testing.T) {
			s := natstest.RunServer(t)
			rec := newRecorder()
			block := make(chan struct{})
			defer close(block)
			rec.fn = func(context.Context, *hub.Delivery) error {
				<-block // ignores ctx
				return nil
			}
			n, _ := clusterNode(t, s, "a", rec)
			if _, err := n.Deliver(context.Background(), Delivery{To: "rec/stuck"}); err != nil {
				t.Fatal(err)
			}
			natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 1 }, "handler running")
			s.Shutdown()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := n.Drain(ctx)
			took := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Drain = %v, want the deadline's error", err)
			}
			if took > deadline+time.Second {
				t.Errorf("Drain took %v with a %v deadline and NATS unreachable", took, deadline)
			}
			t.Logf("Drain with a %v deadline, NATS unreachable, a stuck handler: returned after %v", deadline, took)
		})
	}
}
