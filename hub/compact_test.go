package hub

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestCompactAccepted speaks the compact reply of HeaderAccept with a plain
// nats.go client: every Accepted a leg that asked for it gets — a fresh
// delivery, a duplicate, a request, a leg of a lane past its first — is a
// reply with no headers whose payload is "+" and the same answer key the
// header form carries; a refusal, and the Accepted carrying a lane's window
// grant, keep the header form; and a leg that does not ask gets the header
// form (an older sender).
func TestCompactAccepted(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	h := startHost(t, nc)
	subj := subjects.DefaultPrefix.Delivery(h.Node(), "echo/c", "")
	ans := subjects.DefaultPrefix.Sub(AnswerToken + ".c.1")
	send := func(hdr map[string]string) *nats.Msg { t.Helper(); return requestMsg(t, nc, subj, hdr, "x") }
	full := send(map[string]string{HeaderID: "full"})
	if _, err := verdict.Decode(full.Header); err != nil || len(full.Data) != 0 {
		t.Fatalf("without %s: %v %q, want the header form of Accepted", HeaderAccept, err, full.Data)
	}
	key := full.Header.Get(HeaderAnswerKey)
	compact := func(label string, r *nats.Msg) {
		t.Helper()
		got, ok := ParseCompactAccepted(len(r.Header), r.Data)
		if !ok || got != key {
			t.Errorf("%s: header %v payload %q; want no headers and %q", label, r.Header, r.Data, "+"+key)
		}
	}
	c := map[string]string{HeaderAccept: AcceptCompact}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range c {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	compact("a fresh delivery", send(with(HeaderID, "c1")))
	compact("its duplicate", send(with(HeaderID, "c1")))
	compact("a request", send(with(HeaderID, "c2", HeaderExpectResponse, "true", HeaderAnswerTo, ans)))
	grant := send(with(HeaderID, "l1", HeaderLane, "e1/1"))
	if _, err := verdict.Decode(grant.Header); err != nil || grant.Header.Get(HeaderWindow) == "" {
		t.Errorf("a lane's first leg: %v %v; want the header form with its grant", grant.Header, err)
	}
	compact("a lane's second leg", send(with(HeaderID, "l2", HeaderLane, "e1/2")))
	refused := send(with(HeaderID, "l4", HeaderLane, "e1/4")) // a gap: out of order
	if _, err := verdict.Decode(refused.Header); !verdict.IsResendable(err) || len(refused.Data) != 0 {
		t.Errorf("a refusal: %v %q; want the header form of out-of-order", err, refused.Data)
	}
	bad := send(map[string]string{HeaderAccept: AcceptCompact})
	if _, err := verdict.Decode(bad.Header); err == nil {
		t.Error("a delivery without an ID was accepted")
	}
	other := send(map[string]string{HeaderID: "o1", HeaderAccept: "gzip"})
	if _, err := verdict.Decode(other.Header); err != nil {
		t.Errorf("an unknown %s value: %v; want the header form of Accepted", HeaderAccept, err)
	}
}

// TestParseCompactAccepted: only a message without headers whose payload
// starts with "+" is a compact Accepted.
func TestParseCompactAccepted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		hdr  int
		data string
		ok   bool
		key  string
	}{{0, "+k", true, "k"}, {0, "+", true, ""}, {1, "+k", false, ""}, {0, "", false, ""}, {0, "k", false, ""}} {
		key, ok := ParseCompactAccepted(c.hdr, []byte(c.data))
		if ok != c.ok || key != c.key {
			t.Errorf("(%d, %q) = %q %v, want %q %v", c.hdr, c.data, key, ok, c.key, c.ok)
		}
	}
}
