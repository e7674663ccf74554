package hub

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// FuzzIntakeParse feeds the intake's parse of an incoming delivery — an
// untrusted subject and untrusted headers — with anything. It must never
// panic; a delivery it accepts is well-formed (a valid ID, address, stream,
// type, attempt, an answer subject under <prefix>.ans. and a canonical
// subject naming this generation); anything else is refused with a
// recognised verdict that is not resendable, except not-owner for another
// generation.
func FuzzIntakeParse(f *testing.F) {
	s := natstest.RunServer(f)
	nc := natstest.Connect(f, s)
	node := subjects.NodeID{Name: "n", Generation: 7}
	h, err := New(Config{Conn: nc, Node: node})
	if err != nil {
		f.Fatal(err)
	}
	p := subjects.DefaultPrefix
	f.Add(p.Delivery(node, "echo/x", ""), "id-1", "", "", "", "", "")
	f.Add(p.Delivery(node, "echo/x", "s"), "id-2", "rec/me", "greet", "2", "mesh.v1.ans.me.1", "true")
	f.Add(p.Delivery(node, "echo/a b", "é"), "a b", "", "", "0", "", "true")
	f.Add(p.Delivery(subjects.NodeID{Name: "n", Generation: 8}, "echo/x", ""), "id", "", "", "", "", "")
	f.Add("mesh.v1.dlv.n.7.echo=2Fx.=", "id", "nokind", "", "x", "mesh.v1.ctl.n", "")
	f.Add("mesh.v1.dlv.n.7.>", "id\r\n", "", strings.Repeat("t", 300), "-1", "mesh.v1.ans.*", "true")
	f.Fuzz(func(t *testing.T, subject, id, from, typ, attempt, answerTo, expect string) {
		m := &nats.Msg{Subject: subject, Header: nats.Header{}}
		for k, v := range map[string]string{HeaderID: id, HeaderFrom: from, HeaderType: typ, HeaderAttempt: attempt, HeaderAnswerTo: answerTo, HeaderExpectResponse: expect} {
			if v != "" {
				m.Header.Set(k, v)
			}
		}
		e, err := h.parse(m)
		if err != nil {
			var ve *verdict.Error
			if !errors.As(err, &ve) || ve.Reason == verdict.ReasonUnknown {
				t.Fatalf("refusal %v carries no known reason", err)
			}
			if verdict.IsTransient(err) && !errors.Is(err, verdict.ErrNotOwner) {
				t.Fatalf("refusal of malformed input %v reads transient", err)
			}
			return
		}
		if ValidateID(e.ID) != nil || e.To.Validate() != nil || e.Stream.Validate() != nil {
			t.Fatalf("accepted %q with ID %q, address %q, stream %q", subject, e.ID, e.To, e.Stream)
		}
		if e.From != "" && e.From.Validate() != nil || len(e.Type) > MaxTypeLen || e.Attempt < 1 {
			t.Fatalf("accepted from %q type of %d bytes attempt %d", e.From, len(e.Type), e.Attempt)
		}
		if e.expectResponse && !h.answerSubject(e.answerTo) || e.answerTo != "" && !strings.HasPrefix(e.answerTo, h.ansPrefix) {
			t.Fatalf("accepted answer subject %q (expect %v)", e.answerTo, e.expectResponse)
		}
		if got := p.Delivery(node, e.To, e.Stream); got != subject {
			t.Fatalf("accepted non-canonical subject %q (canonical %q)", subject, got)
		}
		if !utf8.ValidString(string(e.To)) {
			t.Fatalf("address %q is not UTF-8", e.To)
		}
	})
}
