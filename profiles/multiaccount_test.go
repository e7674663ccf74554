package profiles_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// ingressRequest sends one ingress request with ID id and payload data to
// addr on nc and returns the answer's payload and verdict.
func ingressRequest(t *testing.T, nc *nats.Conn, addr subjects.Address, id, data string, hdr nats.Header) (string, error) {
	t.Helper()
	m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress(addr, ""), Header: nats.Header{}, Data: []byte(data)}
	for k, v := range hdr {
		m.Header[k] = v
	}
	m.Header.Set(hub.HeaderID, id)
	m.Header.Set(hub.HeaderExpectResponse, "true")
	r, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatalf("ingress request %s: %v", id, err)
	}
	_, verr := verdict.Decode(r.Header)
	return string(r.Data), verr
}

// The production profile (profiles.MultiAccountConf) serves the mesh with
// no permission violation anywhere (natstest fails the test on any async
// error): callers in the tenant accounts ALICE and BOB reach the ingress
// through the import, the node tells them apart by the Nats-Request-Info
// the server stamps (one's delivery ID is not the other's, and a forged
// header is replaced by the server), the operator in the mesh account
// controls the nodes and reads state through one, and a closed node
// departs by the disconnect advisory.
func TestMultiAccountServesTheMesh(t *testing.T) {
	t.Parallel()
	e := newMultiSecured(t)
	a := e.node(t, "a", "node")
	b := e.node(t, "b", "node")
	natstest.Eventually(t, 10*time.Second, func() bool {
		return len(a.Members().Members()) == 2 && len(b.Members().Members()) == 2
	}, "nodes do not see each other")
	addr := subjects.Address("echo/shared")

	alice := e.conn(t, "client")
	bob := e.conn(t, bobUser)
	if got, err := ingressRequest(t, alice, addr, "same-id", "alice-secret", nil); err != nil || got != "alice-secret" {
		t.Fatalf("alice: %q, %v", got, err)
	}
	// bob under alice's ID: his own handling, never alice's answer.
	if got, err := ingressRequest(t, bob, addr, "same-id", "bob", nil); err != nil || got != "bob" {
		t.Fatalf("bob under alice's ID: %q, %v", got, err)
	}
	// bob claiming to be alice: the server replaces the header.
	forged, _ := json.Marshal(map[string]string{"acc": aliceAccount, "user": "x"})
	if got, err := ingressRequest(t, bob, addr, "same-id", "bob-again", nats.Header{mesh.HeaderRequestInfo: []string{string(forged)}}); err != nil || got == "alice-secret" {
		t.Fatalf("bob with a forged Nats-Request-Info read alice's answer: %q, %v", got, err)
	}

	// The operator: control, ingress, state read through a node.
	op := e.conn(t, "operator")
	if _, err := op.Request(subjects.DefaultPrefix.Control("a", mesh.ControlPing), nil, 5*time.Second); err != nil {
		t.Fatalf("operator ping: %v", err)
	}
	if got, err := ingressRequest(t, op, addr, "op-1", "op", nil); err != nil || got != "op" {
		t.Fatalf("operator through the ingress: %q, %v", got, err)
	}
	q, _ := json.Marshal(mesh.StateQuery{Address: "kv/none"})
	r, err := op.Request(subjects.DefaultPrefix.Control("a", mesh.ControlState), q, 5*time.Second)
	if err != nil {
		t.Fatalf("operator state read: %v", err)
	}
	var sr mesh.StateReply
	if err := json.Unmarshal(r.Data, &sr); err != nil || sr.Found || sr.Error != "" {
		t.Fatalf("state read of an address without state: %s (%v)", r.Data, err)
	}

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

// No profile but the node's can make JetStream, or a node, publish into the
// mesh's buckets or under its prefix (issue 22 item 5): JetStream answers
// every API request on the reply subject its requester names, with the
// account's full rights, so a direct get or stream info whose reply is
// $KV.<bucket>.<key> would write its answer into the bucket (a registry
// entry overwritten, a hub's state made a corrupt record), and one whose
// reply is a moved notice or control subject would publish there. The
// operator and client profiles, in both modes, have no JetStream API: the
// server refuses each request as a permission violation, and the buckets
// keep only what the nodes wrote. The operator's state read through a node whose
// reply names a bucket or the prefix is dropped by the node. On the old
// operator profile (direct get and stream info allowed) the registry
// entry was overwritten.
func TestNoJetStreamReflection(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"single-account", "multi-account"} {
		t.Run(mode, func(t *testing.T) {
			e := newSecured(t)
			if mode == "multi-account" {
				e = newMultiSecured(t)
			}
			v := e.node(t, "victim", "node")
			p := subjects.DefaultPrefix
			reg, state := membership.BucketName(p), hubstate.BucketName(p)
			js, err := jetstream.New(v.nc)
			if err != nil {
				t.Fatal(err)
			}
			regKV, err := js.KeyValue(ctxT(t), reg)
			if err != nil {
				t.Fatal(err)
			}
			stateKV, err := js.KeyValue(ctxT(t), state)
			if err != nil {
				t.Fatal(err)
			}
			stateKey := subjects.EncodeToken("kv/victim")
			targets := []string{
				"$KV." + reg + ".victim",                            // the victim's registry entry
				"$KV." + state + "." + stateKey,                     // a hub's durable state
				p.Sub("moved.x"),                                    // under the prefix (moved notices, control)
				p.Control("victim", mesh.ControlDrain),              // a drain
				"$JS.API.STREAM.PURGE.KV_" + reg,                    // the JetStream API itself
				"$KV." + membership.BucketName(p) + ".other-victim", // a new registry entry
			}
			requests := []struct {
				what, subject string
				data          []byte
			}{
				{"direct get", "$JS.API.DIRECT.GET.KV_" + reg, []byte(`{"last_by_subj":"$KV.` + reg + `.victim"}`)},
				{"direct get by subject", "$JS.API.DIRECT.GET.KV_" + reg + ".$KV." + reg + ".victim", nil},
				{"stream info", "$JS.API.STREAM.INFO.KV_" + state, nil},
				{"message get", "$JS.API.STREAM.MSG.GET.KV_" + reg, []byte(`{"last_by_subj":"$KV.` + reg + `.victim"}`)},
				{"account info", "$JS.API.INFO", nil},
			}
			for _, profile := range []string{"client", "operator"} {
				for _, rq := range requests {
					for _, reply := range targets[:3] {
						t.Run(profile+"/"+rq.what+" answered onto "+reply, func(t *testing.T) {
							at := e.attacker(t, profile)
							if err := at.nc.PublishMsg(&nats.Msg{Subject: rq.subject, Reply: reply, Data: rq.data}); err != nil {
								t.Fatal(err)
							}
							at.refused(t, rq.subject)
						})
					}
				}
			}
			// The operator's state read goes through a node, which answers
			// only on a reply it may answer any control request on.
			at := e.attacker(t, "operator")
			q, _ := json.Marshal(mesh.StateQuery{Address: "kv/victim"})
			for _, reply := range targets {
				if err := at.nc.PublishMsg(&nats.Msg{Subject: p.Control("victim", mesh.ControlState), Reply: reply, Data: q}); err != nil {
					t.Fatal(err)
				}
			}
			// A read with an inbox reply, sent after them, is answered: the
			// node has handled the others by then (one subscription, in
			// order).
			r, err := at.nc.Request(p.Control("victim", mesh.ControlState), q, 5*time.Second)
			if err != nil {
				t.Fatalf("state read: %v", err)
			}
			var sr mesh.StateReply
			if err := json.Unmarshal(r.Data, &sr); err != nil || sr.Found {
				t.Fatalf("state read: %s, %v", r.Data, err)
			}

			after, err := regKV.Get(ctxT(t), "victim")
			if err != nil {
				t.Fatal(err)
			}
			var mb membership.Member
			if err := json.Unmarshal(after.Value(), &mb); err != nil || mb.Node != v.ID() {
				t.Fatalf("the victim's registry entry is not its own: %s (%v)", after.Value(), err)
			}
			if _, err := stateKV.Get(ctxT(t), stateKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("something was written into the state bucket: %v", err)
			}
			if _, err := regKV.Get(ctxT(t), "other-victim"); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("something was written into the registry: %v", err)
			}
			if len(v.drains) != 0 {
				t.Fatal("the victim was asked to drain")
			}
			if !v.Members().Alive(v.ID()) {
				t.Fatal("the victim departed")
			}
		})
	}
}

// The production profile's text parses, and bad input is refused.
func TestMultiAccountConf(t *testing.T) {
	t.Parallel()
	m := profiles.Mesh{Prefix: "acme.mesh", Account: "APP"}
	ok := []profiles.User{{User: "n", Password: "pw", Profile: profiles.Node(m)}}
	tenant := func(acc string) profiles.Tenant {
		return profiles.Tenant{Account: acc, Users: []profiles.User{{User: "c-" + acc, Password: "pw", Profile: profiles.Client(m)}}}
	}
	conf, err := profiles.MultiAccountConf(m, ok, []profiles.Tenant{tenant("T1"), tenant("T2")})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`exports: [{service: "acme.mesh.in.>", accounts: [T1, T2], response_type: singleton}]`, `imports: [{service: {account: APP, subject: "acme.mesh.in.>"}, share: true}]`} {
		if !strings.Contains(conf, want) {
			t.Errorf("conf lacks %s:\n%s", want, conf)
		}
	}
	s := natstest.RunServer(t, natstest.WithConfig(conf))
	nc := natstest.Connect(t, s, nats.UserInfo("c-T1", "pw"))
	if _, err := nc.Request("acme.mesh.in.x.y", nil, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) { // no responders comes at once; the bound is only for a loaded machine
		t.Fatalf("a request nobody serves: %v, want no responders", err)
	}
	for name, c := range map[string]struct {
		mesh    []profiles.User
		tenants []profiles.Tenant
	}{
		"no mesh user":        {nil, []profiles.Tenant{tenant("T1")}},
		"no tenant":           {ok, nil},
		"tenant is the mesh":  {ok, []profiles.Tenant{tenant("APP")}},
		"tenant is SYS":       {ok, []profiles.Tenant{tenant("SYS")}},
		"tenant twice":        {ok, []profiles.Tenant{tenant("T1"), tenant("T1")}},
		"bad tenant name":     {ok, []profiles.Tenant{tenant("T 1")}},
		"tenant without user": {ok, []profiles.Tenant{{Account: "T1"}}},
		"bad user":            {[]profiles.User{{User: "u"}}, []profiles.Tenant{tenant("T1")}},
	} {
		if _, err := profiles.MultiAccountConf(m, c.mesh, c.tenants); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A member of the mesh account (the operator) or a single-account caller
// cannot pass for a tenant: the server refuses a _R_ reply a client names
// (a reserved reply), so a request with a forged Nats-Request-Info never
// arrives with the reply the node believes the header on. This is why
// meshd's default --caller-identity request-info is right in both modes.
func TestForgedServiceReplyRefused(t *testing.T) {
	t.Parallel()
	forged, _ := json.Marshal(map[string]string{"acc": aliceAccount, "user": "alice"})
	for _, mode := range []string{"single-account", "multi-account"} {
		t.Run(mode, func(t *testing.T) {
			e := newSecured(t)
			if mode == "multi-account" {
				e = newMultiSecured(t)
			}
			for _, profile := range []string{"client", "operator"} {
				at := e.attacker(t, profile)
				m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("echo/x", ""), Reply: "_R_.forged.x", Header: nats.Header{}}
				m.Header.Set(mesh.HeaderRequestInfo, string(forged))
				m.Header.Set(hub.HeaderID, "victim-id")
				if err := at.nc.PublishMsg(m); err != nil {
					t.Fatal(err)
				}
				at.refused(t, "_R_.forged.x")
			}
		})
	}
}

// The nodes' micro service answers its discovery verbs ($SRV.PING, INFO,
// STATS) only on a safe reply subject, as every control endpoint: nats.go's
// micro.AddService answered them on any reply with the node's
// permissions, so an operator's $SRV.PING with the reply
// $KV.<state bucket>.<key> replaced a hub's durable state with the ping's
// JSON (and the same onto a registry entry or under the prefix). Fails on
// the old code: the state bucket held the JSON.
func TestDiscoveryReflectionRefused(t *testing.T) {
	t.Parallel()
	e := newMultiSecured(t)
	v := e.node(t, "victim", "node")
	p := subjects.DefaultPrefix
	reg, state := membership.BucketName(p), hubstate.BucketName(p)
	stateKey := subjects.EncodeToken("kv/victim")
	at := e.attacker(t, "operator")
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		for _, subj := range []string{"$SRV." + verb, "$SRV." + verb + "." + mesh.ServiceName} {
			for _, reply := range []string{"$KV." + state + "." + stateKey, "$KV." + reg + ".other-victim", p.Control("victim", mesh.ControlDrain)} {
				if err := at.nc.PublishRequest(subj, reply, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// Answered on an inbox, after the others (same subjects, in order).
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		for _, subj := range []string{"$SRV." + verb, "$SRV." + verb + "." + mesh.ServiceName} {
			if _, err := at.nc.Request(subj, nil, 5*time.Second); err != nil {
				t.Fatalf("%s on an inbox: %v", subj, err)
			}
		}
	}
	js, err := jetstream.New(v.nc)
	if err != nil {
		t.Fatal(err)
	}
	for bucket, key := range map[string]string{state: stateKey, reg: "other-victim"} {
		kv, err := js.KeyValue(ctxT(t), bucket)
		if err != nil {
			t.Fatal(err)
		}
		if e, err := kv.Get(ctxT(t), key); err == nil {
			t.Errorf("a discovery answer was written into %s: %.80q", bucket, e.Value())
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("%s: %v", bucket, err)
		}
	}
	if len(v.drains) != 0 {
		t.Fatal("the victim was asked to drain")
	}
	if got := v.Status().IngressRefused; got < 18 {
		t.Errorf("IngressRefused = %d, want the 18 reflecting requests counted", got)
	}
}
