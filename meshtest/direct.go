package meshtest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The checks of the direct delivery subject (§2.2, §3.4, §5): what a
// sender that knows the owner — another node, a node-side library in
// another language — sees. They need Config.Node and a connection allowed
// to publish on delivery subjects (only nodes are, under the permission
// profiles of SECURITY.md): Config.NodeConn, else Config.Conn.

var (
	answerKey  = regexp.MustCompile(`^[0-9a-f]{32}$`)
	laneWindow = regexp.MustCompile(`^[1-9][0-9]{0,3}$`)
)

// direct is one direct-subject check's run.
type direct struct {
	*suite
	nc     *nats.Conn
	node   string // <name>.<gen>
	sender string // Mesh-Sender: a lane's sender, unique to the run
}

func newDirect(t testing.TB, cfg Config, needs ...string) *direct {
	t.Helper()
	s := newSuite(t, cfg, needs...)
	if cfg.Node == "" {
		t.Skip("meshtest: no Config.Node: the direct delivery subject's checks need a node generation to send to")
	}
	if !nodeID.MatchString(cfg.Node) {
		t.Fatalf("meshtest: Config.Node %q is not <name>.<gen> (§2.2)", cfg.Node)
	}
	nc := cfg.NodeConn
	if nc == nil {
		nc = cfg.Conn
	}
	return &direct{suite: s, nc: nc, node: cfg.Node, sender: "meshtest-" + s.run + ".1"}
}

// subject is the delivery subject of addr and stream on the node (§2.2).
func (d *direct) subject(addr, stream string) string {
	name, gen, _ := strings.Cut(d.node, ".")
	return d.cfg.Prefix + ".dlv." + name + "." + gen + "." + encodeToken(addr) + "." + encodeToken(stream)
}

// leg is one message on a delivery subject.
type leg struct {
	addr, stream, id, typ, lane string
	answerTo                    string
	request                     bool
	header                      nats.Header
	data                        []byte
}

func (d *direct) natsMsg(l leg) *nats.Msg {
	m := &nats.Msg{Subject: d.subject(l.addr, l.stream), Header: nats.Header{}, Data: l.data}
	set := func(k, v string) {
		if v != "" {
			m.Header[k] = []string{v}
		}
	}
	set(hID, l.id)
	set(hType, l.typ)
	set(hLane, l.lane)
	set(hSender, d.sender)
	set(hAnswerTo, l.answerTo)
	if l.request {
		set(hExpectResponse, "true")
	}
	for k, v := range l.header {
		m.Header[k] = v
	}
	return m
}

// send sends l and returns its reply after the header rules of §4.1 for a
// delivery subject (checkDirectReply); a transport error ends the check.
func (d *direct) send(label string, l leg) *nats.Msg {
	d.t.Helper()
	r, err := d.nc.RequestMsg(d.natsMsg(l), d.cfg.Timeout)
	if err != nil {
		d.t.Fatalf("%s: %s: no reply: %v", label, d.subject(l.addr, l.stream), err)
	}
	d.checkDirectReply(label, l, r)
	return r
}

// pipeline publishes legs in order on one connection without waiting, each
// with its own reply subject, and returns their replies in the same order.
func (d *direct) pipeline(label string, legs []leg) []*nats.Msg {
	d.t.Helper()
	inbox := d.nc.NewRespInbox()
	ch := make(chan *nats.Msg, len(legs))
	sub, err := d.nc.ChanSubscribe(inbox+".*", ch)
	if err != nil {
		d.t.Fatalf("%s: subscribe: %v", label, err)
	}
	defer sub.Unsubscribe()
	for i, l := range legs {
		m := d.natsMsg(l)
		m.Reply = inbox + "." + strconv.Itoa(i)
		if err := d.nc.PublishMsg(m); err != nil {
			d.t.Fatalf("%s: publish leg %d: %v", label, i, err)
		}
	}
	out := make([]*nats.Msg, len(legs))
	timer := time.NewTimer(d.cfg.Timeout)
	defer timer.Stop()
	for range legs {
		select {
		case r := <-ch:
			i, err := strconv.Atoi(r.Subject[len(inbox)+1:])
			if err != nil || i < 0 || i >= len(legs) || out[i] != nil {
				d.t.Fatalf("%s: a reply on %s", label, r.Subject)
			}
			out[i] = r
			d.checkDirectReply(fmt.Sprintf("%s, leg %d", label, i), legs[i], r)
		case <-timer.C:
			d.t.Fatalf("%s: not every leg answered within %v", label, d.cfg.Timeout)
		}
	}
	return out
}

// checkDirectReply applies to a delivery subject's reply what §4.1 and §4.2
// say of its headers: a known verdict, a reason that agrees with it, a
// message on failures, the accepting node and its answer key on Accepted,
// a window grant only on the Accepted reply to a lane's seq 1 — and no
// Mesh-Id (ingress replies only).
func (d *direct) checkDirectReply(label string, l leg, r *nats.Msg) {
	d.t.Helper()
	v, reason := r.Header.Get(hVerdict), r.Header.Get(hReason)
	switch v {
	case accepted, failed, shuttingDown, unavailable, ignored:
	default:
		d.t.Errorf("%s: %s %q is not one of the five verdicts (§4.1)", label, hVerdict, v)
	}
	if want, known := reasons[reason]; reason != "" && (!known || want != v) {
		d.t.Errorf("%s: %s %q with verdict %s (§4.2)", label, hReason, reason, v)
	}
	if v != accepted && r.Header.Get(hMessage) == "" {
		d.t.Errorf("%s: a %s reply without %s (§4.1)", label, v, hMessage)
	}
	if v == accepted {
		if got := r.Header.Get(hNode); got != d.node {
			d.t.Errorf("%s: Accepted by %s %q, sent to %s (§4.1: the accepting node)", label, hNode, got, d.node)
		}
		if k := r.Header.Get(hAnswerKey); !answerKey.MatchString(k) {
			d.t.Errorf("%s: Accepted with %s %q, want 32 lowercase hex digits (§4.1, §5)", label, hAnswerKey, k)
		}
	}
	seq1 := strings.HasSuffix(l.lane, "/1")
	w, has := r.Header[hWindow]
	switch {
	case has && !(v == accepted && seq1):
		d.t.Errorf("%s: %s %q on a %s reply to Mesh-Lane %q (§4.1: only Accepted to seq 1)", label, hWindow, w, v, l.lane)
	case v == accepted && seq1 && (!has || !laneWindow.MatchString(r.Header.Get(hWindow)) || mustAtoi(r.Header.Get(hWindow)) > 4096):
		d.t.Errorf("%s: Accepted to Mesh-Lane %q with %s %q, want a grant of 1–4096 (§3.4)", label, l.lane, hWindow, r.Header.Get(hWindow))
	}
	if _, ok := r.Header[hID]; ok {
		d.t.Errorf("%s: a delivery subject's reply with %s (§4.1: ingress replies only)", label, hID)
	}
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// want fails unless r is verdict (and reason, if not empty).
func (d *direct) want(label string, r *nats.Msg, verdict, reason string) bool {
	d.t.Helper()
	if v, why := r.Header.Get(hVerdict), r.Header.Get(hReason); v != verdict || (reason != "" && why != reason) {
		d.t.Errorf("%s: %s/%s (%s), want %s/%s", label, v, why, r.Header.Get(hMessage), verdict, reason)
		return false
	}
	return true
}

// get reads key of the kv address on the node, awaiting the response on
// an answer subject (§5).
func (d *direct) get(label, addr, key string) string {
	d.t.Helper()
	answers := d.cfg.Prefix + ".ans." + d.sender
	ch := make(chan *nats.Msg, 4)
	sub, err := d.nc.ChanSubscribe(answers, ch)
	if err != nil {
		d.t.Fatalf("%s: subscribe %s: %v", label, answers, err)
	}
	defer sub.Unsubscribe()
	id := newID()
	r := d.send(label, leg{addr: addr, id: id, typ: "get", request: true, answerTo: answers, data: []byte(key)})
	if !d.want(label, r, accepted, "") {
		return ""
	}
	timer := time.NewTimer(d.cfg.Timeout)
	defer timer.Stop()
	for {
		select {
		case a := <-ch:
			if a.Header.Get(hID) == id {
				return string(a.Data)
			}
		case <-timer.C:
			d.t.Fatalf("%s: no answer on %s within %v", label, answers, d.cfg.Timeout)
		}
	}
}

// checkWindowedLane: a windowed lane on a delivery subject (§3.4). Legs
// published back to back, numbered 1… in one epoch, are all accepted and
// handled in seq order; the Accepted reply to seq 1 alone grants a window;
// a gap, an older epoch and a lane the node holds no state for are refused
// ShuttingDown/out-of-order and accept nothing, while the next expected
// seq is still taken; a duplicate Mesh-Id is answered Accepted before the
// sequence check; a malformed Mesh-Lane is Failed/bad-request.
func checkWindowedLane(t testing.TB, cfg Config) {
	d := newDirect(t, cfg, KindKV)
	to := d.addr(KindKV, "lane")
	epoch := "mt" + d.run
	var legs []leg
	for i := 1; i <= 8; i++ {
		legs = append(legs, leg{addr: to, id: newID(), typ: "set", lane: fmt.Sprintf("%s/%d", epoch, i), data: []byte(fmt.Sprintf("k=%d", i))})
	}
	for i, r := range d.pipeline("epoch "+epoch+", seq 1–8 back to back", legs) {
		d.want(fmt.Sprintf("seq %d", i+1), r, accepted, "")
	}
	if got := d.get("get k after seq 1–8", to, "k"); got != "8" {
		t.Errorf("after seq 1–8 of one epoch, each setting k: k is %q, want 8 (§3.4: handled in seq order)", got)
	}
	gap := d.send("seq 10 of the epoch (9 is next)", leg{addr: to, id: newID(), typ: "set", lane: epoch + "/10", data: []byte("k=gap")})
	d.want("a gap", gap, shuttingDown, "out-of-order")
	next := d.send("seq 9 after the refused gap", leg{addr: to, id: newID(), typ: "set", lane: epoch + "/9", data: []byte("k=9")})
	d.want("the next expected seq after a refused leg", next, accepted, "")
	repeat := d.send("seq 9 again under a new ID", leg{addr: to, id: newID(), typ: "set", lane: epoch + "/9", data: []byte("k=repeat")})
	d.want("a repeated seq", repeat, shuttingDown, "out-of-order")

	fresh := "mt" + d.run + "b"
	first := leg{addr: to, id: newID(), typ: "set", lane: fresh + "/1", data: []byte("k=b1")}
	d.want("a new epoch's seq 1", d.send("new epoch seq 1", first), accepted, "")
	old := d.send("the old epoch's next seq, after a new epoch began", leg{addr: to, id: newID(), typ: "set", lane: epoch + "/10", data: []byte("k=old")})
	d.want("an older epoch", old, shuttingDown, "out-of-order")
	dup := first
	dup.lane = fresh + "/7"
	d.want("a duplicate Mesh-Id with a wrong seq", d.send("seq 1's ID again as seq 7", dup), accepted, "")
	unknown := d.send("seq 2 of an epoch the node never saw", leg{addr: to, id: newID(), typ: "set", lane: "mt" + d.run + "c/2", data: []byte("k=c2")})
	d.want("a lane without state", unknown, shuttingDown, "out-of-order")
	if got := d.get("get k at the end", to, "k"); got != "b1" {
		t.Errorf("after the refusals: k is %q, want b1 (§3.4: a refused leg accepts nothing)", got)
	}
	for _, bad := range []string{"x/0", "x", "/1", "x/-1", "x/1/2", "sp ace/1"} {
		r := d.send("Mesh-Lane "+bad, leg{addr: to, id: newID(), typ: "set", lane: bad, data: []byte("k=bad")})
		d.want(fmt.Sprintf("Mesh-Lane %q", bad), r, failed, "bad-request")
	}
}

// checkAnswerBinding: a request on a delivery subject (§5). Its Accepted
// reply carries the generation's Mesh-Answer-Key; the response arrives on
// Mesh-Answer-To as Mesh-Answer: response with the Mesh-Id, the echoed
// payload and a Mesh-Answer-Token that is the first 16 bytes of
// HMAC-SHA256(key, Mesh-Id) in hex; a duplicate gets the response again.
// A Mesh-Answer-To outside <prefix>.ans., and Mesh-Expect-Response without
// one, are Failed/bad-request; a direct delivery without Mesh-Id is
// Failed/invalid-id (§3.2).
func checkAnswerBinding(t testing.TB, cfg Config) {
	d := newDirect(t, cfg, KindEcho)
	to := d.addr(KindEcho, "answers")
	answers := d.cfg.Prefix + ".ans." + d.sender
	ch := make(chan *nats.Msg, 8)
	sub, err := d.nc.ChanSubscribe(answers, ch)
	if err != nil {
		t.Fatalf("subscribe %s: %v", answers, err)
	}
	defer sub.Unsubscribe()
	req := leg{addr: to, id: newID(), request: true, answerTo: answers, data: []byte("bound payload")}
	await := func(label, key string) {
		t.Helper()
		timer := time.NewTimer(d.cfg.Timeout)
		defer timer.Stop()
		for {
			select {
			case a := <-ch:
				if a.Header.Get(hID) != req.id {
					continue
				}
				if got := a.Header.Get(hAnswer); got != "response" {
					t.Errorf("%s: %s %q, want response (§5)", label, hAnswer, got)
				}
				if a.Header.Get(hVerdict) != accepted || string(a.Data) != string(req.data) {
					t.Errorf("%s: %s with %q, want Accepted with the echoed payload", label, a.Header.Get(hVerdict), a.Data)
				}
				mac := hmac.New(sha256.New, []byte(key)) // the header's 32 characters, not hex-decoded (§5)
				mac.Write([]byte(req.id))
				if want, got := hex.EncodeToString(mac.Sum(nil)[:16]), a.Header.Get("Mesh-Answer-Token"); got != want {
					t.Errorf("%s: Mesh-Answer-Token %q, want %q (§5: HMAC-SHA256 of the Mesh-Id under the Accepted reply's key, its 32 characters)", label, got, want)
				}
				return
			case <-timer.C:
				t.Fatalf("%s: no response on %s within %v", label, answers, d.cfg.Timeout)
			}
		}
	}
	r := d.send("a request", req)
	if !d.want("a request", r, accepted, "") {
		return
	}
	key := r.Header.Get(hAnswerKey)
	await("the response", key)
	again := d.send("the request again (same Mesh-Id)", req)
	if d.want("a duplicate", again, accepted, "") {
		await("the response again", again.Header.Get(hAnswerKey))
	}
	for label, l := range map[string]leg{
		"Mesh-Answer-To outside the answer subjects":  {addr: to, id: newID(), request: true, answerTo: d.cfg.Prefix + ".ctl.x.ping"},
		"Mesh-Answer-To a wildcard":                   {addr: to, id: newID(), request: true, answerTo: d.cfg.Prefix + ".ans.>"},
		"Mesh-Expect-Response without Mesh-Answer-To": {addr: to, id: newID(), request: true},
	} {
		d.want(label, d.send(label, l), failed, "bad-request")
	}
	d.want("no Mesh-Id", d.send("a direct delivery without Mesh-Id", leg{addr: to}), failed, "invalid-id")
}
