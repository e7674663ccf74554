package mesh

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// TestControlService: the node is a NATS micro service (discoverable as
// `nats micro ls` does it) with JSON control endpoints, and a drain request
// reaches OnDrainRequest.
func TestControlService(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	drained := make(chan struct{})
	n, err := NewNode(NodeConfig{Conn: nc, Name: "ctl", OnDrainRequest: func() { close(drained) }})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	_ = n.Register("rec", newRecorder().factory)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	cli := natstest.Connect(t, s)
	subj, _ := micro.ControlSubject(micro.InfoVerb, ServiceName, "")
	m, err := cli.Request(subj, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != ServiceName || info.Metadata[MetaNode] != n.ID().String() || info.Metadata[MetaPrefix] != "mesh.v1" || len(info.Endpoints) != 6 {
		t.Errorf("micro info %+v", info)
	}
	m, err = cli.Request(n.ControlSubject(ControlPing), nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st NodeStatus
	if err := json.Unmarshal(m.Data, &st); err != nil || st.Node != n.ID().String() || len(st.Kinds) != 1 || st.Kinds[0] != "rec" || st.Version != Version {
		t.Errorf("ping: %+v %v", st, err)
	}
	if _, err := n.Deliver(t.Context(), Delivery{To: "rec/a"}); err != nil {
		t.Fatal(err)
	}
	m, err = cli.Request(n.ControlSubject(ControlHubs), nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var hr HubsReport
	if err := json.Unmarshal(m.Data, &hr); err != nil || hr.Activations != 1 || len(hr.Addresses) != 1 || hr.Addresses[0] != "rec/a" {
		t.Errorf("hubs: %+v %v", hr, err)
	}
	// The micro protocol's other verbs, by name and by the service's ID:
	// one identity, the endpoints' counts.
	for _, c := range []struct {
		verb micro.Verb
		id   string
	}{{micro.PingVerb, ""}, {micro.PingVerb, info.ID}, {micro.StatsVerb, info.ID}, {micro.InfoVerb, info.ID}} {
		subj, _ := micro.ControlSubject(c.verb, ServiceName, c.id)
		m, err := cli.Request(subj, nil, 2*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		var r struct {
			micro.ServiceIdentity
			Type      string                `json:"type"`
			Endpoints []micro.EndpointStats `json:"endpoints"`
		}
		if err := json.Unmarshal(m.Data, &r); err != nil || r.ID != info.ID || r.Name != ServiceName || r.Metadata[MetaNode] != n.ID().String() {
			t.Errorf("%s: %s (%v)", subj, m.Data, err)
		}
		want := map[micro.Verb]string{micro.PingVerb: micro.PingResponseType, micro.StatsVerb: micro.StatsResponseType, micro.InfoVerb: micro.InfoResponseType}[c.verb]
		if r.Type != want {
			t.Errorf("%s: type %q, want %q", subj, r.Type, want)
		}
		if c.verb == micro.StatsVerb {
			counted := false
			for _, e := range r.Endpoints {
				counted = counted || e.Name == ControlPing && e.Subject == n.ControlSubject(ControlPing) && e.NumRequests == 1
			}
			if !counted {
				t.Errorf("stats: the ping endpoint does not count one request: %s", m.Data)
			}
		}
	}
	m, err = cli.Request(n.ControlSubject(ControlDrain), nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var dr DrainReply
	if err := json.Unmarshal(m.Data, &dr); err != nil || !dr.Draining {
		t.Errorf("drain: %+v %v", dr, err)
	}
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("OnDrainRequest not called")
	}
}
