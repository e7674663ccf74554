package profiles_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// A caller with the client profile may publish only on the ingress, but
// chooses the reply subject of its request freely (NATS does not check
// reply subjects against permissions), and the node publishes its answer
// there with the node's own permissions. The ingress refuses a reply
// subject under the mesh's prefix, under "$" (JetStream API, KV, system,
// services) or in the nodes' inbox: it forwards nothing and answers
// nothing; the victim is not drained, superseded, or its registry deleted.
func TestIngressReplySubjectReflectionRefused(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	v := e.node(t, "victim", "node")
	p := subjects.DefaultPrefix
	reg := membership.BucketName(p)
	cl := e.attacker(t, "client")
	forged, _ := json.Marshal(membership.Member{Node: subjects.NodeID{Name: "victim", Generation: v.ID().Generation + 1}, BeatAt: time.Now().UTC()})

	for i, reply := range []string{
		p.Control("victim", mesh.ControlDrain),
		"$KV." + reg + ".victim",
		"$JS.API.STREAM.DELETE.KV_" + reg,
		"$JS.API.STREAM.PURGE.KV_" + reg,
		"$SRV.PING",
		p.Sub("ans.victim.1"),
	} {
		before := v.Status().IngressRefused
		m := &nats.Msg{Subject: p.Ingress("echo/reflect", ""), Reply: reply, Header: nats.Header{}, Data: forged}
		m.Header.Set(hub.HeaderID, "ingress-reflect-"+nats.NewInbox()[7:])
		m.Header.Set(hub.HeaderExpectResponse, "true")
		if err := cl.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 10*time.Second, func() bool { return v.Status().IngressRefused > before }, "reply %d (%s) not refused", i, reply)
	}
	// The victim is intact.
	if len(v.drains) != 0 {
		t.Fatal("the victim drained")
	}
	select {
	case err := <-v.fatal:
		t.Fatalf("victim stood down: %v", err)
	default:
	}
	js, _ := jetstream.New(v.nc)
	if _, err := js.KeyValue(ctxT(t), reg); err != nil {
		t.Fatalf("registry: %v", err)
	}
	if !v.Members().Confirmed() || v.Members().Self().Node != v.ID() {
		t.Fatal("victim's registration changed")
	}
	// An ordinary request through the ingress is still answered.
	ok := e.conn(t, "client")
	m := &nats.Msg{Subject: p.Ingress("echo/reflect", ""), Header: nats.Header{}, Data: []byte("hi")}
	m.Header.Set(hub.HeaderID, "ingress-ok")
	m.Header.Set(hub.HeaderExpectResponse, "true")
	if r, err := ok.RequestMsg(m, 10*time.Second); err != nil || string(r.Data) != "hi" {
		t.Fatalf("ordinary ingress request: %v", err)
	}
}
