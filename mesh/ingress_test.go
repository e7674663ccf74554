package mesh

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestIngressPlainClient: a plain nats.go client — not the mesh library —
// delivers through the ingress with only the documented headers and reads
// the verdict from the reply headers; a client awaiting each answer keeps
// its order.
func TestIngressPlainClient(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	rec.fn = func(_ context.Context, d *hub.Delivery) error {
		return d.Respond(append([]byte("echo:"), d.Payload...))
	}
	nc := natstest.Connect(t, s)
	send := func(addr, stream string, hdr map[string]string, data string) *nats.Msg {
		t.Helper()
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress(subjects.Address(addr), subjects.Stream(stream)))
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		m.Data = []byte(data)
		r, err := nc.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatalf("ingress request: %v", err)
		}
		return r
	}
	for i := 0; i < 20; i++ {
		r := send("rec/in", "s", map[string]string{"Mesh-Id": fmt.Sprintf("in-%d", i), "Mesh-Type": "t"}, fmt.Sprint(i))
		if r.Header.Get("Mesh-Verdict") != "Accepted" || r.Header.Get("Mesh-Node") != n.ID().String() || r.Header.Get("Mesh-Id") != fmt.Sprintf("in-%d", i) {
			t.Fatalf("reply headers %v", r.Header)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 20 }, "handled")
	rec.mu.Lock()
	for i, d := range rec.handled["rec/in"] {
		if string(d.Payload) != fmt.Sprint(i) || d.Type != "t" {
			t.Errorf("ingress order: #%d is %q", i, d.Payload)
		}
	}
	rec.mu.Unlock()

	// Without Mesh-Id: the node generates one and returns it.
	if r := send("rec/in", "", nil, "x"); r.Header.Get("Mesh-Id") == "" || r.Header.Get("Mesh-Verdict") != "Accepted" {
		t.Errorf("no-id reply %v", r.Header)
	}
	// A request: the response is the reply payload.
	r := send("rec/in", "", map[string]string{"Mesh-Expect-Response": "true"}, "ping")
	if string(r.Data) != "echo:ping" || r.Header.Get("Mesh-Verdict") != "Accepted" {
		t.Errorf("request through ingress: %q %v", r.Data, r.Header)
	}
	// Failures arrive as verdict headers.
	r = send("nokind/x", "", nil, "")
	if _, err := verdict.Decode(r.Header); !errors.Is(err, verdict.ErrUnknownKind) || r.Header.Get("Mesh-Verdict") != "Failed" || r.Header.Get("Mesh-Reason") != "unknown-kind" {
		t.Errorf("unknown kind via ingress: %v", r.Header)
	}
	// A malformed ingress subject.
	m, err := nc.Request("mesh.v1.in.nokind.=", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verdict.Decode(m.Header); !errors.Is(err, verdict.ErrInvalidAddress) {
		t.Errorf("bad ingress subject: %v", m.Header)
	}
}
