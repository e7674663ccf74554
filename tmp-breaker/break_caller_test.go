package mesh

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// rawHPUB publishes one message with a hand-written header block over a raw
// TCP connection (the NATS protocol), as user/pass.
func rawHPUB(t *testing.T, clientURL, user, pass, subj, reply, hdr, payload string) {
	t.Helper()
	u, _ := url.Parse(clientURL)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1,\"user\":%q,\"pass\":%q}\r\n", user, pass)
	fmt.Fprintf(c, "HPUB %s %s %d %d\r\n%s%s\r\nPING\r\n", subj, reply, len(hdr), len(hdr)+len(payload), hdr, payload)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("raw conn: %v", err)
		}
		if strings.HasPrefix(l, "PONG") {
			return
		}
		if strings.HasPrefix(l, "-ERR") {
			t.Fatalf("raw conn: %s", l)
		}
	}
}

// TestBreakRequestInfoForged: in CallerFromRequestInfo mode, can a client
// other than alice be taken for alice (acc ALICE)?
//   - "smuggle": mallory, crossing the service import, writes a
//     Nats-Request-Info line preceded by a bare LF: the server's
//     removeHeaderIfPresent looks for CRLF-preceded keys only, nats.go's
//     parser splits on LF, so the node reads two values and Get returns the
//     forged first one.
//   - "mesh-account": a user of the mesh account itself (no import crossed,
//     nothing stamped) writes the header plainly.
func TestBreakRequestInfoForged(t *testing.T) {
	s := natstest.RunConfig(t, fmt.Sprintf(`
jetstream { store_dir: %q }
accounts {
  MESH: {
    jetstream: enabled
    users: [{user: node, password: node}, {user: op, password: op}]
    exports: [{service: "mesh.v1.in.>", response_type: singleton, allow_trace: false}]
  }
  ALICE: { users: [{user: alice, password: alice}], imports: [{service: {account: MESH, subject: "mesh.v1.in.>"}, share: true}] }
  MALLORY: { users: [{user: mallory, password: mallory}], imports: [{service: {account: MESH, subject: "mesh.v1.in.>"}, share: true}] }
}`, t.TempDir()))
	curl := s.ClientURL()
	n, err := NewNode(NodeConfig{Name: "a", Conn: natstest.ConnectURL(t, curl, nats.UserInfo("node", "node")), CallerIdentity: CallerFromRequestInfo})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string][]string{}
	callers := map[string][]string{}
	if err := n.Register("bank", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			mu.Lock()
			handled[d.ID] = append(handled[d.ID], string(d.Payload))
			mu.Unlock()
			return d.Respond([]byte("secret for " + string(d.Payload)))
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	_ = callers
	alice := natstest.ConnectURL(t, curl, nats.UserInfo("alice", "alice"))

	forged := `{"acc":"ALICE","user":"alice"}`
	for _, tc := range []struct {
		name, user, hdrFmt string
	}{
		{"smuggle", "mallory", "NATS/1.0\r\nX-Pad: 1\nNats-Request-Info: %s\r\nMesh-Id: %s\r\nMesh-Expect-Response: true\r\n\r\n"},
		{"control-crlf", "mallory", "NATS/1.0\r\nX-Pad: 1\r\nNats-Request-Info: %s\r\nMesh-Id: %s\r\nMesh-Expect-Response: true\r\n\r\n"},
		{"mesh-account", "op", "NATS/1.0\r\nNats-Request-Info: %s\r\nMesh-Id: %s\r\nMesh-Expect-Response: true\r\n\r\n"},
	} {
		for _, attackerFirst := range []bool{false, true} {
			name := fmt.Sprintf("%s/attackerFirst=%v", tc.name, attackerFirst)
			t.Run(name, func(t *testing.T) {
				id := strings.ReplaceAll(name, "/", "-")
				to := subjects.Address("bank/" + strings.ReplaceAll(id, "=", "-"))
				// the attacker's response listener, in its own account
				lis := natstest.ConnectURL(t, curl, nats.UserInfo(tc.user, tc.user))
				reply := "_INBOX.raw." + tc.name
				sub, err := lis.SubscribeSync(reply)
				if err != nil {
					t.Fatal(err)
				}
				lis.Flush()
				attack := func() *nats.Msg {
					rawHPUB(t, curl, tc.user, tc.user, subjects.DefaultPrefix.Ingress(to, ""), reply,
						fmt.Sprintf(tc.hdrFmt, forged, id), tc.user)
					m, err := sub.NextMsg(10 * time.Second)
					if err != nil {
						t.Fatalf("attacker's answer: %v", err)
					}
					return m
				}
				var am, vm *nats.Msg
				if attackerFirst {
					am = attack()
					vm, err = ingressRequest(t, alice, to, id, "alice", true)
				} else {
					vm, err = ingressRequest(t, alice, to, id, "alice", true)
					if err != nil {
						t.Fatal(err)
					}
					am = attack()
				}
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(200 * time.Millisecond)
				mu.Lock()
				h := append([]string(nil), handled[id]...)
				mu.Unlock()
				t.Logf("victim got %q (%s), attacker got %q (%s); handled %v", vm.Data, vm.Header.Get("Mesh-Verdict"), am.Data, am.Header.Get("Mesh-Verdict"), h)
				if strings.Contains(string(am.Data), "alice") {
					t.Errorf("BROKEN: attacker %s read alice's kept response %q", tc.user, am.Data)
				}
				if string(vm.Data) != "secret for alice" {
					t.Errorf("BROKEN: alice got %q, not her own response (her delivery deduped against the attacker's)", vm.Data)
				}
			})
		}
	}
}
