package integration

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

// ingressCase is one raw ingress message and the verdict and reason its
// reply must carry.
type ingressCase struct {
	name            string
	subject         string
	header          map[string]string
	payload         []byte
	verdict, reason string
	reply           *nats.Msg
	err             error
	took            time.Duration
}

func (c *ingressCase) send(nc *nats.Conn, timeout time.Duration) {
	m := nats.NewMsg(c.subject)
	for k, v := range c.header {
		m.Header.Set(k, v)
	}
	m.Data = c.payload
	start := time.Now()
	c.reply, c.err = nc.RequestMsg(m, timeout)
	c.took = time.Since(start)
}

func (c *ingressCase) check(t *testing.T) {
	t.Helper()
	if c.err != nil {
		t.Errorf("%s: no reply: %v after %v", c.name, c.err, c.took)
		return
	}
	v, r := c.reply.Header.Get("Mesh-Verdict"), c.reply.Header.Get("Mesh-Reason")
	t.Logf("%-26s %s/%s in %v: %q", c.name, v, r, c.took.Round(time.Millisecond), c.reply.Header.Get("Mesh-Message"))
	if v != "Accepted" && r == "" {
		t.Errorf("%s: %s reply without Mesh-Reason (%q)", c.name, v, c.reply.Header.Get("Mesh-Message"))
	}
	if v != c.verdict || r != c.reason {
		t.Errorf("%s: %s/%s %q; want %s/%s", c.name, v, r, c.reply.Header.Get("Mesh-Message"), c.verdict, c.reason)
	}
}

// TestIngressFailedRepliesCarryReason (issue 24, item 4): every failure
// path of the ingress — bad requests, an invalid address, a handler's
// error and refusal, a payload the forward makes too large, a kind no node
// hosts, a leg to a frozen owner timing out, a response that never comes,
// an owner killed with requests in flight — answers with a Mesh-Reason
// that agrees with its Mesh-Verdict. Real processes: two testnodes on one
// nats-server (no advisories; TTL 30 s), the owner restarted on its data
// directory after its SIGKILL so its departure is proven at once.
func TestIngressFailedRepliesCarryReason(t *testing.T) {
	longTest(t)
	s := StartNATSServer(t)
	dirV := t.TempDir()
	vArgs := []string{"--name", "v", "--nats-url", s.URL, "--ttl", "30s", "--heartbeat", "1s", "--ingress=false", "--data-dir", dirV}
	v := StartTestNode(t, vArgs...)
	StartTestNode(t, "--name", "g", "--nats-url", s.URL, "--ttl", "30s", "--heartbeat", "1s")
	tc := clientNode(t, s.URL)
	live := waitHosting(t, tc, "hold", 2)
	var vid, gid subjects.NodeID
	for _, n := range live {
		switch n.Name {
		case "v":
			vid = n
		case "g":
			gid = n
		}
	}
	onV := addressesOn("hold", vid, live, 4)
	onG := addressesOn("hold", gid, live, 1)
	raw, err := nats.Connect(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	p := subjects.DefaultPrefix
	in := func(a subjects.Address) string { return p.Ingress(a, "") }
	req := map[string]string{"Mesh-Expect-Response": "true"}
	with := func(kv ...string) map[string]string {
		h := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	maxPayload := raw.MaxPayload()

	// Slow paths first, in the background: a response that never comes
	// (the ingress node's request timeout, 30 s).
	never := &ingressCase{name: "response never comes", subject: in(onG[0]), header: with("Mesh-Id", "never", "Mesh-Expect-Response", "true"),
		verdict: "Failed", reason: "timeout"}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); never.send(raw, 60*time.Second) }()

	// Synchronous refusals and failures.
	for _, c := range []*ingressCase{
		{name: "empty Mesh-Id", subject: in("echo/x"), header: with("Mesh-Id", " "), verdict: "Failed", reason: "invalid-id"},
		{name: "node-only type", subject: in("echo/x"), header: with("Mesh-Type", "natsmesh.subscribe"), verdict: "Failed", reason: "bad-request"},
		{name: "internal kind", subject: in("_sub/x"), verdict: "Failed", reason: "bad-request"},
		{name: "non-canonical address", subject: p.Ingress("echo/x", "") + "x", verdict: "Failed", reason: "invalid-address"},
		{name: "non-canonical token", subject: string(p) + ".in.echo/=78.=", verdict: "Failed", reason: "invalid-address"},
		{name: "handler error", subject: in("fail/x"), header: req, verdict: "Failed", reason: "handler-error"},
		{name: "handler refusal", subject: in("kv/x"), header: with("Mesh-Type", "set", "Mesh-Expect-Response", "true"), payload: []byte("no-equals-sign"), verdict: "Failed", reason: "bad-request"},
		{name: "unknown type", subject: in("kv/x"), header: with("Mesh-Type", "frobnicate", "Mesh-Expect-Response", "true"), verdict: "Failed", reason: "bad-request"},
		{name: "too large when forwarded", subject: in("echo/x"), payload: make([]byte, maxPayload-16), verdict: "Failed", reason: "payload-too-large"},
		{name: "kind nobody hosts", subject: in("nokind/x"), verdict: "Unavailable", reason: "no-placement"},
	} {
		c.send(raw, 30*time.Second)
		c.check(t)
	}

	// Requests the owner v accepted, then v is frozen (a leg to it times
	// out) and killed (the accepted ones lose their answer).
	accepted := func() int64 {
		msg, err := raw.Request(p.Control("v", mesh.ControlStats), nil, 2*time.Second)
		var st mesh.NodeStatus
		if err != nil || jsonUnmarshal(msg.Data, &st) != nil {
			return -1
		}
		return st.Host.Accepted
	}
	base := accepted()
	var held []*ingressCase
	for i, a := range onV[:3] {
		c := &ingressCase{name: fmt.Sprintf("owner killed (%d)", i), subject: in(a), header: with("Mesh-Id", fmt.Sprintf("held-%d", i), "Mesh-Expect-Response", "true"),
			verdict: "Failed", reason: "outcome-unknown"}
		if i == 2 {
			c.name, c.header["Mesh-Idempotent"] = "owner killed, idempotent", "true"
			c.verdict, c.reason = "ShuttingDown", "departed"
		}
		held = append(held, c)
		wg.Add(1)
		go func() { defer wg.Done(); c.send(raw, 60*time.Second) }()
	}
	natstest.Eventually(t, 20*time.Second, func() bool { return accepted() == base+int64(len(held)) }, "v holding the requests (accepted before: %d)", base)
	if err := v.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := &ingressCase{name: "leg to a frozen owner", subject: in(onV[3]), header: with("Mesh-Id", "frozen"), verdict: "Failed", reason: "timeout"}
	frozen.send(raw, 30*time.Second)
	frozen.check(t)
	if err := v.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	v.Wait(t, 10*time.Second)
	StartTestNode(t, vArgs...) // supersedes the killed generation at once (its data directory's lock)
	wg.Wait()
	for _, c := range held {
		c.check(t)
		if c.took > 20*time.Second {
			t.Errorf("%s: answered after %v", c.name, c.took)
		}
	}
	never.check(t)
	if t.Failed() {
		return
	}
	if !strings.Contains(never.reply.Header.Get("Mesh-Message"), "deadline") {
		t.Logf("response timeout message: %q", never.reply.Header.Get("Mesh-Message"))
	}
}
