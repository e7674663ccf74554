package hub

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestLaneSequence speaks the window's wire protocol (HeaderLane) with a
// plain nats.go client: legs in sequence are accepted, a gap or an old
// epoch is refused out of order (resendable) without advancing the lane, a
// new epoch's first leg restarts it, a lane whose state is gone (a new
// activation) refuses everything but an epoch's first leg, and a delivery
// without the header (one leg at a time, like `nats req`) is not checked.
func TestLaneSequence(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	h := startHost(t, nc)
	subj := h.cfg.Prefix.Delivery(h.Node(), "echo/lane", "st")
	n := 0
	send := func(lane string) error {
		t.Helper()
		n++
		hdr := map[string]string{HeaderID: fmt.Sprintf("id-%d", n), HeaderSender: "snd.1"}
		if lane != "" {
			hdr[HeaderLane] = lane
		}
		_, err := request(t, nc, subj, hdr, "x")
		return err
	}
	ok := func(lane string) {
		t.Helper()
		if err := send(lane); err != nil {
			t.Fatalf("%s: %v", lane, err)
		}
	}
	refused := func(lane string) {
		t.Helper()
		err := send(lane)
		if !errors.Is(err, verdict.ErrOutOfOrder) || !verdict.IsResendable(err) || verdict.Classify(err) != verdict.ShuttingDown {
			t.Fatalf("%s: %v, want out-of-order (resendable)", lane, err)
		}
	}
	ok("e1/1")
	ok("e1/2")
	refused("e1/4") // a gap
	refused("e1/4")
	ok("")     // no header: not sequence-checked
	ok("e1/3") // the lane did not advance on refusals
	ok("e1/4")
	refused("e1/4") // a repeated position
	ok("e2/1")      // a new epoch
	refused("e1/5") // the old epoch is over
	ok("e2/2")
	h.Deactivate("echo/lane")
	refused("e2/3") // a new activation holds no state
	ok("e3/1")
	ok("e3/2")
	// Another sender's lane, and another stream, are apart.
	for _, hdr := range []map[string]string{
		{HeaderID: "other-1", HeaderSender: "other.1", HeaderLane: "e3/3"},
	} {
		if _, err := request(t, nc, subj, hdr, "x"); !errors.Is(err, verdict.ErrOutOfOrder) {
			t.Fatalf("another sender's lane: %v", err)
		}
	}
	if _, err := request(t, nc, h.cfg.Prefix.Delivery(h.Node(), "echo/lane", "other"), map[string]string{HeaderID: "o-2", HeaderSender: "snd.1", HeaderLane: "e3/1"}, "x"); err != nil {
		t.Fatalf("another stream: %v", err)
	}
	for _, bad := range []string{"e1", "/1", "e1/0", "e1/x", "e 1/1", "e1/-1"} {
		if _, err := request(t, nc, subj, map[string]string{HeaderID: "bad", HeaderLane: bad}, "x"); !errors.Is(err, verdict.ErrBadRequest) {
			t.Errorf("lane %q: %v, want bad-request", bad, err)
		}
	}
}

// TestLaneStateBound: an activation keeps at most maxLaneStates lanes; past
// it one is evicted, and a leg of an evicted lane is refused out of order
// unless it starts an epoch.
func TestLaneStateBound(t *testing.T) {
	a := &activation{addr: "echo/b"}
	e := &entry{}
	e.Stream = "s"
	e.epoch = "e"
	for i := range maxLaneStates + 10 {
		e.Sender = fmt.Sprintf("s.%d", i)
		e.seq = 1
		if err := a.laneCheckLocked(e); err != nil {
			t.Fatal(err)
		}
		a.laneAdvanceLocked(e, time.Now())
	}
	if len(a.lanes) != maxLaneStates {
		t.Fatalf("%d lane states, want the bound %d", len(a.lanes), maxLaneStates)
	}
	evicted := 0
	for i := range maxLaneStates + 10 {
		e.Sender, e.seq = fmt.Sprintf("s.%d", i), 2
		if err := a.laneCheckLocked(e); errors.Is(err, verdict.ErrOutOfOrder) {
			evicted++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if evicted != 10 {
		t.Errorf("%d lanes refused as evicted, want 10", evicted)
	}
}
