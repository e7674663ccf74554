package meshtest

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
)

// checks is the suite, in the order Run runs it.
var checks = []Check{
	{Name: "Deliver", Sections: "§3.3, §4.1", Kinds: []string{KindEcho}, Func: checkDeliver},
	{Name: "RequestResponse", Sections: "§3.3, §5, §7", Kinds: []string{KindEcho}, Func: checkRequestResponse},
	{Name: "TokenEncoding", Sections: "§2.3, §2.5", Kinds: []string{KindEcho}, Func: checkTokenEncoding},
	{Name: "TokenDecoding", Sections: "§2.5", Kinds: []string{KindKV}, Func: checkTokenDecoding},
	{Name: "NonCanonicalToken", Sections: "§2.5, §3.3", Func: checkNonCanonicalToken},
	{Name: "InvalidAddress", Sections: "§2.3, §3.3", Func: checkInvalidAddress},
	{Name: "SubjectShape", Sections: "§2.2, §4.4", Func: checkSubjectShape},
	{Name: "GeneratedID", Sections: "§3.1, §3.3", Kinds: []string{KindEcho}, Func: checkGeneratedID},
	{Name: "InvalidID", Sections: "§3.2, §3.3", Kinds: []string{KindEcho}, Func: checkInvalidID},
	{Name: "BadRequest", Sections: "§3.2, §3.3", Kinds: []string{KindEcho}, Func: checkBadRequest},
	{Name: "IgnoredHeaders", Sections: "§3.2, §3.3, §8c", Kinds: []string{KindEcho}, Func: checkIgnoredHeaders},
	{Name: "NodeOnlyTypes", Sections: "§8a, §3.3", Func: checkNodeOnlyTypes},
	{Name: "UnknownKind", Sections: "§3.3, §4.2, §7", Func: checkUnknownKind},
	{Name: "Dedupe", Sections: "§3.2, §5", Kinds: []string{KindEcho}, Func: checkDedupe},
	{Name: "DedupeNoSecondRun", Sections: "§3.2", Kinds: []string{KindKV}, Func: checkDedupeNoSecondRun},
	{Name: "DedupePerCaller", Sections: "§3.2, §3.3", Kinds: []string{KindEcho}, Func: checkDedupePerCaller},
	{Name: "LaneOrder", Sections: "§2.4", Kinds: []string{KindKV}, Func: checkLaneOrder},
	{Name: "AnswerOnAcceptance", Sections: "§1, §3.3, §5", Kinds: []string{KindKV}, Func: checkAnswerOnAcceptance},
	{Name: "KVContract", Sections: "§7", Kinds: []string{KindKV}, Func: checkKVContract},
	{Name: "FireAndForget", Sections: "§3.1", Kinds: []string{KindKV}, Func: checkFireAndForget},
	{Name: "Concurrent", Sections: "§2.4, §5", Kinds: []string{KindEcho}, Func: checkConcurrent},
	{Name: "WindowedLane", Sections: "§2.2, §3.4, §4.1", Kinds: []string{KindKV}, Func: checkWindowedLane},
	{Name: "AnswerBinding", Sections: "§3.2, §4.1, §5", Kinds: []string{KindEcho}, Func: checkAnswerBinding},
}

// checkDeliver: a plain delivery is answered Accepted on acceptance, with
// the caller's Mesh-Id, the accepting node, an empty payload, and none of
// the headers of a delivery subject's reply (§3.3, §4.1); Mesh-Type and a
// valid Mesh-From are honoured (§3.3).
func checkDeliver(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	to := s.addr(KindEcho, "deliver")
	for _, m := range []msg{
		{addr: to, id: newID(), data: []byte("hello")},
		{addr: to, id: newID()},
		{addr: to, stream: "s", id: newID(), typ: "note", data: []byte{0, 1, 2}},
		{addr: to, id: newID(), header: nats.Header{hFrom: {"echo/meshtest-sender"}}},
	} {
		s.wantAccepted("deliver", s.reply("deliver", nil, m))
	}
}

// checkRequestResponse: with Mesh-Expect-Response: true the reply carries
// the handler's response (echo: the payload, byte for byte, empty for
// empty, 64 KiB; §7), also with Mesh-Idempotent: true (§3.3); any other
// value of Mesh-Expect-Response is a plain delivery (§3.2).
func checkRequestResponse(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	to := s.addr(KindEcho, "request")
	bin := make([]byte, 256)
	for i := range bin {
		bin[i] = byte(i)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	for _, p := range [][]byte{[]byte("hi there"), bin, nil, big} {
		label := fmt.Sprintf("echo request of %d bytes", len(p))
		r := s.reply(label, nil, msg{addr: to, id: newID(), request: true, data: p})
		if s.wantAccepted(label, r) && !bytes.Equal(r.Data, p) {
			t.Errorf("%s: response of %d bytes, want the payload back (§7)", label, len(r.Data))
		}
	}
	r := s.reply("Mesh-Idempotent: true", nil, msg{addr: to, id: newID(), request: true, data: []byte("idem"), header: nats.Header{"Mesh-Idempotent": {"true"}}})
	if s.wantAccepted("Mesh-Idempotent: true", r) && string(r.Data) != "idem" {
		t.Errorf("Mesh-Idempotent: true: response %q, want \"idem\" (§3.3: honoured, the same answer)", r.Data)
	}
	for _, v := range []string{"True", "yes", "1", ""} {
		label := fmt.Sprintf("%s: %q", hExpectResponse, v)
		m := msg{addr: to, id: newID(), data: []byte("x"), header: nats.Header{hExpectResponse: {v}}}
		s.wantAccepted(label, s.reply(label, nil, m)) // checkReply: no payload on a plain delivery
	}
}

// checkTokenEncoding: addresses and streams that need escaping — every
// printable ASCII byte, multi-byte UTF-8, control bytes in a stream, the
// 256-byte limits (a 768-character token) — reach the hub through the
// suite's own encoding of §2.5 (§2.3: what an address and a stream may
// hold).
func checkTokenEncoding(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	var ascii strings.Builder
	for c := byte(0x20); c < 0x7F; c++ {
		ascii.WriteByte(c)
	}
	base := s.addr(KindEcho, "")
	cases := []struct{ addr, stream string }{
		{base + "a.b", ""},
		{base + ascii.String(), ""},
		{base + "é/ü/€/😀 ~", "s.1 >"},
		{base + "x", ascii.String()},
		{base + "x", "ctl\x00\x01\t\x7f=é"}, // streams are not checked for control characters
		{base + "a=3Db", "=2E"},             // a literal escape is escaped again
		{base + strings.Repeat(".", 256-len(base)), strings.Repeat("~", 256)},
	}
	for _, c := range cases {
		label := fmt.Sprintf("address %q stream %q", c.addr, c.stream)
		if len(label) > 120 {
			label = label[:120] + "…"
		}
		p := []byte(c.addr + "\x00" + c.stream)
		r := s.reply(label, nil, msg{addr: c.addr, stream: c.stream, id: newID(), request: true, data: p})
		if s.wantAccepted(label, r) && !bytes.Equal(r.Data, p) {
			t.Errorf("%s: response %q, want the payload back", label, r.Data)
		}
	}
}

// checkTokenDecoding: the mesh decodes tokens injectively (§2.5): kv
// addresses whose tokens differ only in escapes are different maps, and a
// map is the same whatever stream reaches it.
func checkTokenDecoding(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindKV)
	base := s.addr(KindKV, "")
	names := []string{"a.b", "a_b", "a=2Eb", "a=3D2Eb", "a b", "a/b", "é", "=C3=A9"}
	for i, n := range names {
		r := s.reply("set "+n, nil, msg{addr: base + n, stream: fmt.Sprintf("st.%d", i), id: newID(), typ: "set", request: true, data: []byte("k=" + n)})
		s.wantAccepted("set "+n, r)
	}
	for _, n := range names {
		r := s.reply("get "+n, nil, msg{addr: base + n, id: newID(), typ: "get", request: true, data: []byte("k")})
		if s.wantAccepted("get "+n, r) && string(r.Data) != n {
			t.Errorf("address %q (token %s): k is %q, want %q: two addresses met in one hub (§2.5: the encoding is injective)", base+n, encodeToken(base+n), r.Data, n)
		}
	}
}

// checkNonCanonicalToken: only the canonical form of §2.5 is accepted — a
// lowercase hex escape, an escaped verbatim byte, a truncated or non-hex
// escape, an empty token, a byte outside the alphabet, invalid UTF-8 — in
// the address or the stream token: Failed/invalid-address, refused by the
// ingress node itself, the Mesh-Id echoed (§3.3).
func checkNonCanonicalToken(t testing.TB, cfg Config) {
	s := newSuite(t, cfg)
	a := encodeToken(s.addr(KindEcho, "x"))
	in := s.cfg.Prefix + ".in."
	for _, c := range []struct{ what, subject string }{
		{"lowercase hex", in + "echo=2fx.="},
		{"lowercase hex in the id", in + a + "=2e.="},
		{"an escaped verbatim byte", in + a + "=41.="},
		{"an escaped slash", in + "echo=2Fx.="},
		{"a truncated escape", in + a + "=4.="},
		{"a lone = inside a token", in + a + "=.="},
		{"a non-hex escape", in + a + "=GG.="},
		{"a byte outside the alphabet", in + a + "%.="},
		{"a byte outside the alphabet (~)", in + a + "~.="},
		{"invalid UTF-8", in + a + "=FF.="},
		{"a truncated UTF-8 sequence", in + a + "=C3.="},
		{"an empty address (=)", in + "=.="},
		{"stream: lowercase hex", in + a + ".s=2e1"},
		{"stream: an escaped verbatim byte", in + a + ".=73"},
		{"stream: a truncated escape", in + a + ".s=2"},
		{"stream: invalid UTF-8", in + a + ".=FE"},
		{"stream: ==", in + a + ".=="},
	} {
		r := s.reply(c.what, nil, msg{subject: c.subject, id: newID(), data: []byte("x")})
		s.wantFailure(c.what+" ("+c.subject+")", r, failed, "invalid-address", byIngress)
	}
}

// checkInvalidAddress: canonical tokens of an invalid address (§2.3: no
// kind/id split, an empty kind or id, a control character, over 256 bytes)
// or stream (over 256 bytes), or an invalid Mesh-From, are
// Failed/invalid-address (§3.3).
func checkInvalidAddress(t testing.TB, cfg Config) {
	s := newSuite(t, cfg)
	long := s.addr(KindEcho, "")
	long += strings.Repeat("x", 257-len(long))
	ok := s.addr(KindEcho, "x")
	for _, c := range []struct {
		what, addr, stream string
		from               string
	}{
		{what: "no slash", addr: "echo"},
		{what: "an empty kind", addr: "/x"},
		{what: "an empty id", addr: "echo/"},
		{what: "a control character (BEL)", addr: ok + "\a"},
		{what: "a control character (DEL)", addr: ok + "\x7f"},
		{what: "a C1 control character (U+0085)", addr: ok + "\u0085"},
		{what: "a 257-byte address", addr: long},
		{what: "a 257-byte stream", addr: ok, stream: strings.Repeat("s", 257)},
		{what: "Mesh-From without a kind", addr: ok, from: "nokind"},
		{what: "Mesh-From with a control character", addr: ok, from: "echo/a\x01"},
	} {
		m := msg{addr: c.addr, stream: c.stream, id: newID(), data: []byte("x")}
		if c.from != "" {
			m.header = nats.Header{hFrom: {c.from}}
		}
		s.wantFailure(c.what, s.reply(c.what, nil, m), failed, "invalid-address", byIngress)
	}
}

// checkSubjectShape: an ingress subject with another number of tokens
// after "in" matches no subscriber: NATS no responders (§2.2, §4.4), as
// does a prefix no mesh serves.
func checkSubjectShape(t testing.TB, cfg Config) {
	s := newSuite(t, cfg)
	a := encodeToken(s.addr(KindEcho, "x"))
	for _, subj := range []string{
		s.cfg.Prefix + ".in." + a,
		s.cfg.Prefix + ".in." + a + ".=.=",
		s.cfg.Prefix + "-meshtest-" + s.run + ".in." + a + ".=",
	} {
		_, err := s.send(nil, msg{subject: subj, id: newID()})
		if !isNoResponders(err) {
			t.Errorf("%s: %v, want NATS no responders (§4.4)", subj, err)
		}
	}
}

// checkGeneratedID: without Mesh-Id the ingress generates one (22
// characters of base64url, a new one for each delivery) and returns it in
// the reply (§3.3); of a Mesh-Id given twice only the first value is read
// (§3.1).
func checkGeneratedID(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	to := s.addr(KindEcho, "genid")
	seen := map[string]bool{}
	for _, req := range []bool{false, false, true} {
		r := s.reply("no Mesh-Id", nil, msg{addr: to, request: req, data: []byte("x")})
		s.wantAccepted("no Mesh-Id", r)
		id := r.Header.Get(hID)
		if !generatedID.MatchString(id) {
			t.Errorf("no Mesh-Id: reply %s %q, want 22 characters of base64url (§3.3)", hID, id)
		}
		if seen[id] {
			t.Errorf("no Mesh-Id: the ingress generated %q twice", id)
		}
		seen[id] = true
	}
	first, second := newID(), newID()
	r := s.reply("Mesh-Id twice", nil, msg{addr: to, header: nats.Header{hID: {first, second}}})
	if s.wantAccepted("Mesh-Id twice", r) && r.Header.Get(hID) != first {
		t.Errorf("Mesh-Id twice: reply %s %q, want the first value %q (§3.1)", hID, r.Header.Get(hID), first)
	}
}

// checkInvalidID: a Mesh-Id that is present but not 1–128 bytes of
// printable ASCII without spaces — empty (or only whitespace, which NATS
// trims), with a space inside, non-ASCII, 129 bytes — is
// Failed/invalid-id from the ingress node itself; every printable byte and
// exactly 128 bytes are accepted (§3.2, §3.3).
func checkInvalidID(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	to := s.addr(KindEcho, "id")
	for _, c := range []struct{ what, id string }{
		{"empty", ""},
		{"only spaces", "   "},
		{"a space inside", "mt has space"},
		{"non-ASCII", "mt-é"},
		{"129 bytes", "mt-" + strings.Repeat("x", 126)},
	} {
		m := msg{addr: to, data: []byte("x"), header: nats.Header{hID: {c.id}}}
		s.wantFailure("Mesh-Id "+c.what, s.reply("Mesh-Id "+c.what, nil, m), failed, "invalid-id", byIngress)
	}
	var all strings.Builder
	for c := byte(0x21); c < 0x7F; c++ {
		all.WriteByte(c)
	}
	printable := all.String() + newID()
	printable += strings.Repeat("z", 128-len(printable))
	r := s.reply("Mesh-Id of 128 printable bytes", nil, msg{addr: to, id: printable, data: []byte("x")})
	s.wantAccepted("Mesh-Id of 128 printable bytes", r)
}

// checkBadRequest: a Mesh-Type over 256 bytes is Failed/bad-request; 256
// bytes are accepted (§3.2, §3.3).
func checkBadRequest(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	to := s.addr(KindEcho, "type")
	r := s.reply("Mesh-Type of 257 bytes", nil, msg{addr: to, id: newID(), typ: strings.Repeat("t", 257)})
	s.wantFailure("Mesh-Type of 257 bytes", r, failed, "bad-request", byIngress)
	r = s.reply("Mesh-Type of 256 bytes", nil, msg{addr: to, id: newID(), typ: strings.Repeat("t", 256), request: true, data: []byte("ok")})
	if s.wantAccepted("Mesh-Type of 256 bytes", r) && string(r.Data) != "ok" {
		t.Errorf("Mesh-Type of 256 bytes: response %q, want \"ok\"", r.Data)
	}
}

// checkIgnoredHeaders: the headers an ingress client cannot set are
// ignored, malformed or not — Mesh-Attempt, Mesh-Answer-To, Mesh-Sender,
// Mesh-Caller (§3.3), Mesh-Lane (§3.3), Mesh-Reminder and Mesh-Chain (node
// to node only, §3.2) — and invalid trace context is never refused (§8c):
// the request is answered as without them.
func checkIgnoredHeaders(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	to := s.addr(KindEcho, "ignored")
	for _, h := range []nats.Header{
		{hAttempt: {"zero"}},
		{hAttempt: {"0"}},
		{hAnswerTo: {"$JS.API.STREAM.LIST"}},
		{hAnswerTo: {s.cfg.Prefix + ".ans.*.>"}},
		{hSender: {"not a node id"}},
		{hCaller: {"acc:SYS:admin"}},
		{hCaller: {"a", "b"}},
		{hLane: {"bad"}},
		{hLane: {"e/0"}},
		{hReminder: {"wake"}},
		{hChain: {"malformed"}},
		{"traceparent": {"not-a-traceparent"}, "tracestate": {"=,="}},
	} {
		label := fmt.Sprint(h)
		p := []byte(label)
		r := s.reply(label, nil, msg{addr: to, id: newID(), request: true, header: h, data: p})
		if s.wantAccepted(label, r) && !bytes.Equal(r.Data, p) {
			t.Errorf("%s: response %q, want the payload back", label, r.Data)
		}
	}
}

// checkNodeOnlyTypes: the ingress refuses the four sync-stream types and
// any delivery to an internal kind (beginning with "_"),
// Failed/bad-request before anything is sent (§8a), as a plain delivery
// and as a request.
func checkNodeOnlyTypes(t testing.TB, cfg Config) {
	s := newSuite(t, cfg)
	to := s.addr(KindKV, "nodeonly")
	body := []byte(`{"subscriber":"_sub/meshtest","stream":"","attempt":"1","format":1}`)
	for _, req := range []bool{false, true} {
		for _, typ := range []string{"natsmesh.subscribe", "natsmesh.unsubscribe", "natsmesh.frame", "natsmesh.frames"} {
			label := fmt.Sprintf("Mesh-Type %s (request %v)", typ, req)
			r := s.reply(label, nil, msg{addr: to, id: newID(), typ: typ, request: req, data: body})
			s.wantFailure(label, r, failed, "bad-request", byIngress)
		}
		label := fmt.Sprintf("internal kind _sub (request %v)", req)
		r := s.reply(label, nil, msg{addr: s.addr("_sub", "x"), id: newID(), request: req, data: []byte("x")})
		s.wantFailure(label, r, failed, "bad-request", byIngress)
	}
}

// checkUnknownKind: a delivery to a kind no node hosts is, with membership,
// Unavailable/no-placement from the ingress node itself (after its
// placement wait: resendable, nothing sent), or, on a one-node mesh
// without membership, Failed/unknown-kind from the node (§3.3, §4.2, §7).
// Without a Mesh-Id the refusal carries the ID the ingress generated, the
// one to re-send under (§3.3). The three deliveries run side by side.
func checkUnknownKind(t testing.TB, cfg Config) {
	s := newSuite(t, cfg)
	kind := "meshtest-nope-" + s.run
	var wg sync.WaitGroup
	msgs := []msg{
		{addr: kind + "/x", id: newID(), data: []byte("x")},
		{addr: kind + "/y", id: newID(), data: []byte("y"), request: true},
		{addr: kind + "/z", data: []byte("z")},
	}
	replies := make([]*nats.Msg, len(msgs))
	errs := make([]error, len(msgs))
	for i := range msgs {
		wg.Go(func() { replies[i], errs[i] = s.send(nil, msgs[i]) })
	}
	wg.Wait()
	for i, r := range replies {
		label := fmt.Sprintf("kind %q (request %v, Mesh-Id %q)", kind, msgs[i].request, msgs[i].id)
		if errs[i] != nil {
			t.Errorf("%s: no reply: %v", label, errs[i])
			continue
		}
		s.checkReply(label, msgs[i], r)
		if id := r.Header.Get(hID); msgs[i].id == "" && !generatedID.MatchString(id) {
			t.Errorf("%s: reply %s %q, want the generated ID to re-send under (§3.3)", label, hID, id)
		}
		if r.Header.Get(hReason) == "unknown-kind" {
			s.wantFailure(label, r, failed, "unknown-kind", byOwner)
		} else {
			s.wantFailure(label, r, unavailable, "no-placement", byIngress)
		}
	}
}

// checkDedupe: a repeated Mesh-Id is answered from the dedupe window
// (§3.2): a request's duplicate gets Accepted and the first response again
// (the kept response, not an echo of its own payload), from the same node;
// a plain delivery's duplicate is Accepted again; a duplicate to another
// address that reaches the same node generation gets the same answer
// ("whatever its address, stream or payload").
func checkDedupe(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	to := s.addr(KindEcho, "dup")
	id := newID()
	a := s.reply("first request", nil, msg{addr: to, id: id, request: true, data: []byte("first")})
	if !s.wantAccepted("first request", a) {
		return
	}
	for i, m := range []msg{
		{addr: to, id: id, request: true, data: []byte("second")},
		{addr: to, id: id, request: true, data: []byte("third"), stream: "other"},
		{addr: to, id: id, request: true},
	} {
		label := fmt.Sprintf("duplicate %d of a request (payload %q, stream %q)", i+1, m.data, m.stream)
		b := s.reply(label, nil, m)
		if !s.wantAccepted(label, b) {
			continue
		}
		if string(b.Data) != "first" {
			t.Errorf("%s: response %q, want the kept response \"first\": the handler ran again (§3.2)", label, b.Data)
		}
		if b.Header.Get(hNode) != a.Header.Get(hNode) {
			t.Errorf("%s: answered by %s, the first by %s", label, b.Header.Get(hNode), a.Header.Get(hNode))
		}
	}
	elsewhere := msg{addr: s.addr(KindEcho, "dup-elsewhere"), id: id, request: true, data: []byte("elsewhere")}
	if c := s.reply("duplicate to another address", nil, elsewhere); s.wantAccepted("duplicate to another address", c) &&
		c.Header.Get(hNode) == a.Header.Get(hNode) && string(c.Data) != "first" {
		t.Errorf("duplicate to another address on the same node %s: response %q, want \"first\" (§3.2: whatever its address)", a.Header.Get(hNode), c.Data)
	}
	d := newID()
	for i := range 2 {
		s.wantAccepted(fmt.Sprintf("plain delivery, copy %d", i+1), s.reply("plain delivery", nil, msg{addr: to, id: d, data: []byte("x")}))
	}
}

// checkDedupeNoSecondRun: a re-sent kv set is not applied twice: set k=1
// (ID s), set k=2, set k=1 again under s: k stays 2 (§3.2).
func checkDedupeNoSecondRun(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindKV)
	to := s.addr(KindKV, "dup")
	once := newID()
	for _, m := range []msg{
		{addr: to, id: once, typ: "set", request: true, data: []byte("k=1")},
		{addr: to, id: newID(), typ: "set", request: true, data: []byte("k=2")},
		{addr: to, id: once, typ: "set", request: true, data: []byte("k=1")},
		{addr: to, id: once, typ: "set", data: []byte("k=1")},
	} {
		s.wantAccepted("set "+string(m.data), s.reply("set "+string(m.data), nil, m))
	}
	r := s.reply("get k", nil, msg{addr: to, id: newID(), typ: "get", request: true, data: []byte("k")})
	if s.wantAccepted("get k", r) && string(r.Data) != "2" {
		t.Errorf("k is %q after set k=1, set k=2, set k=1 re-sent under the first ID: want \"2\" (§3.2: a duplicate is not enqueued again)", r.Data)
	}
}

// checkDedupePerCaller: dedupe is keyed by (caller, Mesh-Id): another
// caller using the same ID gets its own delivery, handled and answered on
// its own, and each caller's duplicate gets its own kept response (§3.2,
// §3.3). Needs Config.OtherCaller.
func checkDedupePerCaller(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	if s.cfg.OtherCaller == nil {
		t.Skip("meshtest: no Config.OtherCaller")
	}
	to := s.addr(KindEcho, "caller")
	id := newID()
	for _, c := range []struct {
		who  string
		nc   *nats.Conn
		send string
		want string
	}{
		{"Conn", nil, "mine", "mine"},
		{"OtherCaller", s.cfg.OtherCaller, "other", "other"},
		{"Conn again", nil, "mine 2", "mine"},
		{"OtherCaller again", s.cfg.OtherCaller, "other 2", "other"},
	} {
		r := s.reply(c.who, c.nc, msg{addr: to, id: id, request: true, data: []byte(c.send)})
		if s.wantAccepted(c.who, r) && string(r.Data) != c.want {
			t.Errorf("%s, the shared ID: response %q, want %q (§3.2: the key is (Mesh-Caller, Mesh-Id))", c.who, r.Data, c.want)
		}
	}
}

// checkLaneOrder: a caller that awaits each reply keeps its order (§2.4,
// one leg at a time): each plain kv set, answered Accepted, is handled
// before the get sent after it, whatever their streams — a hub handles
// its address's deliveries in the order its intake accepted them.
func checkLaneOrder(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindKV)
	to := s.addr(KindKV, "order")
	for i := 1; i <= 12; i++ {
		v := fmt.Sprint(i)
		set := msg{addr: to, stream: fmt.Sprintf("s%d", i%3), id: newID(), typ: "set", data: []byte("k=" + v)}
		if !s.wantAccepted("set k="+v, s.reply("set k="+v, nil, set)) {
			return
		}
		r := s.reply("get k", nil, msg{addr: to, stream: "", id: newID(), typ: "get", request: true, data: []byte("k")})
		if s.wantAccepted("get k", r) && string(r.Data) != v {
			t.Errorf("get after the Accepted set k=%s (stream %q): k is %q (§2.4: handled in the order accepted)", v, set.stream, r.Data)
		}
	}
}

// checkAnswerOnAcceptance: a plain delivery is answered on acceptance, not
// on handling (§1): a kv delivery of a type kv does not take is Accepted;
// as a request, the handler's own terminal verdict is the reply,
// Failed/bad-request with its message, from the owner (§3.3, §5).
func checkAnswerOnAcceptance(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindKV)
	to := s.addr(KindKV, "verdict")
	s.wantAccepted("plain delivery of type nope", s.reply("plain nope", nil, msg{addr: to, id: newID(), typ: "nope", data: []byte("x")}))
	s.wantAccepted("plain set without =", s.reply("plain set", nil, msg{addr: to, id: newID(), typ: "set", data: []byte("x")}))
	for _, c := range []struct{ typ, data string }{{"nope", "x"}, {"set", "no-equals"}} {
		label := fmt.Sprintf("request of type %q, payload %q", c.typ, c.data)
		r := s.reply(label, nil, msg{addr: to, id: newID(), typ: c.typ, request: true, data: []byte(c.data)})
		s.wantFailure(label, r, failed, "bad-request", byOwner)
		if len(r.Data) > 0 {
			t.Errorf("%s: a failure with a payload of %d bytes (§5: empty)", label, len(r.Data))
		}
	}
}

// checkKVContract: kv's set, get and delete as §7 says: set's payload is
// split at the first "=", responses are empty but get's, a missing key
// gets an empty value.
func checkKVContract(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindKV)
	to := s.addr(KindKV, "contract")
	do := func(typ, data, want string) {
		t.Helper()
		label := typ + " " + data
		r := s.reply(label, nil, msg{addr: to, id: newID(), typ: typ, request: true, data: []byte(data)})
		if s.wantAccepted(label, r) && string(r.Data) != want {
			t.Errorf("kv %s %q: response %q, want %q (§7)", typ, data, r.Data, want)
		}
	}
	do("set", "colour=blue", "")
	do("get", "colour", "blue")
	do("set", "eq=a=b", "")
	do("get", "eq", "a=b")
	do("get", "missing", "")
	do("delete", "colour", "")
	do("get", "colour", "")
}

// checkFireAndForget: an ingress message without a reply subject is still
// forwarded (§3.1): a kv set published so is applied.
func checkFireAndForget(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindKV)
	to := s.addr(KindKV, "fire")
	m := s.natsMsg(msg{addr: to, id: newID(), typ: "set", data: []byte("k=fired")})
	if err := s.cfg.Conn.PublishMsg(m); err != nil {
		t.Fatalf("publish: %v", err)
	}
	s.eventually("the fire-and-forget set k=fired applied", func() bool {
		r := s.reply("get k", nil, msg{addr: to, id: newID(), typ: "get", request: true, data: []byte("k")})
		return s.wantAccepted("get k", r) && string(r.Data) == "fired"
	})
}

// checkConcurrent: many requests in flight at once through the ingress,
// on one connection, each get exactly one reply — its own ID and its own
// response (§5, exactly once); their order is not guaranteed (§2.4).
func checkConcurrent(t testing.TB, cfg Config) {
	s := newSuite(t, cfg, KindEcho)
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := msg{addr: s.addr(KindEcho, fmt.Sprintf("c%d", i%7)), stream: fmt.Sprint(i % 3), id: newID(), request: true, data: []byte(fmt.Sprint("payload ", i))}
			r, err := s.send(nil, m)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			s.checkReply(fmt.Sprint("request ", i), m, r)
			if s.wantAccepted(fmt.Sprint("request ", i), r) && !bytes.Equal(r.Data, m.data) {
				t.Errorf("request %d: response %q, want %q", i, r.Data, m.data)
			}
		})
	}
	wg.Wait()
}
