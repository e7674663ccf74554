package profiles_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestIngressReplyRules (issue 22, Why 2; SECURITY.md "Reply rules"): a
// caller with the client (or operator) profile names as the reply of an ingress request
// a subject under the nodes' own inbox, or under another client user's
// inbox prefix in a shape that would give it a caller scope of its own
// (bob's "_INBOX.bob" plus three tokens). The node drops the request
// unanswered and counts it; before, it published the caller's payload
// there (an echo), read by a node-profile subscriber of the node inbox and
// by bob.
func TestIngressReplyRules(t *testing.T) {
	t.Parallel()
	pw := func(name string) profiles.User {
		return profiles.User{User: name, Password: name + "-secret", Profile: profiles.Client(profiles.Mesh{ClientInbox: "_INBOX." + name})}
	}
	e := newSecured(t, pw("alice"), pw("bob"))
	p := subjects.DefaultPrefix
	nc := e.conn(t, "node", nats.CustomInboxPrefix(profiles.NodeInboxPrefix(p)))
	n, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "rules", Logger: quiet(), ClientInboxes: []string{"_INBOX.alice", "_INBOX.bob"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register("echo", func(context.Context, subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error { return d.Respond(d.Payload) }), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })

	var leaked atomic.Int64
	count := func(*nats.Msg) { leaked.Add(1) }
	nodeEar := e.conn(t, "node", nats.CustomInboxPrefix(profiles.NodeInboxPrefix(p)))
	// Not the whole node inbox: the node's own acceptance replies travel
	// there.
	for _, sub := range []string{profiles.NodeInboxPrefix(p) + ".abcdef.>"} {
		if _, err := nodeEar.Subscribe(sub, count); err != nil {
			t.Fatal(err)
		}
	}
	bob := natstest.Connect(t, e.s, nats.UserInfo("bob", "bob-secret"), nats.CustomInboxPrefix("_INBOX.bob"))
	if _, err := bob.Subscribe("_INBOX.bob.>", count); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*nats.Conn{nodeEar, bob} {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	alice := natstest.Connect(t, e.s, nats.UserInfo("alice", "alice-secret"), nats.CustomInboxPrefix("_INBOX.alice"))
	mallory := e.attacker(t, "client")
	operator := e.attacker(t, "operator")

	for _, a := range []struct {
		from  *nats.Conn
		reply string
	}{
		{mallory.nc, profiles.NodeInboxPrefix(p) + ".abcdef.1"},
		{mallory.nc, profiles.NodeInboxPrefix(p)},
		{operator.nc, profiles.NodeInboxPrefix(p) + ".abcdef.2"},
		{alice, "_INBOX.bob.x.y.z"},
	} {
		m := &nats.Msg{Subject: p.Ingress("echo/rules", ""), Reply: a.reply, Header: nats.Header{}, Data: []byte("forged content")}
		m.Header.Set(hub.HeaderExpectResponse, "true")
		if err := a.from.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if err := a.from.Flush(); err != nil {
			t.Fatal(err)
		}
		// An ordinary request by alice after it is answered; whatever the
		// node published before that answer has reached the listeners
		// once they flushed.
		ok := &nats.Msg{Subject: p.Ingress("echo/rules", ""), Header: nats.Header{}, Data: []byte("hi")}
		ok.Header.Set(hub.HeaderExpectResponse, "true")
		r, err := alice.RequestMsg(ok, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := verdict.Decode(r.Header); err != nil || string(r.Data) != "hi" {
			t.Fatalf("alice's own request: %q, %v", r.Data, err)
		}
		for _, c := range []*nats.Conn{nodeEar, bob} {
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if got := leaked.Load(); got != 0 {
			t.Fatalf("reply %s: the node published %d message(s) there", a.reply, got)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return n.Status().IngressInboxRefused == 4 }, "refusals not counted: %+v", n.Status())
}
