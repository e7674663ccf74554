package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestDrainBoundNATSUnreachable: Drain returns by its ctx's deadline even
// when NATS is gone (the registry write, the leave and the settlement all
// stall): a hard bound, not a wish. The margin is for scheduling on a busy
// machine; before this bound the same drain took over 10 s. Close, once
// the handler returned, does not wait on NATS either: it sat out the
// JetStream API timeout (5 s) of each KV watcher's consumer delete before
// the watchers were stopped without waiting for the server.
func TestDrainBoundNATSUnreachable(t *testing.T) {
	longOnly(t)
	for _, deadline := range []time.Duration{0, 100 * time.Millisecond, 400 * time.Millisecond} {
		t.Run(deadline.String(), func(t *testing.T) {
			s := natstest.RunServer(t)
			rec := newRecorder()
			block := make(chan struct{})
			var unblock sync.Once
			release := func() { unblock.Do(func() { close(block) }) }
			defer release()
			rec.fn = func(context.Context, *hub.Delivery) error {
				<-block // ignores ctx
				return nil
			}
			// The server is shut down under the node on purpose: its
			// connection's async errors (broken pipe) are expected.
			nc := natstest.Connect(t, s, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			mc := fastMembership
			n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Membership: &mc})
			if err != nil {
				t.Fatal(err)
			}
			if err := n.Register("rec", rec.factory); err != nil {
				t.Fatal(err)
			}
			if err := n.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			if _, err := n.Deliver(context.Background(), Delivery{To: "rec/stuck"}); err != nil {
				t.Fatal(err)
			}
			natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 1 }, "handler running")
			s.Shutdown()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err = n.Drain(ctx)
			took := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Drain = %v, want the deadline's error", err)
			}
			if took > deadline+time.Second {
				t.Errorf("Drain took %v with a %v deadline and NATS unreachable", took, deadline)
			}
			t.Logf("Drain with a %v deadline, NATS unreachable, a stuck handler: returned after %v", deadline, took)
			release()
			start = time.Now()
			n.Close()
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("Close took %v with NATS unreachable and no handler running", took)
			} else {
				t.Logf("Close after it: %v", took)
			}
		})
	}
}

// TestRejoinStartsNewSession: a node declared gone behind its back (its
// registry entry removed) fences itself and starts a new session: a new
// generation with its own host and subscription, its control service's
// metadata naming the new generation, the old generation's subject without
// responders, and nothing of the old session left running.
func TestRejoinStartsNewSession(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	n, nc := clusterNode(t, s, "a", rec)
	if _, err := n.Deliver(context.Background(), Delivery{To: "rec/x"}); err != nil {
		t.Fatal(err)
	}
	// Accepted is not handled: fenced before its turn, the delivery would
	// end with a late ShuttingDown verdict instead (DESIGN §5).
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 1 }, "the delivery before the rejoin handled")
	old, oldHost := n.ID(), n.Host()
	sess := n.Session()
	if sess.ID != old || sess.Host != oldHost || sess.Members != n.Members() {
		t.Fatalf("the session snapshot %+v does not match the node's %s", sess, old)
	}
	select {
	case <-sess.Done:
		t.Fatal("the current session's Done is closed")
	default:
	}
	if got := n.Client.Identity(); got != old {
		t.Errorf("the client sends as %s, the session is %s", got, old)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), old.Name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sess.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the old session's Done did not close after the rejoin")
	}
	// Done closes once the next session is installed: a consumer woken by
	// it re-arms on the new generation, never on the old one again.
	next := n.Session()
	if next.ID == old || next.Host == oldHost || next.Host == nil {
		t.Fatalf("when the old session's Done closed the node's session was %+v (old %s)", next, old)
	}
	select {
	case <-next.Done:
		t.Fatal("the new session's Done is closed")
	default:
	}
	if oldHost.Stats().Activations != 0 {
		t.Errorf("the old session still holds %d activations", oldHost.Stats().Activations)
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		msgs := collectInfo(t, nc)
		for _, md := range msgs {
			if md[MetaNode] == n.ID().String() {
				return true
			}
		}
		return false
	}, "the control service names the new generation")
	for _, md := range collectInfo(t, nc) {
		if md[MetaNode] == old.String() {
			t.Errorf("a control service still names the old generation %s", old)
		}
	}
	m := nats.NewMsg(subjects.DefaultPrefix.Delivery(old, "rec/x", ""))
	m.Header.Set(hub.HeaderID, "to-old")
	if _, err := nc.RequestMsg(m, 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("the old generation's subject: %v, want no responders", err)
	}
	if r, err := n.Deliver(context.Background(), Delivery{To: "rec/x"}); err != nil || r.Node != n.ID() {
		t.Fatalf("after the rejoin: %+v %v", r, err)
	}
	// The client identity and answer subject are the new session's: hubs
	// read the sender's generation from them.
	if got := n.Client.Identity(); got != n.ID() {
		t.Errorf("after the rejoin the client sends as %s, the session is %s", got, n.ID())
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 2 }, "the delivery after the rejoin handled")
	rec.mu.Lock()
	hd := rec.handled["rec/x"]
	first, last := hd[0].Sender, hd[len(hd)-1].Sender
	rec.mu.Unlock()
	if first != old.String() || last != n.ID().String() {
		t.Errorf("hub saw senders %q then %q, want %s then %s", first, last, old, n.ID())
	}
	if resp, err := n.Request(context.Background(), Delivery{To: "rec/x"}); err != nil {
		t.Fatalf("a request after the rejoin (answered on the new answer subject): %+v %v", resp, err)
	}
	// The node's counters span its sessions: they never go back at a
	// rejoin (a Prometheus counter must not reset while the process lives).
	st := n.Status().Host
	if st.Accepted != 3 || st.Node != n.ID() {
		t.Errorf("after a rejoin the node counts %d accepted (node %s), want 3 across both sessions", st.Accepted, st.Node)
	}
	if st.Deactivated < 1 {
		t.Errorf("the old session's deactivation is not counted: %+v", st)
	}
}

// collectInfo gathers the metadata of every natsmesh micro service that
// answers an INFO request within a short while.
func collectInfo(t *testing.T, nc *nats.Conn) []map[string]string {
	t.Helper()
	inbox := nats.NewInbox()
	ch := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.INFO."+ServiceName, inbox, nil); err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	timeout := time.After(300 * time.Millisecond)
	for {
		select {
		case m := <-ch:
			var info micro.Info
			if json.Unmarshal(m.Data, &info) == nil {
				out = append(out, info.Metadata)
			}
		case <-timeout:
			return out
		}
	}
}

// TestOneLivenessStore: with membership the client keeps no departure
// marks of its own (it has no store for them): it asks the cluster view
// (Node.Gone), which forgets a departure after the fencing delay.
func TestOneLivenessStore(t *testing.T) {
	s := natstest.RunServer(t)
	a, _ := clusterNode(t, s, "a", newRecorder())
	b, _ := clusterNode(t, s, "b", newRecorder())
	waitMembers(t, 2, a, b)
	gone := b.ID()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return a.Gone(gone) }, "b known gone")
	// The departure event is counted on the membership watcher, which may
	// run just after the cluster view learned it.
	natstest.Eventually(t, 5*time.Second, func() bool { return a.departures.Load() >= 1 }, "the departure counted")
	if d := a.departures.Load(); d != 1 {
		t.Fatalf("departures seen %d, want 1", d)
	}
	if !a.Client.knownGone(gone) {
		t.Fatal("the client does not read the cluster view")
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return !a.Gone(gone) }, "the departure forgotten after the fencing delay")
}

// TestSessionDoneWhenTheNodeStops: Close (and Drain) end the current
// session's Done, so nothing armed on it waits for a rejoin that never
// comes; a node without a session gives a closed Done.
func TestSessionDoneWhenTheNodeStops(t *testing.T) {
	s := natstest.RunServer(t)
	for _, how := range []string{"close", "drain"} {
		t.Run(how, func(t *testing.T) {
			n, _ := clusterNode(t, s, "stop-"+how, newRecorder())
			sess := n.Session()
			if how == "close" {
				n.Close()
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := n.Drain(ctx); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-sess.Done:
			default:
				t.Fatalf("after %s the session's Done is open", how)
			}
		})
	}
	n, err := NewNode(NodeConfig{Conn: natstest.Connect(t, s), Name: "unstarted", Membership: &fastMembership})
	if err != nil {
		t.Fatal(err)
	}
	if sess := n.Session(); sess.Host != nil || !sess.ID.IsZero() {
		t.Errorf("before Start: %+v", sess)
	} else {
		select {
		case <-sess.Done:
		default:
			t.Error("before Start the session's Done is open")
		}
	}
}

// TestAnswerSubscriptionsEndWithClose: the answer subscriptions of a
// client's earlier identities (kept for a grace after a rejoin) end with
// Close, not when their grace timer fires later.
func TestAnswerSubscriptionsEndWithClose(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	base := nc.NumSubscriptions()
	c, err := NewClient(Config{Conn: nc, Resolver: StaticResolver{Node: subjects.NodeID{Name: "x", Generation: 1}}, Identity: subjects.NodeID{Name: "me", Generation: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for gen := uint64(2); gen <= 4; gen++ {
		if err := c.bindIdentity(subjects.NodeID{Name: "me", Generation: gen}); err != nil {
			t.Fatal(err)
		}
	}
	if got := nc.NumSubscriptions(); got < base+2 {
		t.Fatalf("%d subscriptions after three rebinds (base %d): the earlier answer subjects should stay for their grace", got, base)
	}
	c.Close()
	if got := nc.NumSubscriptions(); got != base {
		t.Errorf("%d subscriptions after Close, want %d: earlier identities' answer subscriptions outlive the client", got, base)
	}
}

// TestDepartureDuringRejoinReachesSender: a peer that departs while this
// node rejoins — after its old session stopped watching the registry,
// before its new session read it — is reported by neither session: the
// new one never saw it alive, so it emits no departure. The work this node
// had addressed to it must still get the departed verdicts (DESIGN §4)
// once the new session is installed, not its deadline's timeout: an
// accepted Request the outcome-unknown verdict (Failed), an Idempotent one
// the resendable departed verdict. The peer departs inside the rejoin
// (from the hook that runs before the new generation is announced, which
// is before the new session's registry watch starts): its entry deleted,
// its connection closed.
// Run repeatedly; it failed every time before the fix.
func TestDepartureDuringRejoinReachesSender(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	admin := natstest.Connect(t, s)
	js, _ := jetstream.New(admin)
	b, bConn, recB := holdingPeer(t, s) // its turns outlive the test's requests: no response comes
	var calls int
	var mu sync.Mutex
	mc := steadyMembership
	mc.OnGeneration = func(id subjects.NodeID) error {
		mu.Lock()
		calls++
		second := calls == 2
		mu.Unlock()
		if second { // a's rejoin: b departs now, unseen by either of a's sessions
			if err := departPeer(js, bConn, "b"); err != nil {
				return err
			}
		}
		return nil
	}
	a, _ := clusterNodeWith(t, s, "a", nil, mc)
	waitMembers(t, 2, a, b)
	bID := b.ID()
	type result struct {
		idem bool
		err  error
	}
	results := make(chan result, 2)
	for i, idem := range []bool{false, true} {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := a.Request(ctx, Delivery{To: subjects.Address("rec/held" + string(rune('0'+i))), Idempotent: idem})
			results <- result{idem, err}
		}()
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return recB.total() == 2 }, "both requests accepted by b and in their turns")
	old := a.ID()
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), old.Name); err != nil { // a is declared gone: it rejoins
		t.Fatal(err)
	}
	for range 2 {
		r := <-results
		if r.idem {
			if !verdict.IsResendable(r.err) || verdict.ReasonOf(r.err) != verdict.ReasonDeparted {
				t.Errorf("idempotent request to %s, which departed during a's rejoin: %v (resendable %v), want the departed verdict", bID, r.err, verdict.IsResendable(r.err))
			}
			continue
		}
		if verdict.ReasonOf(r.err) != verdict.ReasonOutcomeUnknown || verdict.IsResendable(r.err) {
			t.Errorf("request to %s, which departed during a's rejoin: %v, want outcome unknown (not its deadline's timeout)", bID, r.err)
		}
	}
	if a.ID() == old {
		t.Errorf("a did not rejoin (still %s)", old)
	}
}
