package mesh

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestNoRespondersLadder: a delivery to a node generation with no subscriber
// is attempted 7 times on the 250 ms → 3 s schedule (virtual time),
// re-resolving and invalidating before each retry, then classifies
// ShuttingDown.
func TestNoRespondersLadder(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	clock := newFakeClock()
	res := &countingResolver{fn: func(int, subjects.Address) subjects.NodeID { return ghost }}
	c := newClient(t, nc, res, WithClock(clock))
	r, err := c.Deliver(context.Background(), Delivery{To: "rec/x"})
	if err == nil {
		t.Fatal("delivery to a departed generation succeeded")
	}
	if !errors.Is(err, nats.ErrNoResponders) || verdict.Classify(err) != verdict.ShuttingDown || !verdict.IsResendable(err) {
		t.Errorf("err = %v (class %v); want no responders, ShuttingDown", err, verdict.Classify(err))
	}
	if r.Attempts != 7 {
		t.Errorf("attempts = %d, want 7", r.Attempts)
	}
	if res.resolves != 7 || len(res.invalidated) != 7 {
		t.Errorf("resolves = %d, invalidations = %d; want 7 and 7", res.resolves, len(res.invalidated))
	}
	nominal := []time.Duration{250, 500, 1000, 2000, 3000, 3000}
	got := clock.recorded()
	if len(got) != len(nominal) {
		t.Fatalf("back-offs %v, want %d", got, len(nominal))
	}
	var total time.Duration
	for i, d := range got {
		n := nominal[i] * time.Millisecond
		if d < n*8/10 || d > n*12/10 {
			t.Errorf("back-off %d = %v, want %v ±20%%", i+1, d, n)
		}
		total += d
	}
	if total < 7800*time.Millisecond || total > 11700*time.Millisecond {
		t.Errorf("total back-off %v, want ≈9.75 s", total)
	}
}

// TestLadderRecoversOnReResolve: the resolver answers the live generation
// on the third attempt, which succeeds there.
func TestLadderRecoversOnReResolve(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	clock := newFakeClock()
	res := &countingResolver{fn: func(call int, _ subjects.Address) subjects.NodeID {
		if call < 3 {
			return ghost
		}
		return n.ID()
	}}
	c := newClient(t, natstest.Connect(t, s), res, WithClock(clock))
	r, err := c.Deliver(context.Background(), Delivery{To: "rec/x"})
	if err != nil || r.Attempts != 3 || r.Node != n.ID() {
		t.Fatalf("Deliver = %+v, %v; want accepted on attempt 3", r, err)
	}
	if len(clock.recorded()) != 2 || len(res.invalidated) != 2 {
		t.Errorf("back-offs %v, invalidations %v", clock.recorded(), res.invalidated)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.executions(r.ID) == 1 }, "handled")
	if d := rec.handled["rec/x"][0]; d.Attempt != 3 {
		t.Errorf("handled attempt %d, want 3", d.Attempt)
	}
}

// TestClosingStopsLadder: a client closing during back-off stops retrying
// and reports ShuttingDown at once.
func TestClosingStopsLadder(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	clock := newGatedClock()
	res := &countingResolver{fn: func(int, subjects.Address) subjects.NodeID { return ghost }}
	c, err := NewClient(Config{Conn: nc, Resolver: res}, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	out := c.DeliverAsync(context.Background(), Delivery{To: "rec/x"})
	natstest.Eventually(t, 5*time.Second, func() bool { return len(clock.recorded()) == 1 }, "first back-off")
	go c.Close()
	res2 := <-out
	if !errors.Is(res2.Err, verdict.ErrClosing) || verdict.Classify(res2.Err) != verdict.ShuttingDown || res2.Attempts != 1 {
		t.Fatalf("result %+v; want ErrClosing after 1 attempt", res2)
	}
	<-c.Closed()
}

// TestLadderBacksOffOnInjectedClock: the retry ladder's back-offs are timers
// of the client's clock (WithClock), here clockwork's fake clock left alone
// by the test but for its Advance: an hour-long back-off holds the delivery
// (its attempt waits on the clock) until the clock is advanced past it, and
// the whole ladder of hour-long back-offs ends in virtual time.
func TestLadderBacksOffOnInjectedClock(t *testing.T) {
	s := natstest.RunServer(t)
	fc := clockwork.NewFakeClock()
	res := &countingResolver{fn: func(int, subjects.Address) subjects.NodeID { return ghost }}
	c := newClient(t, natstest.Connect(t, s), res, WithClock(fc),
		WithRetry(RetryPolicy{MaxRetries: 3, Initial: time.Hour, Max: time.Hour, Multiplier: 1, Jitter: 0.01}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch := c.DeliverAsync(ctx, Delivery{To: "rec/x"})
	for i := 1; i <= 3; i++ {
		if err := fc.BlockUntilContext(ctx, 1); err != nil {
			t.Fatalf("back-off %d never waited on the injected clock: %v", i, err)
		}
		select {
		case r := <-ch:
			t.Fatalf("back-off %d: the delivery ended before the clock was advanced: %+v %v", i, r.Receipt, r.Err)
		default:
		}
		if n := c.backingOff(); n != 1 {
			t.Fatalf("back-off %d: %d flights backing off, want 1", i, n)
		}
		fc.Advance(2 * time.Hour) // past the back-off and its jitter
	}
	r := <-ch
	if !errors.Is(r.Err, nats.ErrNoResponders) || r.Attempts != 4 {
		t.Fatalf("%+v %v; want the whole ladder (4 attempts), no responders", r.Receipt, r.Err)
	}
}
