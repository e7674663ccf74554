package syncstream_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestIngressRefusesStreamProtocol (issue 22, attack 3): the sync-stream
// protocol is node to node only. Through the ingress, an outside client can
// neither register a subscriber on someone else's stream (natsmesh.subscribe,
// natsmesh.unsubscribe) nor feed a subscriber a forged frame (natsmesh.frame,
// natsmesh.frames, or any delivery to an internal "_" kind): each is refused
// bad-request, nothing is applied, and the real updates keep arriving.
func TestIngressRefusesStreamProtocol(t *testing.T) {
	t.Parallel()
	if want := []string{syncstream.TypeSubscribe, syncstream.TypeUnsubscribe, syncstream.TypeFrame, syncstream.TypeFrames}; !slices.Equal(mesh.NodeOnlyTypes, want) {
		t.Fatalf("mesh.NodeOnlyTypes %v, the protocol's types %v", mesh.NodeOnlyTypes, want)
	}
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", true)
	sub, _ := startNode(t, s, "sub", false)
	set(t, owner, "kv/x", "a=1")
	m := &mirror{t: t}
	ss, err := syncstream.Subscribe(context.Background(), sub, "kv/x", "", m.apply)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	attacker := natstest.Connect(t, s)
	forged, _ := json.Marshal(syncstream.Frame{Epoch: 1 << 62, Version: 1 << 40, Data: []byte(`{"set":{"forged":"yes"}}`)})
	subscribeBody, _ := json.Marshal(map[string]any{"subscriber": "_sub/attacker/1", "stream": "", "attempt": "x", "format": 1})
	for _, tc := range []struct {
		to      subjects.Address
		typ     string
		payload []byte
	}{
		{"kv/x", syncstream.TypeSubscribe, subscribeBody},
		{"kv/x", syncstream.TypeUnsubscribe, subscribeBody},
		{"_sub/sub/anything", syncstream.TypeFrame, forged},
		{"_sub/sub/anything", syncstream.TypeFrames, []byte{1, 0, 1, 1, 0, 0}},
		{"_sub/sub/anything", "", forged},
		{"kv/x", syncstream.TypeFrame, forged},
	} {
		msg := nats.NewMsg(subjects.DefaultPrefix.Ingress(tc.to, ""))
		msg.Header.Set(hub.HeaderType, tc.typ)
		msg.Header.Set(hub.HeaderExpectResponse, "true")
		msg.Data = tc.payload
		r, err := attacker.RequestMsg(msg, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, verr := verdict.Decode(r.Header)
		if verdict.ReasonOf(verr) != verdict.ReasonBadRequest {
			t.Errorf("ingress %s type %q: %v, want bad-request", tc.to, tc.typ, verr)
		}
	}
	set(t, owner, "kv/x", "b=2")
	natstest.Eventually(t, 5*time.Second, func() bool { v, _ := m.get("b"); return v == "2" }, "the real update not applied")
	if _, ok := m.get("forged"); ok {
		t.Fatal("a forged frame was applied")
	}
	if st := sub.Status(); st.IngressNodeOnly == 0 && owner.Status().IngressNodeOnly == 0 {
		t.Fatal("no refusal counted")
	}
}
