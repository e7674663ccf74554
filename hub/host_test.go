package hub

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// These tests speak the wire protocol with a plain nats.go client, as a
// client in another language would.

func startHost(t *testing.T, nc *nats.Conn) *Host {
	t.Helper()
	h, err := New(Config{Conn: nc, Node: subjects.NodeID{Name: "h", Generation: 3}})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Register("echo", func(ctx context.Context, addr subjects.Address) (Hub, error) {
		return HandlerFunc(func(ctx context.Context, d *Delivery) error {
			if string(d.Payload) == "fail" {
				return errors.New("asked to fail")
			}
			return d.Respond(d.Payload)
		}), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Register("echo", nil); !errors.Is(err, ErrKindRegistered) {
		t.Errorf("second Register = %v", err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func request(t *testing.T, nc *nats.Conn, subject string, hdr map[string]string, data string) (string, error) {
	t.Helper()
	return verdict.Decode(requestMsg(t, nc, subject, hdr, data).Header)
}

// requestMsg sends data with headers hdr to subject and returns the reply.
func requestMsg(t *testing.T, nc *nats.Conn, subject string, hdr map[string]string, data string) *nats.Msg {
	t.Helper()
	m := nats.NewMsg(subject)
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	m.Data = []byte(data)
	r, err := nc.RequestMsg(m, 2*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	return r
}

func TestWireIntake(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	h := startHost(t, nc)
	node := h.Node()
	p := subjects.DefaultPrefix
	subj := p.Delivery(node, "echo/x", "")

	if n, err := request(t, nc, subj, map[string]string{HeaderID: "a1"}, "hi"); err != nil || n != "h.3" {
		t.Errorf("Accepted: node %q err %v", n, err)
	}
	cases := []struct {
		name    string
		subject string
		hdr     map[string]string
		want    error
	}{
		{"no Mesh-Id", subj, nil, verdict.ErrBadRequest},
		{"long Mesh-Id", subj, map[string]string{HeaderID: string(make([]byte, 200))}, verdict.ErrBadRequest},
		{"bad attempt", subj, map[string]string{HeaderID: "a2", HeaderAttempt: "zero"}, verdict.ErrBadRequest},
		{"bad from", subj, map[string]string{HeaderID: "a3", HeaderFrom: "nokind"}, verdict.ErrInvalidAddress},
		{"response without answer subject", subj, map[string]string{HeaderID: "a4", HeaderExpectResponse: "true"}, verdict.ErrBadRequest},
		{"unknown kind", p.Delivery(node, "nope/x", ""), map[string]string{HeaderID: "a5"}, verdict.ErrUnknownKind},
		{"non-canonical token", "mesh.v1.dlv.h.3.echo=2Fx.=", map[string]string{HeaderID: "a6"}, verdict.ErrInvalidAddress},
	}
	for _, c := range cases {
		_, err := request(t, nc, c.subject, c.hdr, "")
		if !errors.Is(err, c.want) || verdict.IsTransient(err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if st := h.Stats(); st.Accepted != 1 || st.Refused != int64(len(cases)) {
		t.Errorf("stats %+v", st)
	}
}

// TestWireAnswers: responses and handler errors reach the answer subject
// with the delivery's ID.
func TestWireAnswers(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	h := startHost(t, nc)
	answers, err := nc.SubscribeSync("mesh.v1.ans.me.1")
	if err != nil {
		t.Fatal(err)
	}
	subj := subjects.DefaultPrefix.Delivery(h.Node(), "echo/y", "s")
	for _, tc := range []struct{ id, data string }{{"r1", "ping"}, {"r2", "fail"}} {
		if _, err := request(t, nc, subj, map[string]string{HeaderID: tc.id, HeaderAnswerTo: "mesh.v1.ans.me.1", HeaderExpectResponse: "true"}, tc.data); err != nil {
			t.Fatal(err)
		}
		m, err := answers.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(HeaderID) != tc.id || m.Header.Get(HeaderAnswer) != AnswerResponse {
			t.Fatalf("answer headers %v", m.Header)
		}
		_, verr := verdict.Decode(m.Header)
		switch tc.data {
		case "ping":
			if verr != nil || string(m.Data) != "ping" {
				t.Errorf("response %q %v", m.Data, verr)
			}
		case "fail":
			if !errors.Is(verr, verdict.ErrHandler) || verdict.Classify(verr) != verdict.Failed {
				t.Errorf("handler error answer %v", verr)
			}
		}
	}
	// The sender identity is derived from the answer subject.
	h2 := h.senderOf("mesh.v1.ans.me.1")
	if h2 != "me.1" || h.senderOf("elsewhere.me.1") != "" || h.senderOf("mesh.v1.ans.me.01") != "" {
		t.Errorf("senderOf = %q", h2)
	}
}

func TestDedupeWindowEvicts(t *testing.T) {
	t.Parallel()
	d := newDedupe(3, 10)
	seen := func(id string) bool { return d.lookup(id) != nil }
	recs := map[string]*record{}
	for _, id := range []string{"a", "b", "c"} {
		recs[id] = d.add(id, true, "")
	}
	if !seen("a") || !seen("c") {
		t.Fatal("window lost a recent ID")
	}
	d.add("d", false, "")
	if seen("a") || !seen("b") || !seen("d") {
		t.Error("window did not evict the oldest ID")
	}
	// Responses are bounded in bytes, oldest dropped first.
	d.responded(recs["b"], []byte("123456"), nil)
	d.responded(recs["c"], []byte("7890ab"), nil)
	if st, _, _ := d.outcomeOf(recs["b"]); st != recRespGone {
		t.Errorf("b: state %d, want its response dropped past the byte bound", st)
	}
	if st, p, _ := d.outcomeOf(recs["c"]); st != recResponded || string(p) != "7890ab" {
		t.Errorf("c: state %d %q", st, p)
	}
	// A resendable late failure forgets the ID, and so does a failed build
	// (the handler never ran); a terminal one is kept.
	d.failed(recs["c"], verdict.ErrNotOwner)
	if seen("c") || d.bytes != 0 {
		t.Errorf("c still remembered (bytes %d) after a resendable late refusal", d.bytes)
	}
	r := d.lookup("d")
	d.failed(r, verdict.ErrActivationFailed)
	if seen("d") {
		t.Error("d still remembered after its build failed")
	}
	r = d.add("f", true, "")
	d.failed(r, verdict.ErrBadRequest)
	if st, _, err := d.outcomeOf(r); st != recFailed || !errors.Is(err, verdict.ErrBadRequest) {
		t.Errorf("f: %d %v", st, err)
	}
	// Forgetting an old record leaves a newer one of the same ID alone.
	old := d.add("e", false, "")
	d.forget(old)
	fresh := d.add("e", false, "")
	d.forget(old)
	if d.lookup("e") != fresh {
		t.Error("forgetting a stale record dropped the fresh one")
	}
	for range 1000 { // the response queue stays bounded by the window
		r := d.add("x", true, "")
		d.responded(r, []byte("1"), nil)
	}
	if len(d.responses) > 12 {
		t.Errorf("%d responses queued for a window of 3", len(d.responses))
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("empty config: %v", err)
	}
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	if _, err := New(Config{Conn: nc, Node: subjects.NodeID{Name: "bad name", Generation: 1}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad node: %v", err)
	}
	if _, err := New(Config{Conn: nc, Node: subjects.NodeID{Name: "a", Generation: 1}, Prefix: "bad..prefix"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad prefix: %v", err)
	}
}

// TestDedupeAlsoAnswer: a queued request owes its answer to the other
// senders of its duplicates, each once and bounded; the answer (response or
// late failure) hands them over exactly once; after it, a duplicate reads
// the recorded outcome instead.
func TestDedupeAlsoAnswer(t *testing.T) {
	t.Parallel()
	for _, settle := range []string{"response", "terminal", "resendable"} {
		d := newDedupe(8, 1<<10)
		r := d.add("q", true, "mesh.v1.ans.x.a.1")
		if st, noted := d.also(r, "mesh.v1.ans.x.a.1"); st != recAccepted || !noted {
			t.Fatalf("same sender: %d %v", st, noted)
		}
		for i := range maxAlsoAnswer {
			to := fmt.Sprintf("mesh.v1.ans.x.b%d.1", i)
			if _, noted := d.also(r, to); !noted {
				t.Fatalf("sender %d not noted", i)
			}
			if _, noted := d.also(r, to); !noted { // again: still once
				t.Fatalf("sender %d again", i)
			}
		}
		if _, noted := d.also(r, "mesh.v1.ans.x.over.1"); noted {
			t.Fatal("noted past the bound")
		}
		var also []string
		switch settle {
		case "response":
			also = d.responded(r, []byte("ok"), nil)
		case "terminal":
			also = d.failed(r, verdict.ErrBadRequest)
		case "resendable":
			also = d.failed(r, verdict.ErrNotOwner)
		}
		if len(also) != maxAlsoAnswer {
			t.Fatalf("%s: %d senders owed the answer, want %d", settle, len(also), maxAlsoAnswer)
		}
		if st, noted := d.also(r, "mesh.v1.ans.x.late.1"); noted || st == recAccepted {
			t.Fatalf("%s: a duplicate after the answer was noted (%d)", settle, st)
		}
		if again := d.responded(r, nil, nil); len(again) != 0 {
			t.Fatalf("%s: senders handed over twice", settle)
		}
	}
}
