package profiles_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// DESIGN §5: a delivery naming an answer subject outside <prefix>.ans. is
// refused bad-request before anything is published, whoever sends it (here
// a user without any profile, who may publish deliveries): the node never
// publishes its response on its own control subject or into the registry.
func TestAnswerSubjectOutsideAnsRefused(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	v := e.node(t, "victim", "node")
	p := subjects.DefaultPrefix
	addr := subjects.Address("echo/reflect")
	at := e.attacker(t, openUser)
	reg := membership.BucketName(p)
	forged, _ := json.Marshal(membership.Member{Node: subjects.NodeID{Name: "victim", Generation: v.ID().Generation + 1}})

	send := func(answerTo string, expect bool) error {
		m := &nats.Msg{Subject: p.Delivery(v.ID(), addr, ""), Header: nats.Header{}, Data: forged}
		m.Header.Set(hub.HeaderID, "reflect-"+nats.NewInbox()[7:])
		m.Header.Set(hub.HeaderAnswerTo, answerTo)
		if expect {
			m.Header.Set(hub.HeaderExpectResponse, "true")
		}
		r, err := at.nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatalf("answer-to %q: %v", answerTo, err)
		}
		_, verr := verdict.Decode(r.Header)
		return verr
	}
	for _, bad := range []string{
		p.Control("victim", mesh.ControlDrain),
		"$KV." + reg + ".victim",
		"$JS.API.STREAM.PURGE.KV_" + reg,
		"_INBOX.somebody",
		p.Sub("ans"),
		p.Sub("ans.*"),
		p.Sub("ans.>"),
		p.Sub("ans..x"),
		p.Sub("answer.x.1"),
		"other.prefix.ans.x.1",
	} {
		for _, expect := range []bool{true, false} {
			err := send(bad, expect)
			if !errors.Is(err, verdict.ErrBadRequest) {
				t.Errorf("answer-to %q (expect response %v): verdict %v, want bad-request", bad, expect, err)
			}
		}
	}
	// The reply subject of a delivery is the sender's choice too: one under
	// "$" or the prefix is dropped, no verdict published there.
	for _, reply := range []string{"$KV." + reg + ".victim", p.Control("victim", mesh.ControlDrain)} {
		before := v.Host().Stats().Refused
		m := &nats.Msg{Subject: p.Delivery(v.ID(), addr, ""), Reply: reply, Header: nats.Header{}}
		m.Header.Set(hub.HeaderID, "reply-"+nats.NewInbox()[7:])
		if err := at.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 10*time.Second, func() bool { return v.Host().Stats().Refused > before }, "delivery with reply %s not dropped", reply)
	}
	// A well-formed answer subject is still served.
	if err := send(p.Sub("ans.somebody.7"), true); err != nil {
		t.Fatalf("answer-to under %s.ans.: %v", p, err)
	}
	// Nothing reached the control subject or the registry.
	if _, err := v.Client.Request(ctxT(t), mesh.Delivery{To: addr}); err != nil {
		t.Fatal(err)
	}
	if len(v.drains) != 0 {
		t.Fatal("the victim drained on a reflected response")
	}
	if self := v.Members().Self(); self.Node != v.ID() || !v.Members().Confirmed() {
		t.Fatalf("victim's registration: %+v", self)
	}
	select {
	case err := <-v.fatal:
		t.Fatalf("victim stood down: %v", err)
	default:
	}
}

// A user who sees every delivery (subscribed to <prefix>.dlv.>) and may
// publish answers, but cannot read the nodes' inbox, answers a Request
// first: the sender ignores the forged response, counts it, and returns
// the handler's real one.
func TestForgedResponseIgnored(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	a := e.node(t, "a", "node")
	b := e.node(t, "b", "node")
	natstest.Eventually(t, 10*time.Second, func() bool { return len(a.Members().Members()) == 2 }, "a does not see b")
	addr := subjects.Address("gate/x")
	release, err := b.Host().Activate(ctxT(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)

	snoop := e.attacker(t, snoopUser)
	forged := make(chan string, 16)
	if _, err := snoop.nc.Subscribe(subjects.DefaultPrefix.Sub("dlv.>"), func(m *nats.Msg) {
		to := m.Header.Get(hub.HeaderAnswerTo)
		ans := &nats.Msg{Subject: to, Header: nats.Header{}, Data: []byte("forged")}
		ans.Header.Set(hub.HeaderID, m.Header.Get(hub.HeaderID))
		ans.Header.Set(hub.HeaderAnswer, hub.AnswerResponse)
		verdict.Encode(ans.Header, nil, b.ID().String())
		_ = snoop.nc.PublishMsg(ans)
		forged <- m.Header.Get(hub.HeaderID)
	}); err != nil {
		t.Fatal(err)
	}
	if err := snoop.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		before := a.Client.Stats().ForgedAnswers
		type result struct {
			r   mesh.Response
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := a.Client.Request(ctxT(t), mesh.Delivery{To: addr, Payload: []byte("p")})
			done <- result{r, err}
		}()
		<-forged
		select {
		case res := <-done:
			t.Fatalf("request %d returned before the handler ran: %q, %v", i, res.r.Payload, res.err)
		case <-waitFor(func() bool { return a.Client.Stats().ForgedAnswers > before }):
		}
		b.gate <- struct{}{} // let the handler run
		res := <-done
		if res.err != nil || string(res.r.Payload) != "real:p" {
			t.Fatalf("request %d: %q, %v; want the handler's response", i, res.r.Payload, res.err)
		}
	}
}

// The same user forges a resendable late verdict for a delivery that was
// handled: the sender does not report it (no invitation to a duplicate) and
// counts it.
func TestForgedLateVerdictIgnored(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	a := e.node(t, "a", "node")
	b := e.node(t, "b", "node")
	natstest.Eventually(t, 10*time.Second, func() bool { return len(a.Members().Members()) == 2 }, "a does not see b")
	addr := subjects.Address("echo/late")
	release, err := b.Host().Activate(ctxT(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)

	snoop := e.attacker(t, snoopUser)
	seen := make(chan *nats.Msg, 16)
	if _, err := snoop.nc.Subscribe(subjects.DefaultPrefix.Sub("dlv.>"), func(m *nats.Msg) { seen <- m }); err != nil {
		t.Fatal(err)
	}
	if err := snoop.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r, err := a.Client.Deliver(ctxT(t), mesh.Delivery{To: addr})
		if err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return b.handledN(r.ID) == 1 }, "not handled")
		m := <-seen
		before := a.Client.Stats().ForgedAnswers
		ans := &nats.Msg{Subject: m.Header.Get(hub.HeaderAnswerTo), Header: nats.Header{}}
		ans.Header.Set(hub.HeaderID, r.ID)
		ans.Header.Set(hub.HeaderAnswer, hub.AnswerVerdict)
		verdict.Encode(ans.Header, verdict.New(verdict.ReasonHubShuttingDown, "forged: please send again"), b.ID().String())
		if err := snoop.nc.PublishMsg(ans); err != nil {
			t.Fatal(err)
		}
		select {
		case lv := <-a.lates:
			t.Fatalf("delivery %d: a forged late verdict reached the application: %+v", i, lv)
		case <-waitFor(func() bool { return a.Client.Stats().ForgedAnswers > before }):
		}
	}
	if len(a.lates) != 0 {
		t.Fatalf("late verdicts reported: %d", len(a.lates))
	}
}

// waitFor returns a channel closed once cond holds (polled); it gives up
// after 10 s, leaving the channel open so the caller's select reports the
// other outcome or times out in the test.
func waitFor(cond func() bool) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if cond() {
				close(ch)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return ch
}
