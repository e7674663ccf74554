package mesh

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestGeneratedIDsUnpredictable (issue 22): IDs the mesh generates for
// deliveries without one are 128 random bits (22 characters of base64url),
// not a fixed prefix plus a counter: consecutive IDs share no prefix beyond
// chance and never repeat.
func TestGeneratedIDsUnpredictable(t *testing.T) {
	t.Parallel()
	var src idSource
	seen := map[string]bool{}
	prev := src.next()
	longShared := 0
	for range 20000 {
		id := src.next()
		b, err := base64.RawURLEncoding.DecodeString(id)
		if err != nil || len(b) != 16 || len(id) != 22 {
			t.Fatalf("id %q: %d bytes, %v", id, len(b), err)
		}
		if err := hub.ValidateID(id); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("id %q repeated", id)
		}
		seen[id] = true
		n := 0
		for n < len(id) && id[n] == prev[n] {
			n++
		}
		if n >= 4 { // chance: 20000 / 64^4 ≈ 0.001
			longShared++
		}
		prev = id
	}
	if longShared > 2 {
		t.Fatalf("%d of 20000 consecutive IDs share a 4-character prefix: a generator with a fixed prefix", longShared)
	}
}

// ingressCaller is an outside client of the ingress under its own inbox
// prefix (single account: CallerFromInbox).
func ingressCaller(t *testing.T, url, inbox string) *nats.Conn {
	t.Helper()
	return natstest.ConnectURL(t, url, nats.CustomInboxPrefix(inbox))
}

func ingressRequest(t *testing.T, nc *nats.Conn, to subjects.Address, id string, payload string, request bool) (*nats.Msg, error) {
	t.Helper()
	m := nats.NewMsg(subjects.DefaultPrefix.Ingress(to, ""))
	m.Header.Set(hub.HeaderID, id)
	if request {
		m.Header.Set(hub.HeaderExpectResponse, "true")
	}
	m.Data = []byte(payload)
	return nc.RequestMsg(m, 10*time.Second)
}

// TestDedupePerCaller (issue 22, attack 1): a caller that sends first
// under another caller's delivery ID — before the victim's delivery, or
// replaying it afterwards — gets its own handling: the victim's handler
// runs with the victim's payload, the victim gets its own response, and
// the attacker never gets the victim's kept response. Within one caller a
// re-send under the same ID is still deduped (answered from the kept
// outcome, handled once). Plain deliveries and requests, in both orders,
// in the single-account mode (caller = inbox prefix) and with tenants in
// their own accounts (caller = the server-stamped Nats-Request-Info).
func TestDedupePerCaller(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"inbox", "accounts"} {
		t.Run(mode, func(t *testing.T) {
			var url string
			cfg := NodeConfig{Name: "a"}
			var victim, attacker *nats.Conn
			switch mode {
			case "inbox":
				s := natstest.RunServer(t)
				url = s.ClientURL()
				cfg.Conn = natstest.Connect(t, s)
				victim, attacker = ingressCaller(t, url, "_INBOX.alice"), ingressCaller(t, url, "_INBOX.mallory")
			case "accounts":
				s := natstest.RunConfig(t, fmt.Sprintf(`
jetstream { store_dir: %q }
accounts {
  MESH: {
    jetstream: enabled
    users: [{user: node, password: node}]
    exports: [{service: "mesh.v1.in.>", response_type: singleton, allow_trace: false}]
  }
  ALICE: { users: [{user: alice, password: alice}], imports: [{service: {account: MESH, subject: "mesh.v1.in.>"}, share: true}] }
  MALLORY: { users: [{user: mallory, password: mallory}], imports: [{service: {account: MESH, subject: "mesh.v1.in.>"}, share: true}] }
}`, t.TempDir()))
				url = s.ClientURL()
				cfg.Conn = natstest.ConnectURL(t, url, nats.UserInfo("node", "node"))
				cfg.CallerIdentity = CallerFromRequestInfo
				// The same inbox prefix for both: only the accounts tell
				// them apart.
				victim = natstest.ConnectURL(t, url, nats.UserInfo("alice", "alice"))
				attacker = natstest.ConnectURL(t, url, nats.UserInfo("mallory", "mallory"))
			}
			n, err := NewNode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			handled := map[string][]string{} // ID -> payloads handled
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
			for i, tc := range []struct {
				request, attackerFirst bool
			}{{true, true}, {true, false}, {false, true}, {false, false}} {
				id := fmt.Sprintf("%s-victim-id-%d", mode, i)
				to := subjects.Address(fmt.Sprintf("bank/%d", i))
				send := func(nc *nats.Conn, who string) *nats.Msg {
					r, err := ingressRequest(t, nc, to, id, who, tc.request)
					if err != nil {
						t.Fatalf("%s: %v", who, err)
					}
					if v := r.Header.Get(verdict.HeaderVerdict); v != "Accepted" {
						t.Fatalf("%s: %s %s %s", who, v, r.Header.Get(verdict.HeaderReason), r.Header.Get(verdict.HeaderMessage))
					}
					return r
				}
				var vr, ar *nats.Msg
				if tc.attackerFirst {
					ar, vr = send(attacker, "mallory"), send(victim, "alice")
				} else {
					vr, ar = send(victim, "alice"), send(attacker, "mallory")
				}
				again := send(victim, "alice") // the victim's own re-send: deduped
				natstest.Eventually(t, 5*time.Second, func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(handled[id]) >= 2
				}, "both callers' deliveries handled")
				mu.Lock()
				got := append([]string(nil), handled[id]...)
				mu.Unlock()
				if strings.Count(strings.Join(got, ","), "alice") != 1 || strings.Count(strings.Join(got, ","), "mallory") != 1 {
					t.Errorf("%+v: handled %v, want alice's and mallory's once each", tc, got)
				}
				if tc.request {
					if !bytes.Equal(vr.Data, []byte("secret for alice")) || !bytes.Equal(again.Data, vr.Data) {
						t.Errorf("%+v: the victim got %q, then %q on its re-send", tc, vr.Data, again.Data)
					}
					if bytes.Contains(ar.Data, []byte("alice")) {
						t.Errorf("%+v: the attacker read the victim's response %q", tc, ar.Data)
					}
				}
			}
		})
	}
}

// TestInboxCaller: the single-account identity of each reply shape.
func TestInboxCaller(t *testing.T) {
	t.Parallel()
	for reply, want := range map[string]string{
		"":                                "anon",
		"_INBOX.conn123.7":                "inbox:_INBOX",
		"_INBOX.alice.conn123.7":          "inbox:_INBOX.alice",
		"_INBOX.old":                      "inbox:_INBOX",
		"solo":                            "inbox:solo",
		"_INBOX.ålice.c.1":                "inbox:_INBOX.=C3=A5lice",
		"_INBOX.a=b.c.1":                  "inbox:_INBOX.a=3Db",
		strings.Repeat("x", 900) + ".c.1": "inbox:" + strings.Repeat("x", maxInboxCaller-len("inbox:")),
	} {
		got := inboxCaller(reply)
		if got != want {
			t.Errorf("inboxCaller(%.40q) = %.60q, want %.60q", reply, got, want)
		}
		if err := hub.ValidateCaller(got); err != nil {
			t.Errorf("inboxCaller(%.40q): %v", reply, err)
		}
	}
}

// TestRequestInfoTwiceRefused: a request that carries Nats-Request-Info
// twice (one smuggled past the server's replacement of the client's own,
// e.g. behind a bare-LF header line) is refused bad-request in both modes:
// the node never picks one of two identities.
func TestRequestInfoTwiceRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range []CallerIdentity{CallerFromInbox, CallerFromRequestInfo} {
		s := natstest.RunServer(t)
		n, err := NewNode(NodeConfig{Conn: natstest.Connect(t, s), Name: "a", CallerIdentity: mode})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Register("rec", newRecorder().factory); err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("rec/x", ""))
		m.Header.Add(HeaderRequestInfo, `{"acc":"ALICE","user":"alice"}`)
		m.Header.Add(HeaderRequestInfo, `{"acc":"MALLORY","user":"mallory"}`)
		r, err := natstest.Connect(t, s).RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, verr := verdict.Decode(r.Header); verdict.ReasonOf(verr) != verdict.ReasonBadRequest {
			t.Errorf("mode %d: two Nats-Request-Info values: %v, want bad-request", mode, verr)
		}
	}
}

// TestRequestInfoBelievedOnServiceReplies: in CallerFromRequestInfo mode
// the header names the caller only on a request whose reply the server made
// for a service import (_R_.…); a member of the mesh account that writes
// the header on its own request (its reply is its own inbox) is known by
// its inbox prefix, not by the account it claims.
func TestRequestInfoBelievedOnServiceReplies(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: NodeConfig{CallerIdentity: CallerFromRequestInfo}}
	for _, tc := range []struct{ reply, want string }{
		{"_R_.abc.def", "acc:ALICE:alice"},
		{"_INBOX.op.conn.1", "inbox:_INBOX.op"},
		{"", "anon"},
	} {
		m := nats.NewMsg("x")
		m.Reply = tc.reply
		m.Header.Set(HeaderRequestInfo, `{"acc":"ALICE","user":"alice"}`)
		if got, ok := n.callerOf(m); !ok || got != tc.want {
			t.Errorf("reply %q: caller %q (%v), want %q", tc.reply, got, ok, tc.want)
		}
	}
}
