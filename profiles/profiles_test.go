package profiles_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// With the node profile between nodes the mesh works as on an open account
// (every async permission violation fails the test through natstest):
// membership and claims, deliveries and requests between nodes, the
// ingress for the client profile, control and discovery
// for the operator profile, and departure by disconnect advisory.
func TestProfilesServeTheMesh(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	a := e.node(t, "a", "node")
	b := e.node(t, "b", "node")
	natstest.Eventually(t, 10*time.Second, func() bool {
		return len(a.Members().Members()) == 2 && len(b.Members().Members()) == 2
	}, "nodes do not see each other")
	p := subjects.DefaultPrefix

	for i, addr := range []subjects.Address{"echo/on-b", "rec/on-b/2"} {
		release, err := b.Host().Activate(ctxT(t), addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(release)
		r, err := a.Client.Request(ctxT(t), mesh.Delivery{To: addr, Payload: []byte("hi")})
		if err != nil {
			t.Fatalf("request %d from a to b: %v", i, err)
		}
		if string(r.Payload) != "hi" || r.Node != b.ID() {
			t.Fatalf("request %d: %q from %v, want hi from %v", i, r.Payload, r.Node, b.ID())
		}
		if _, err := a.Client.Deliver(ctxT(t), mesh.Delivery{To: addr}); err != nil {
			t.Fatalf("deliver %d: %v", i, err)
		}
	}

	// The client profile through the ingress, with a request.
	cl := e.conn(t, "client")
	m := &nats.Msg{Subject: p.Ingress("echo/on-b", ""), Header: nats.Header{}, Data: []byte("ping")}
	m.Header.Set(hub.HeaderID, "ingress-1")
	m.Header.Set(hub.HeaderExpectResponse, "true")
	r, err := cl.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatalf("ingress request as client: %v", err)
	}
	if _, verr := verdict.Decode(r.Header); verr != nil || string(r.Data) != "ping" {
		t.Fatalf("ingress answer: %q, %v", r.Data, verr)
	}

	// The operator profile: control and micro discovery.
	op := e.conn(t, "operator")
	if _, err := op.Request(p.Control("a", mesh.ControlPing), nil, 5*time.Second); err != nil {
		t.Fatalf("operator ping: %v", err)
	}
	info, err := micro.ControlSubject(micro.InfoVerb, mesh.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Request(info, nil, 5*time.Second); err != nil {
		t.Fatalf("operator discovery: %v", err)
	}
	// The operator has no JetStream API (SECURITY.md,
	// TestNoJetStreamReflection): it learns what the registry holds from
	// the nodes.
	st, err := op.Request(p.Control("b", mesh.ControlPing), nil, 5*time.Second)
	if err != nil {
		t.Fatalf("operator ping b: %v", err)
	}
	var status mesh.NodeStatus
	if err := json.Unmarshal(st.Data, &status); err != nil || status.Node != b.ID().String() {
		t.Fatalf("status of b: %s, %v", st.Data, err)
	}
	// b's connection closes: a learns it from the disconnect advisory.
	b.nc.Close()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-a.events:
			if ev.Type.Departed() && ev.Member.Node == b.ID() {
				if ev.Type != membership.Disconnected {
					t.Fatalf("b departed by %v, want the disconnect advisory", ev.Type)
				}
				return
			}
		case <-deadline:
			t.Fatal("a did not see b depart")
		}
	}
}

// The rendered accounts section parses with nats-server's own parser for
// every user form, and bad input is refused.
func TestAccountsConf(t *testing.T) {
	m := profiles.Mesh{Prefix: "acme.mesh", Account: "APP"}
	conf, err := profiles.AccountsConf(m, []profiles.User{
		{User: "n", Password: "pw", Profile: profiles.Node(m)},
		{User: "c", PasswordVar: "CLIENT_PW", Profile: profiles.Client(m)},
		{NKey: "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4", Profile: profiles.Operator(m)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("CLIENT_PW", "secret")
	s := natstest.RunServer(t, natstest.WithConfig(conf))
	nc := natstest.Connect(t, s, nats.UserInfo("c", "secret"))
	if _, err := nc.Request("acme.mesh.in.x.y", nil, 100*time.Millisecond); err == nil {
		t.Fatal("a request nobody serves was answered")
	}
	for _, bad := range []profiles.Mesh{{Prefix: "a..b"}, {Account: "A B"}, {ClientInbox: "_INBOX.>"}, {ClientInbox: profiles.NodeInboxPrefix(subjects.DefaultPrefix)}} {
		if _, err := profiles.AccountsConf(bad, []profiles.User{{User: "u", Password: "p"}}); err == nil {
			t.Errorf("mesh %+v accepted", bad)
		}
	}
	for _, bad := range []profiles.User{{}, {User: "u"}, {NKey: "SU123"}, {User: "u", Password: `a"b`}, {User: "u", PasswordVar: "$X"}, {User: "u", Password: "p", NKey: "UABC"}} {
		if _, err := profiles.AccountsConf(profiles.Mesh{}, []profiles.User{bad}); err == nil {
			t.Errorf("user %+v accepted", bad)
		}
	}
}
