package mesh

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// ticks records the turns of a "tick" hub kind across activations.
type ticks struct {
	mu     sync.Mutex
	turns  []*hub.Delivery
	nodes  []string
	builds int
	onTurn func(n *Node, d *hub.Delivery)
}

func (k *ticks) factory(n *Node) hub.Factory {
	return func(_ context.Context, _ subjects.Address) (hub.Hub, error) {
		k.mu.Lock()
		k.builds++
		k.mu.Unlock()
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			k.mu.Lock()
			k.turns = append(k.turns, d)
			k.nodes = append(k.nodes, n.cfg.Name)
			f := k.onTurn
			k.mu.Unlock()
			if f != nil {
				f(n, d)
			}
			return nil
		}), nil
	}
}

func (k *ticks) fires() []*hub.Delivery {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*hub.Delivery
	for _, d := range k.turns {
		if d.Reminder != "" {
			out = append(out, d)
		}
	}
	return out
}

func tickNode(t *testing.T, s *server.Server, name string, k *ticks, mc MembershipConfig, idle time.Duration) *Node {
	t.Helper()
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: name, Membership: &mc, Host: hub.Config{IdleTimeout: idle}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register("tick", k.factory(n)); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// An interval reminder keeps firing into an address whose activation is
// idle-collected between fires: each fire activates it again, carries the
// reminder's name and due time, and is handled once.
func TestReminderSurvivesIdleCollection(t *testing.T) {
	s := natstest.RunServer(t)
	k := &ticks{}
	a := tickNode(t, s, "a", k, steadyMembership, 150*time.Millisecond)
	b := tickNode(t, s, "b", k, steadyMembership, 150*time.Millisecond)
	waitMembers(t, 2, a, b)
	if _, err := a.Reminders().Set(context.Background(), reminders.Reminder{Address: "tick/idle", Name: "beat", Schedule: reminders.Every(time.Second), Type: "beat", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, func() bool { return len(k.fires()) >= 3 }, "fewer than 3 fires")
	k.mu.Lock()
	builds := k.builds
	k.mu.Unlock()
	if builds < 3 {
		t.Fatalf("%d builds for 3 fires 1 s apart with a 150 ms idle timeout: the activation was not collected between fires", builds)
	}
	seen := map[string]bool{}
	for i, d := range k.fires() {
		if d.Reminder != "beat" || d.Type != "beat" || string(d.Payload) != "x" || d.Due.IsZero() || d.To != "tick/idle" {
			t.Fatalf("fire %d = %+v", i, d)
		}
		if seen[d.ID] {
			t.Fatalf("fire %d repeats ID %s", i, d.ID)
		}
		seen[d.ID] = true
	}
	// A runner counts a fire delivered once the delivery's verdict is back,
	// which can come after the hub's turn recorded it: poll.
	natstest.Eventually(t, 10*time.Second, func() bool {
		return a.ReminderStats().Delivered+b.ReminderStats().Delivered >= 3
	}, "runners delivered %d", a.ReminderStats().Delivered+b.ReminderStats().Delivered)
}

// A hub sets a reminder on its own address during its turn; the fire comes
// back to it.
func TestReminderSetFromATurn(t *testing.T) {
	s := natstest.RunServer(t)
	k := &ticks{}
	k.onTurn = func(n *Node, d *hub.Delivery) {
		if d.Type != "arm" {
			return
		}
		if _, err := n.Reminders().Set(context.Background(), reminders.Reminder{Address: d.To, Name: "self", Schedule: reminders.In(300 * time.Millisecond), Type: "wake"}); err != nil {
			t.Errorf("Set from a turn: %v", err)
		}
	}
	n := tickNode(t, s, "a", k, steadyMembership, 0)
	if _, err := n.Deliver(context.Background(), Delivery{To: "tick/self", Type: "arm"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return len(k.fires()) == 1 }, "the reminder set from a turn did not fire")
	if d := k.fires()[0]; d.Type != "wake" || d.Reminder != "self" {
		t.Fatalf("fire = %+v", d)
	}
}

// A fire whose first delivery attempt is handled but whose answer is lost
// (the runner sees a resendable failure) is redelivered under the same ID,
// and the intake's dedupe answers it: the handler runs once.
func TestReminderLostAnswerHandledOnce(t *testing.T) {
	s := natstest.RunServer(t)
	k := &ticks{}
	mc := steadyMembership
	mc.DisableReminders = true
	n := tickNode(t, s, "a", k, mc, 0)
	st, err := reminders.Open(context.Background(), reminders.Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ids []string
	r, err := st.Run(context.Background(), reminders.RunConfig{
		RetryBase: 50 * time.Millisecond,
		Deliver: func(ctx context.Context, f reminders.Fire) error {
			err := n.deliverFire(ctx, f)
			mu.Lock()
			defer mu.Unlock()
			ids = append(ids, f.ID)
			if len(ids) == 1 && err == nil {
				return nats.ErrDisconnected // the answer "was lost": resendable
			}
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	if _, err := st.Set(context.Background(), reminders.Reminder{Address: "tick/once", Name: "n", Schedule: reminders.In(200 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return r.Stats().Delivered == 1 }, "the fire was not delivered")
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 2 || ids[0] != ids[1] {
		t.Fatalf("attempts %v: want two under one ID", ids)
	}
	if got := len(k.fires()); got != 1 {
		t.Fatalf("handler ran %d times for one fire", got)
	}
	if hits := n.Host().Stats().DedupeHits; hits < 1 {
		t.Fatalf("dedupe hits %d: the re-send was not recognised", hits)
	}
}

// Through the control endpoint (meshctl reminders): set, list, cancel.
func TestReminderControlEndpoint(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n := tickNode(t, s, "a", &ticks{}, steadyMembership, 0)
	nc := natstest.Connect(t, s)
	call := func(req string) (*nats.Msg, error) {
		return nc.Request(n.ControlSubject(ControlReminders), []byte(req), 5*time.Second)
	}
	m, err := call(`{"op":"set","address":"tick/c","name":"n1","every":"1h","type":"t"}`)
	if err != nil || m.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("set: %v %v", err, m.Header)
	}
	m, err = call(`{"op":"list"}`)
	if err != nil || !strings.Contains(string(m.Data), `"schedule":"@every 1h0m0s"`) {
		t.Fatalf("list: %v %s", err, m.Data)
	}
	m, _ = call(`{"op":"cancel","address":"tick/c","name":"n1"}`)
	if m.Header.Get("Nats-Service-Error") != "" {
		t.Fatalf("cancel: %v", m.Header)
	}
	m, _ = call(`{"op":"cancel","address":"tick/c","name":"n1"}`)
	if m.Header.Get("Nats-Service-Error-Code") != "404" {
		t.Fatalf("second cancel: %v", m.Header)
	}
	if _, err := n.Reminders().Get(context.Background(), "tick/c", "n1"); !errors.Is(err, reminders.ErrNotFound) {
		t.Fatalf("Get after cancel: %v", err)
	}
}

// The node whose runner holds a fire dies (its connection drops, nothing
// acknowledged or handed back) while the owner's turn runs: after the ack
// wait another node's runner takes the fire and re-sends it under the same
// ID; the owner's dedupe answers it with the kept response, so the turn
// ran once and the fire is acknowledged.
func TestReminderRunnerDiesWithFireInHand(t *testing.T) {
	s := natstest.RunServer(t)
	k := &ticks{}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	k.onTurn = func(_ *Node, d *hub.Delivery) {
		if d.Reminder != "" && len(k.fires()) == 1 {
			entered <- struct{}{}
			<-release
		}
	}
	host := steadyMembership
	host.DisableReminders = true
	owner := tickNode(t, s, "owner", k, host, 0)
	runners := steadyMembership
	runners.ReminderAckWait = time.Second
	var conns []*nats.Conn
	var nodes []*Node
	for _, name := range []string{"r1", "r2"} {
		nc := natstest.Connect(t, s)
		mc := runners
		n, err := NewNode(NodeConfig{Conn: nc, Name: name, Membership: &mc})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		conns, nodes = append(conns, nc), append(nodes, n)
	}
	waitMembers(t, 3, owner, nodes[0], nodes[1])
	if _, err := nodes[0].Reminders().Set(context.Background(), reminders.Reminder{Address: "tick/held", Name: "n", Schedule: reminders.In(200 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the fire did not reach the owner")
	}
	holder := -1
	for i, n := range nodes {
		if n.ReminderStats().InFlight == 1 {
			holder = i
		}
	}
	if holder < 0 {
		t.Fatal("no runner holds the fire")
	}
	conns[holder].Close() // a crash: nothing acknowledged, nothing handed back
	close(release)
	other := nodes[1-holder]
	natstest.Eventually(t, 15*time.Second, func() bool { return other.ReminderStats().Delivered == 1 }, "the other runner did not deliver the held fire")
	if got := len(k.fires()); got != 1 {
		t.Fatalf("the turn ran %d times", got)
	}
	if hits := owner.Host().Stats().DedupeHits; hits < 1 {
		t.Fatalf("dedupe hits %d", hits)
	}
}

// An interval reminder follows its address when the owner drains: the
// next fires activate it on the other node.
func TestReminderFollowsAMove(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	k := &ticks{}
	a := tickNode(t, s, "a", k, steadyMembership, 0)
	b := tickNode(t, s, "b", k, steadyMembership, 0)
	waitMembers(t, 2, a, b)
	if _, err := a.Reminders().Set(context.Background(), reminders.Reminder{Address: "tick/mover", Name: "beat", Schedule: reminders.Every(time.Second)}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return len(k.fires()) >= 1 }, "no first fire")
	k.mu.Lock()
	first := k.nodes[len(k.nodes)-1]
	k.mu.Unlock()
	owner, other := a, b
	if first == "b" {
		owner, other = b, a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := owner.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	before := len(k.fires())
	natstest.Eventually(t, 15*time.Second, func() bool { return len(k.fires()) >= before+2 }, "the reminder did not keep firing after its owner drained")
	k.mu.Lock()
	defer k.mu.Unlock()
	if last := k.nodes[len(k.nodes)-1]; last != other.cfg.Name {
		t.Fatalf("fire after the drain ran on %s, want %s", last, other.cfg.Name)
	}
}
