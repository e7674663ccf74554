package subjects

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// TestIngressSubjectsOnRealServer subscribes once per awkward address on its
// ingress subject (stream wildcarded) and publishes one message to each: each
// message reaches only its own subscriber and the connection reports no
// protocol error (natstest.Connect fails the test on any async error).
func TestIngressSubjectsOnRealServer(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	p := DefaultPrefix
	var mu sync.Mutex
	got := map[string][]string{} // address -> payloads received
	for _, a := range awkward {
		filter := strings.TrimSuffix(p.Ingress(Address(a), ""), "=") + "*"
		if _, err := nc.Subscribe(filter, func(m *nats.Msg) {
			mu.Lock()
			got[a] = append(got[a], string(m.Data))
			mu.Unlock()
		}); err != nil {
			t.Fatalf("subscribe %q: %v", filter, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, a := range awkward {
		stream := Stream(awkward[(i+1)%len(awkward)])
		if err := nc.Publish(p.Ingress(Address(a), stream), []byte(a)); err != nil {
			t.Fatalf("publish to %q: %v", a, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range got {
			n += len(v)
		}
		return n >= len(awkward)
	}, "all messages delivered")
	mu.Lock()
	defer mu.Unlock()
	for _, a := range awkward {
		if len(got[a]) != 1 || got[a][0] != a {
			t.Errorf("subscriber of %q received %q, want exactly its own message", a, got[a])
		}
	}
	if err := nc.LastError(); err != nil {
		t.Errorf("connection error: %v", err)
	}
	if nc.Status() != nats.CONNECTED {
		t.Errorf("connection status %v", nc.Status())
	}
}
