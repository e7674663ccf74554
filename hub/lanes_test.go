package hub

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestLaneSequence speaks the window's wire protocol (HeaderLane) with a
// plain nats.go client: legs in sequence are accepted, a gap or an old
// epoch is refused out of order (resendable) without advancing the lane, a
// new epoch's first leg restarts it, a lane whose state is gone (a new
// activation) refuses everything but an epoch's first leg, and a delivery
// without the header (one leg at a time, like `nats req`) is not checked.
func TestLaneSequence(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// TestLaneWindowGrant: the Accepted reply to an epoch's first leg carries
// the lane's window grant (HeaderWindow): Config.LaneWindow while the inbox
// is roomy, half its free room while it fills, at least 1; no other reply
// carries it.
func TestLaneWindowGrant(t *testing.T) {
	t.Parallel()
	started, grantOf := slowHost(t, Config{InboxSize: 40, LaneWindow: 16})
	grant := func(lane string) string { t.Helper(); return grantOf("snd.1", lane) }
	if g := grant(""); g != "" {
		t.Errorf("a leg without a lane: grant %q", g)
	}
	<-started // the handler holds its first delivery: the inbox fills from here
	if g := grant("e1/1"); g != "16" {
		t.Errorf("roomy inbox: grant %q, want 16 (LaneWindow)", g)
	}
	if g := grant("e1/2"); g != "" {
		t.Errorf("seq 2: grant %q, want none", g)
	}
	for i := 3; i <= 30; i++ {
		grant(fmt.Sprintf("e1/%d", i))
	}
	// 31 in the inbox of 40 (the running one counts until it returns):
	// this leg's own place aside, the free room is 8 → grant 4.
	if g := grant("e2/1"); g != "4" {
		t.Errorf("filling inbox: grant %q, want 4", g)
	}
	for i := 2; i <= 7; i++ {
		grant(fmt.Sprintf("e2/%d", i))
	}
	if g := grant("e3/1"); g != "1" { // 38 in it: free room 1 → at least 1
		t.Errorf("full but two: grant %q, want 1", g)
	}
}

// TestLaneWindowGrantShared: the lanes an activation knows share the free
// room of its inbox: each lane's grant is its part of half of it, so the
// lanes together are granted no more than the inbox holds.
func TestLaneWindowGrantShared(t *testing.T) {
	t.Parallel()
	started, grant := slowHost(t, Config{InboxSize: 200})
	grant("x.1", "")
	<-started
	for _, c := range []struct{ sender, lane, want string }{
		{"a.1", "ea/1", "99"},  // one lane: half of 198 free
		{"b.1", "eb/1", "49"},  // two lanes: 197 / 4
		{"c.1", "ec/1", "32"},  // three: 196 / 6
		{"a.1", "ea2/1", "32"}, // a known lane's new epoch: still three lanes, 195 / 6
	} {
		if g := grant(c.sender, c.lane); g != c.want {
			t.Errorf("%s %s: grant %q, want %s", c.sender, c.lane, g, c.want)
		}
	}
}

// slowHost starts a host of kind "slow" whose handler holds every turn
// until the test ends (started is told when the first one runs), and
// returns a function that sends one leg to slow/a from sender with lane
// (empty: none), fails the test unless it is accepted, and returns the
// reply's HeaderWindow.
func slowHost(t *testing.T, cfg Config) (started <-chan struct{}, grant func(sender, lane string) string) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	release := make(chan struct{})
	cfg.Conn, cfg.Node = nc, subjects.NodeID{Name: "g", Generation: 1}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := make(chan struct{}, 1)
	if err := h.Register("slow", func(context.Context, subjects.Address) (Hub, error) {
		return HandlerFunc(func(context.Context, *Delivery) error {
			select {
			case st <- struct{}{}:
			default:
			}
			<-release
			return nil
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(release); h.Close() })
	subj := h.cfg.Prefix.Delivery(h.Node(), "slow/a", "")
	n := 0
	return st, func(sender, lane string) string {
		t.Helper()
		n++
		m := nats.NewMsg(subj)
		m.Header.Set(HeaderID, fmt.Sprintf("g-%d", n))
		m.Header.Set(HeaderSender, sender)
		if lane != "" {
			m.Header.Set(HeaderLane, lane)
		}
		r, err := nc.RequestMsg(m, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := verdict.Decode(r.Header); err != nil {
			t.Fatalf("%s %s: %v", sender, lane, err)
		}
		return r.Header.Get(HeaderWindow)
	}
}
