package profiles_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestIngressFloodFromProfiles (issue 22, Why 5): a caller with the client
// or the operator profile publishes 6 000 fire-and-forget deliveries to a
// kind no node hosts, each of which waits for placement (the default
// second), on a node with the default 4 096 ingress slots; another client
// user's deliveries meanwhile still come back Accepted. Before, the flood
// held every slot and the victim's were answered Ignored (inbox-full).
func TestIngressFloodFromProfiles(t *testing.T) {
	t.Parallel()
	e := newSecured(t)
	v := e.node(t, "victim", "node")
	p := subjects.DefaultPrefix
	victim := e.conn(t, "client")
	for _, profile := range []string{"client", "operator"} {
		t.Run(profile, func(t *testing.T) {
			at := e.attacker(t, profile)
			const flood = 6000
			before := v.Status().Ingress
			for i := range flood {
				if err := at.nc.Publish(p.Ingress(subjects.Address(fmt.Sprintf("nope/%s-%d", profile, i)), ""), nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := at.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			natstest.Eventually(t, 10*time.Second, func() bool { return v.Status().Ingress >= before+flood }, "flood not taken")
			for i := range 10 {
				m := &nats.Msg{Subject: p.Ingress("echo/victim", ""), Header: nats.Header{}, Data: []byte("hi")}
				m.Header.Set(hub.HeaderID, fmt.Sprintf("victim-%s-%d", profile, i))
				r, err := victim.RequestMsg(m, 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := verdict.Decode(r.Header); err != nil {
					t.Fatalf("victim's delivery %d during a flood by the %s profile: %v", i, profile, err)
				}
			}
			at.mu.Lock()
			defer at.mu.Unlock()
			if len(at.errs) != 0 {
				t.Fatalf("the flood met permission errors: %v", at.errs)
			}
		})
	}
}
