package profiles_test

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// The attacks of issue 11 by a caller with the client profile: NATS refuses
// each publish and subscribe (a permission violation), and the victim node
// is untouched: not drained, not departed, its registry entry and claims
// its own.
func TestClientProfileRefusesAttacks(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	v := e.node(t, "victim", "node")
	p := subjects.DefaultPrefix
	addr := subjects.Address("echo/target")
	release, err := v.Host().Activate(ctxT(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	self := v.Members().Self()
	reg, dir := membership.BucketName(p), directory.BucketName(p)
	gen := strconv.FormatUint(v.ID().Generation, 10)

	forgedMember, _ := json.Marshal(membership.Member{Node: subjects.NodeID{Name: "victim", Generation: math.MaxUint64}})
	advisory, _ := json.Marshal(map[string]any{
		"type": "io.nats.server.advisory.v1.client_disconnect", "timestamp": time.Now(),
		"server": map[string]any{"id": self.ServerID}, "client": map[string]any{"id": self.ClientID, "name": membership.ConnName(v.ID())},
		"reason": "Client Closed",
	})
	deliveryTo := func(answerTo string) *nats.Msg {
		m := &nats.Msg{Subject: p.Delivery(v.ID(), addr, ""), Header: nats.Header{}, Data: forgedMember}
		m.Header.Set(hub.HeaderID, "evil-"+nats.NewInbox()[7:])
		m.Header.Set(hub.HeaderAnswerTo, answerTo)
		m.Header.Set(hub.HeaderExpectResponse, "true")
		return m
	}
	forgedAnswer := &nats.Msg{Subject: p.Sub(hub.AnswerToken + ".victim." + gen), Header: nats.Header{}}
	forgedAnswer.Header.Set(hub.HeaderID, "some-delivery")
	forgedAnswer.Header.Set(hub.HeaderAnswer, hub.AnswerVerdict)
	verdict.Encode(forgedAnswer.Header, verdict.New(verdict.ReasonHubShuttingDown, "forged"), v.ID().String())

	pubs := []struct {
		attack string
		msg    *nats.Msg
	}{
		{"reflect a response onto the drain control subject", deliveryTo(p.Control("victim", mesh.ControlDrain))},
		{"reflect a response onto the registry", deliveryTo("$KV." + reg + ".victim")},
		{"forge a resendable late verdict", forgedAnswer},
		{"forge a disconnect advisory", &nats.Msg{Subject: e.m.AdvisorySubject(), Data: advisory}},
		{"write a higher generation (2^64-1) under a live name", &nats.Msg{Subject: "$KV." + reg + ".victim", Data: forgedMember}},
		{"delete a registry entry", &nats.Msg{Subject: "$KV." + reg + ".victim", Header: nats.Header{"KV-Operation": []string{"DEL"}}}},
		{"rewrite a claim", &nats.Msg{Subject: "$KV." + dir + "." + subjects.EncodeToken(string(addr)), Data: []byte(`{"owner":{"name":"other","generation":1}}`)}},
		{"purge the registry", &nats.Msg{Subject: "$JS.API.STREAM.PURGE.KV_" + reg, Data: []byte("{}")}},
		{"read the victim's connection IDs from the registry", &nats.Msg{Subject: "$JS.API.DIRECT.GET.KV_" + reg + ".$KV." + reg + ".victim"}},
		{"aim a consumer of the registry at a control subject", &nats.Msg{Subject: "$JS.API.CONSUMER.CREATE.KV_" + reg, Data: []byte(`{"stream_name":"KV_` + reg + `","config":{"deliver_subject":"` + p.Control("victim", mesh.ControlDrain) + `"}}`)}},
	}
	for _, profile := range []string{"client", "operator"} {
		for _, a := range pubs {
			t.Run(profile+"/"+a.attack, func(t *testing.T) {
				at := e.attacker(t, profile)
				if err := at.nc.PublishMsg(a.msg); err != nil {
					t.Fatal(err)
				}
				at.refused(t, a.msg.Subject)
			})
		}
	}
	for _, sub := range []string{p.Sub("dlv.>"), p.Sub("ans.>"), p.Sub(">"), profiles.NodeInboxPrefix(p) + ".>", "$KV.>", e.m.AdvisorySubject()} {
		for _, profile := range []string{"client", "operator"} {
			t.Run(profile+"/subscribe "+sub, func(t *testing.T) {
				at := e.attacker(t, profile)
				if _, err := at.nc.Subscribe(sub, func(*nats.Msg) {}); err != nil {
					t.Fatal(err)
				}
				at.refused(t, sub)
			})
		}
	}

	// Nothing reached the victim.
	if len(v.drains) != 0 {
		t.Fatal("the victim was asked to drain")
	}
	if got := v.Members().Self(); got.Node != v.ID() || !v.Members().Alive(v.ID()) {
		t.Fatalf("victim's registration changed: %+v", got)
	}
	if owner, err := v.Directory().Resolve(ctxT(t), addr); err != nil || owner != v.ID() {
		t.Fatalf("claim of %s: %v, %v", addr, owner, err)
	}
	select {
	case ev := <-v.events:
		t.Fatalf("membership event at the victim: %+v", ev)
	default:
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return v.Members().Confirmed() }, "victim not confirmed")
}

// The same attacks by a user without a profile (any user of an account
// configured without the profiles) succeed: nothing in a message proves
// who wrote a registry entry, a claim or an advisory. These pin what
// SECURITY.md says the profiles are for.
func TestWithoutProfilesAttacksSucceed(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	p := subjects.DefaultPrefix
	at := e.attacker(t, openUser)
	js, err := jetstream.New(at.nc)
	if err != nil {
		t.Fatal(err)
	}
	o := e.node(t, "observer", "node")
	reg, err := js.KeyValue(ctxT(t), membership.BucketName(p))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := js.KeyValue(ctxT(t), directory.BucketName(p))
	if err != nil {
		t.Fatal(err)
	}
	victim := func(t *testing.T, name string) *testNode {
		v := e.node(t, name, "node")
		natstest.Eventually(t, 10*time.Second, func() bool { return o.Members().Alive(v.ID()) }, "observer does not see %s", name)
		return v
	}

	t.Run("a forged disconnect advisory departs a live node", func(t *testing.T) {
		v := victim(t, "v1")
		ent, err := reg.Get(ctxT(t), "v1")
		if err != nil {
			t.Fatal(err)
		}
		var mb membership.Member
		if err := json.Unmarshal(ent.Value(), &mb); err != nil {
			t.Fatal(err)
		}
		adv, _ := json.Marshal(map[string]any{
			"type": "io.nats.server.advisory.v1.client_disconnect", "timestamp": time.Now(),
			"server": map[string]any{"id": mb.ServerID}, "client": map[string]any{"id": mb.ClientID, "name": membership.ConnName(v.ID())},
			"reason": "Client Closed",
		})
		if err := at.nc.Publish(e.m.AdvisorySubject(), adv); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 10*time.Second, func() bool { return !o.Members().Alive(mb.Node) }, "the forged advisory was not believed")
	})
	t.Run("a higher generation under a live name supersedes it", func(t *testing.T) {
		v := victim(t, "v2")
		forged, _ := json.Marshal(membership.Member{Node: subjects.NodeID{Name: "v2", Generation: v.ID().Generation + 1}, BeatAt: time.Now().UTC()})
		if _, err := reg.Put(ctxT(t), "v2", forged); err != nil {
			t.Fatal(err)
		}
		select {
		case <-v.fatal:
		case <-time.After(10 * time.Second):
			t.Fatal("the victim did not stand down")
		}
	})
	t.Run("a deleted entry makes a live node rejoin", func(t *testing.T) {
		v := victim(t, "v3")
		gen := v.ID().Generation
		if err := reg.Delete(ctxT(t), "v3"); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 10*time.Second, func() bool { return v.ID().Generation != gen }, "the victim did not rejoin")
	})
	t.Run("a claim rewritten to another live node makes the owner stand down", func(t *testing.T) {
		v := victim(t, "v4")
		addr := subjects.Address("echo/stolen")
		release, err := v.Host().Activate(ctxT(t), addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(release)
		claim, _ := json.Marshal(directory.Claim{Owner: o.ID(), Claimed: time.Now().UTC()})
		if _, err := dir.Put(ctxT(t), subjects.EncodeToken(string(addr)), claim); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 10*time.Second, func() bool { return v.Directory().Owned() == 0 }, "the owner did not stand down")
	})
}
