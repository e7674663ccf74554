package meshtest

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// What the suite needs of docs/protocol.md, written from the page (not
// from the Go packages subjects and verdict), so that it tests the page.

// Headers of §3.2, §4.1 and §5.
const (
	hID             = "Mesh-Id"
	hAttempt        = "Mesh-Attempt"
	hAnswerTo       = "Mesh-Answer-To"
	hExpectResponse = "Mesh-Expect-Response"
	hFrom           = "Mesh-From"
	hType           = "Mesh-Type"
	hLane           = "Mesh-Lane"
	hCaller         = "Mesh-Caller"
	hSender         = "Mesh-Sender"
	hReminder       = "Mesh-Reminder"
	hChain          = "Mesh-Chain"
	hVerdict        = "Mesh-Verdict"
	hReason         = "Mesh-Reason"
	hMessage        = "Mesh-Message"
	hNode           = "Mesh-Node"
	hAnswerKey      = "Mesh-Answer-Key"
	hWindow         = "Mesh-Window"
	hAnswer         = "Mesh-Answer"
)

// Verdicts of §4.1.
const (
	accepted     = "Accepted"
	failed       = "Failed"
	shuttingDown = "ShuttingDown"
	unavailable  = "Unavailable"
	ignored      = "Ignored"
)

// reasons is the §4.2 table: each wire reason and the verdict it fixes.
var reasons = map[string]string{
	"no-placement":          unavailable,
	"departed":              shuttingDown,
	"outcome-unknown":       failed,
	"deadline-unsent":       unavailable,
	"directory-unavailable": shuttingDown,
	"closing":               shuttingDown,
	"shutting-down":         shuttingDown,
	"not-owner":             shuttingDown,
	"activation-failed":     unavailable,
	"storm-breaker":         ignored,
	"inbox-full":            ignored,
	"bad-request":           failed,
	"invalid-id":            failed,
	"response-gone":         failed,
	"out-of-order":          shuttingDown,
	"handler-error":         failed,
	"call-cycle":            failed,
	"unknown-kind":          failed,
	"invalid-address":       failed,
	"payload-too-large":     failed,
	"timeout":               failed,
	"canceled":              failed,
	"internal":              failed,
}

// verbatim reports whether byte c is written as itself in a token (§2.5).
func verbatim(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '/'
}

// encodeToken writes s as one subject token (§2.5): A-Z a-z 0-9 - _ /
// verbatim, every other byte =HH in uppercase hex, the empty string "=".
func encodeToken(s string) string {
	if s == "" {
		return "="
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; verbatim(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "=%02X", c)
		}
	}
	return b.String()
}

// ingressSubject is <prefix>.in.<enc(addr)>.<enc(stream)> (§2.2).
func ingressSubject(prefix, addr, stream string) string {
	return prefix + ".in." + encodeToken(addr) + "." + encodeToken(stream)
}

// newID returns a delivery ID as §3.2 advises: 128 random bits, here in 22
// characters of base64url, after "mt-".
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "mt-" + base64.RawURLEncoding.EncodeToString(b[:])
}

var (
	nodeID      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}\.[1-9][0-9]*$`)
	generatedID = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)
)

// suite is one check's run: its t, its configuration with defaults, and
// the token that makes its addresses unique.
type suite struct {
	t   testing.TB
	cfg Config
	run string
}

func newSuite(t testing.TB, cfg Config, needs ...string) *suite {
	t.Helper()
	cfg, err := cfg.normalized()
	if err != nil {
		t.Fatalf("meshtest: %v", err)
	}
	for _, k := range needs {
		if !hosts(cfg, k) {
			t.Skipf("meshtest: the mesh does not host kind %q (Config.Kinds)", k)
		}
	}
	return &suite{t: t, cfg: cfg, run: strings.ToLower(newID()[3:11])}
}

func hosts(cfg Config, kind string) bool {
	for _, k := range cfg.Kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// addr returns an address of kind unique to this run: kind/meshtest-<run>-name.
func (s *suite) addr(kind, name string) string {
	return kind + "/meshtest-" + s.run + "-" + name
}

// msg is one message the suite sends on the ingress.
type msg struct {
	subject      string // if set, used as is; else from addr and stream
	addr, stream string
	id           string // Mesh-Id; "" sends none
	typ          string // Mesh-Type, if not empty
	request      bool   // Mesh-Expect-Response: true
	header       nats.Header
	data         []byte
}

func (s *suite) natsMsg(m msg) *nats.Msg {
	subj := m.subject
	if subj == "" {
		subj = ingressSubject(s.cfg.Prefix, m.addr, m.stream)
	}
	nm := &nats.Msg{Subject: subj, Header: nats.Header{}, Data: m.data}
	if m.id != "" {
		nm.Header[hID] = []string{m.id}
	}
	if m.typ != "" {
		nm.Header[hType] = []string{m.typ}
	}
	if m.request {
		nm.Header[hExpectResponse] = []string{"true"}
	}
	for k, v := range m.header {
		nm.Header[k] = v // as given: header names are case-sensitive (§3.1)
	}
	return nm
}

// send sends m as a request on nc (Config.Conn if nil) and returns the
// reply, or the transport error (nats.ErrNoResponders, nats.ErrTimeout).
func (s *suite) send(nc *nats.Conn, m msg) (*nats.Msg, error) {
	if nc == nil {
		nc = s.cfg.Conn
	}
	return nc.RequestMsg(s.natsMsg(m), s.cfg.Timeout)
}

// reply sends m and returns its reply after the header rules of §4 (see
// checkReply); a transport error ends the check.
func (s *suite) reply(label string, nc *nats.Conn, m msg) *nats.Msg {
	s.t.Helper()
	r, err := s.send(nc, m)
	if err != nil {
		s.t.Fatalf("%s: %s: no reply: %v", label, s.natsMsg(m).Subject, err)
	}
	s.checkReply(label, m, r)
	return r
}

// checkReply applies to every ingress reply what §4.1, §4.2 and §3.3 say
// of its headers.
func (s *suite) checkReply(label string, m msg, r *nats.Msg) {
	s.t.Helper()
	v := r.Header.Get(hVerdict)
	reason := r.Header.Get(hReason)
	switch v {
	case accepted, failed, shuttingDown, unavailable, ignored:
	default:
		s.t.Errorf("%s: %s %q is not one of the five verdicts (§4.1)", label, hVerdict, v)
	}
	if _, ok := r.Header[hReason]; ok {
		want, known := reasons[reason]
		switch {
		case !known:
			s.t.Errorf("%s: %s %q is not a reason of §4.2 (\"unknown\" is never sent)", label, hReason, reason)
		case want != v:
			s.t.Errorf("%s: %s %q fixes verdict %s, the reply says %s (§4.2: the reason sent always agrees)", label, hReason, reason, want, v)
		}
	}
	if v == failed && reason == "" {
		s.t.Errorf("%s: a Failed reply without %s (§4.2: a Failed reply from a node always names its reason)", label, hReason)
	}
	if v != accepted && v != "" && r.Header.Get(hMessage) == "" {
		s.t.Errorf("%s: a %s reply without %s (§4.1: on failures)", label, v, hMessage)
	}
	if node := r.Header.Get(hNode); node != "" && !nodeID.MatchString(node) {
		s.t.Errorf("%s: %s %q is not <name>.<gen> (§2.2)", label, hNode, node)
	}
	if v == accepted && r.Header.Get(hNode) == "" {
		s.t.Errorf("%s: an Accepted reply without %s (§4.1: the accepting node)", label, hNode)
	}
	if m.id != "" && validID(m.id) {
		if got := r.Header.Get(hID); got != m.id {
			s.t.Errorf("%s: reply %s %q, sent %q (§3.3: verdict headers plus Mesh-Id)", label, hID, got, m.id)
		}
	}
	for _, h := range []string{hAnswerKey, hWindow, hAnswer} {
		if _, ok := r.Header[h]; ok {
			s.t.Errorf("%s: an ingress reply with %s %q (§4.1: %s)", label, h, r.Header.Get(h), notOnIngress[h])
		}
	}
	if !m.request && len(r.Data) > 0 {
		s.t.Errorf("%s: the reply to a plain delivery has a payload of %d bytes (§3.3: empty)", label, len(r.Data))
	}
}

var notOnIngress = map[string]string{
	hAnswerKey: "only on a delivery subject — the owner's answer key must not reach outside clients (§5, binding)",
	hWindow:    "only to a leg with Mesh-Lane seq 1, which an ingress client never sends",
	hAnswer:    "marks answers on an answer subject, not replies",
}

// validID applies §3.2: 1–128 bytes of 0x21–0x7E.
func validID(id string) bool {
	if len(id) < 1 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7E {
			return false
		}
	}
	return true
}

// wantAccepted fails unless r is Accepted.
func (s *suite) wantAccepted(label string, r *nats.Msg) bool {
	s.t.Helper()
	if v := r.Header.Get(hVerdict); v != accepted {
		s.t.Errorf("%s: %s/%s (%s), want Accepted", label, v, r.Header.Get(hReason), r.Header.Get(hMessage))
		return false
	}
	return true
}

// Who makes a refusal (§3.3, reply headers).
const (
	byIngress = iota // the ingress node itself, before any owner saw it: no Mesh-Node
	byOwner          // a node that saw the delivery: Mesh-Node
	byAnyone         // either
)

// wantFailure fails unless r is verdict/reason, with Mesh-Node as by says.
func (s *suite) wantFailure(label string, r *nats.Msg, verdict, reason string, by int) {
	s.t.Helper()
	v, why := r.Header.Get(hVerdict), r.Header.Get(hReason)
	if v != verdict || why != reason {
		s.t.Errorf("%s: %s/%s (%s), want %s/%s", label, v, why, r.Header.Get(hMessage), verdict, reason)
		return
	}
	switch node := r.Header.Get(hNode); {
	case by == byIngress && node != "":
		s.t.Errorf("%s: %s/%s with %s %q: a refusal the ingress node makes itself carries none (§3.3)", label, v, why, hNode, node)
	case by == byOwner && node == "":
		s.t.Errorf("%s: %s/%s without %s: the refusing node (§4.1)", label, v, why, hNode)
	}
}

// eventually polls cond (which may fail the check) until it is true, or
// fails the check after Config.Timeout.
func (s *suite) eventually(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(s.cfg.Timeout)
	wait := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not within %v", what, s.cfg.Timeout)
		}
		time.Sleep(wait)
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
}

// isNoResponders reports whether err is the NATS 503 of §4.4.
func isNoResponders(err error) bool { return errors.Is(err, nats.ErrNoResponders) }
