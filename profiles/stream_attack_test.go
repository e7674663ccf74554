package profiles_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestClientProfileStreamProtocolRefused (issue 22, Why 3): a caller with
// the client or operator profile sends the sync-stream protocol's delivery
// types (subscribe, unsubscribe, frame, frames) and a delivery to an
// internal "_" kind through the ingress, as a request: each is answered
// bad-request, the node counts it, and no hub handles anything — so no
// subscriber is registered on another's stream, no frame reaches a
// subscriber, and no subscribe reply tells an epoch or version. (It pins
// a6dcd69 against the profiles' real server; that commit's own test used
// an unrestricted connection.)
func TestClientProfileStreamProtocolRefused(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	v := e.node(t, "victim", "node")
	p := subjects.DefaultPrefix
	subscribeBody, _ := json.Marshal(map[string]any{"subscriber": "_sub/attacker/1", "stream": "", "attempt": "x", "format": 1})
	frame, _ := json.Marshal(map[string]any{"epoch": uint64(1) << 62, "version": 1, "data": "forged"})
	for _, profile := range []string{"client", "operator"} {
		at := e.conn(t, profile)
		for _, tc := range []struct {
			to      subjects.Address
			typ     string
			payload []byte
		}{
			{"echo/owner", mesh.NodeOnlyTypes[0], subscribeBody},
			{"echo/owner", mesh.NodeOnlyTypes[1], subscribeBody},
			{"_sub/victim/1", mesh.NodeOnlyTypes[2], frame},
			{"_sub/victim/1", mesh.NodeOnlyTypes[3], []byte{1, 0, 1, 1, 0, 0}},
			{"_sub/victim/1", "", frame},
			{"echo/owner", mesh.NodeOnlyTypes[2], frame},
		} {
			before := v.Status().IngressNodeOnly
			m := &nats.Msg{Subject: p.Ingress(tc.to, ""), Header: nats.Header{}, Data: tc.payload}
			m.Header.Set(hub.HeaderType, tc.typ)
			m.Header.Set(hub.HeaderExpectResponse, "true")
			r, err := at.RequestMsg(m, 10*time.Second)
			if err != nil {
				t.Fatalf("%s: %s type %q: %v", profile, tc.to, tc.typ, err)
			}
			if _, verr := verdict.Decode(r.Header); verdict.ReasonOf(verr) != verdict.ReasonBadRequest || len(r.Data) != 0 {
				t.Errorf("%s: %s type %q: %v (payload %q), want bad-request and nothing else", profile, tc.to, tc.typ, verr, r.Data)
			}
			if after := v.Status().IngressNodeOnly; after != before+1 {
				t.Errorf("%s: %s type %q: IngressNodeOnly %d -> %d", profile, tc.to, tc.typ, before, after)
			}
		}
	}
	if st := v.Status().Host; st.Accepted != 0 || st.Handled != 0 {
		t.Fatalf("the victim's host accepted %d, handled %d deliveries", st.Accepted, st.Handled)
	}
}
