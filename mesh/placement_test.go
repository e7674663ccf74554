package mesh

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

// TestNoPlacementWait: a delivery whose kind no live node hosts is retried
// for the placement wait only (virtual time), not the whole ladder, and
// fails Unavailable/no-placement, resendable: nothing was sent.
func TestNoPlacementWait(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	for _, tc := range []struct {
		wait         time.Duration
		wantAttempts int
	}{
		{0, 1},
		{100 * time.Millisecond, 2},
		{DefaultPlacementWait, 0}, // 0: count not fixed by jitter; checked by total
		{5 * time.Second, 0},
	} {
		clock := newFakeClock()
		var resolves atomic.Int32
		res := ResolverFunc(func(context.Context, subjects.Address) (subjects.NodeID, error) {
			resolves.Add(1)
			return subjects.NodeID{}, &verdict.Error{Reason: verdict.ReasonNoPlacement, Message: `no live node hosts kind "nope"`}
		})
		c := newClient(t, nc, res, WithClock(clock), WithPlacementWait(tc.wait))
		r, err := c.Deliver(context.Background(), Delivery{To: "nope/x"})
		if !errors.Is(err, verdict.ErrNoPlacement) || verdict.Classify(err) != verdict.Unavailable || !verdict.IsResendable(err) {
			t.Fatalf("wait %v: err = %v (class %v); want no-placement, Unavailable, resendable", tc.wait, err, verdict.Classify(err))
		}
		if tc.wantAttempts != 0 && r.Attempts != tc.wantAttempts {
			t.Errorf("wait %v: attempts = %d, want %d", tc.wait, r.Attempts, tc.wantAttempts)
		}
		if int(resolves.Load()) != r.Attempts {
			t.Errorf("wait %v: %d resolves for %d attempts", tc.wait, resolves.Load(), r.Attempts)
		}
		var total time.Duration
		for _, d := range clock.recorded() {
			total += d
		}
		// The ladder's own bound (9.75 s ±20 %) caps a longer wait.
		if want := min(tc.wait, 11700*time.Millisecond); total > want || tc.wait <= 3*time.Second && total != tc.wait {
			t.Errorf("wait %v: backed off %v in all (%v)", tc.wait, total, clock.recorded())
		}
	}
}

// TestNoPlacementThenJoin: a node hosting the kind that appears within the
// placement wait gets the delivery.
func TestNoPlacementThenJoin(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	n, _ := testNode(t, s, "a")
	id := n.ID()
	clock := newFakeClock()
	var resolves atomic.Int32
	res := ResolverFunc(func(context.Context, subjects.Address) (subjects.NodeID, error) {
		if resolves.Add(1) < 3 {
			return subjects.NodeID{}, verdict.ErrNoPlacement
		}
		return id, nil
	})
	c := newClient(t, nc, res, WithClock(clock))
	r, err := c.Deliver(context.Background(), Delivery{To: "rec/x"})
	if err != nil || r.Attempts != 3 || r.Node != id {
		t.Fatalf("receipt %+v, err %v; want accepted by %v at attempt 3", r, err, id)
	}
}
