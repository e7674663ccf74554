package meshtest_test

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/meshtest"
)

var quiet = slog.New(slog.DiscardHandler)

// startNode runs a member node hosting the built-in kinds (echo, kv) on s,
// on its own connection, closed when the test ends.
func startNode(t *testing.T, s *server.Server, name string) *mesh.Node {
	t.Helper()
	n, err := mesh.NewNode(mesh.NodeConfig{Conn: natstest.Connect(t, s), Name: name, Logger: quiet,
		Membership: &mesh.MembershipConfig{}}, mesh.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	for kind, f := range hubs.Builtin(n.Client, quiet) {
		if err := n.Register(kind, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestConformance runs the suite against this implementation: two member
// nodes on one server, each serving the ingress and hosting echo and kv,
// so that most deliveries are forwarded from the ingress node to another
// owner.
func TestConformance(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	startNode(t, s, "n1")
	n2 := startNode(t, s, "n2")
	meshtest.Run(t, meshtest.Config{
		Conn:        natstest.Connect(t, s),
		OtherCaller: natstest.Connect(t, s, nats.CustomInboxPrefix("_INBOX.meshtest-other")),
		Node:        n2.ID().String(),
		Timeout:     20 * time.Second,
	})
}

// TestConformanceStandalone runs the checks that differ on a one-node mesh
// without membership (unknown-kind instead of no-placement) and a custom
// prefix.
func TestConformanceStandalone(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, err := mesh.NewNode(mesh.NodeConfig{Conn: natstest.Connect(t, s), Name: "solo", Logger: quiet, Prefix: "acme.mesh.v1"}, mesh.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register(hubs.EchoKind, hubs.Echo); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	cfg := meshtest.Config{Conn: natstest.Connect(t, s), Prefix: "acme.mesh.v1", Kinds: []string{meshtest.KindEcho}}
	for _, c := range meshtest.Checks() {
		switch c.Name {
		case "UnknownKind", "Deliver", "TokenEncoding", "SubjectShape", "Dedupe":
			t.Run(c.Name, func(t *testing.T) { c.Func(t, cfg) })
		}
	}
}

// ExampleRun shows another implementation's conformance test: its mesh
// runs at NATS_URL with the default prefix and hosts the built-in kinds.
func ExampleRun() {
	conformance := func(t *testing.T) {
		nc, err := nats.Connect(os.Getenv("NATS_URL"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		other, err := nats.Connect(os.Getenv("NATS_URL"), nats.CustomInboxPrefix("_INBOX.conformance"))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		meshtest.Run(t, meshtest.Config{
			Conn:        nc,
			Prefix:      meshtest.DefaultPrefix,
			Kinds:       []string{meshtest.KindEcho, meshtest.KindKV},
			OtherCaller: other, // seen as another caller: its own inbox prefix
			Timeout:     35 * time.Second,
		})
	}
	_ = conformance // func TestConformance(t *testing.T) { conformance(t) }
}

// recorder is a testing.TB that records failures instead of reporting
// them, so a test can assert that a check fails. Fatal and Skip end the
// check's goroutine, as on a real T.
type recorder struct {
	testing.TB
	mu      sync.Mutex
	errs    []string
	failed  bool
	skipped bool
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.failed = true
}
func (r *recorder) Error(args ...any)                 { r.Errorf("%s", fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Error(args...); runtime.Goexit() }
func (r *recorder) Fail()                             { r.mu.Lock(); r.failed = true; r.mu.Unlock() }
func (r *recorder) FailNow()                          { r.Fail(); runtime.Goexit() }
func (r *recorder) Failed() bool                      { r.mu.Lock(); defer r.mu.Unlock(); return r.failed }
func (r *recorder) Skip(args ...any)                  { r.SkipNow() }
func (r *recorder) Skipf(string, ...any)              { r.SkipNow() }
func (r *recorder) SkipNow()                          { r.mu.Lock(); r.skipped = true; r.mu.Unlock(); runtime.Goexit() }
func (r *recorder) Skipped() bool                     { r.mu.Lock(); defer r.mu.Unlock(); return r.skipped }

// runCheck runs the check named name against cfg on a recorder.
func runCheck(t *testing.T, name string, cfg meshtest.Config) *recorder {
	t.Helper()
	for _, c := range meshtest.Checks() {
		if c.Name == name {
			r := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				c.Func(r, cfg)
			}()
			<-done
			return r
		}
	}
	t.Fatalf("no check %q", name)
	return nil
}

// fake is a tiny ingress for kind echo, written for these tests, with
// switchable defects.
type fake struct {
	noDedupe bool // answer a repeated ID as a new delivery
	noReason bool // omit Mesh-Reason on refusals
	leakKey  bool // put a Mesh-Answer-Key on Accepted

	mu   sync.Mutex
	kept map[string][]byte // (caller, ID) → response
	n    int
}

func (f *fake) serve(t *testing.T, nc *nats.Conn, prefix string) {
	t.Helper()
	f.kept = map[string][]byte{}
	sub, err := nc.QueueSubscribe(prefix+".in.*.*", "natsmesh-ingress", f.handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func (f *fake) handle(m *nats.Msg) {
	r := nats.NewMsg(m.Reply)
	refuse := func(reason, message string) {
		r.Header.Set("Mesh-Verdict", "Failed")
		if !f.noReason {
			r.Header.Set("Mesh-Reason", reason)
		}
		r.Header.Set("Mesh-Message", message)
		_ = m.RespondMsg(r)
	}
	id, given := "", false
	if v, ok := m.Header["Mesh-Id"]; ok && len(v) > 0 {
		id, given = v[0], true
	}
	if given && !printableID(id) {
		refuse("invalid-id", "bad ID")
		return
	}
	if !given {
		f.mu.Lock()
		f.n++
		id = fmt.Sprintf("fakegeneratedid%07d", f.n)
		f.mu.Unlock()
	}
	tokens := strings.Split(m.Subject, ".")
	if kind, _, _ := strings.Cut(tokens[len(tokens)-2], "/"); kind != "echo" {
		refuse("unknown-kind", "fake hosts echo only")
		return
	}
	if len(m.Header.Get("Mesh-Type")) > 256 {
		refuse("bad-request", "type too long")
		return
	}
	var resp []byte
	if m.Header.Get("Mesh-Expect-Response") == "true" {
		resp = m.Data
	}
	// The caller is the reply's inbox prefix (§3.3).
	caller := m.Reply
	if p := strings.Split(m.Reply, "."); len(p) > 2 {
		caller = strings.Join(p[:len(p)-2], ".")
	}
	key := caller + " " + id
	f.mu.Lock()
	if kept, ok := f.kept[key]; ok && !f.noDedupe {
		resp = kept
	} else {
		f.kept[key] = resp
	}
	f.mu.Unlock()
	r.Header.Set("Mesh-Verdict", "Accepted")
	r.Header.Set("Mesh-Node", "fake.1")
	r.Header.Set("Mesh-Id", id)
	if f.leakKey {
		r.Header.Set("Mesh-Answer-Key", "00112233445566778899aabbccddeeff")
	}
	if m.Header.Get("Mesh-Expect-Response") == "true" {
		r.Data = resp
	}
	_ = m.RespondMsg(r)
}

func printableID(id string) bool {
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

// TestChecksBite runs single checks against the fake ingress: without a
// defect they pass, so each failure below is the defect's.
func TestChecksBite(t *testing.T) {
	t.Parallel()
	checks := []struct {
		name   string
		defect func(*fake)
		want   string // in one of the recorded failures
	}{
		{"Dedupe", func(f *fake) { f.noDedupe = true }, "the handler ran again"},
		{"DedupePerCaller", func(f *fake) { f.noDedupe = true }, "(Mesh-Caller, Mesh-Id)"},
		{"InvalidID", func(f *fake) { f.noReason = true }, "want Failed/invalid-id"},
		{"InvalidID", func(f *fake) { f.noReason = true }, "a Failed reply without Mesh-Reason"},
		{"Deliver", func(f *fake) { f.leakKey = true }, "Mesh-Answer-Key"},
	}
	for i, c := range checks {
		t.Run(fmt.Sprintf("%s/%d", c.name, i), func(t *testing.T) {
			s := natstest.RunServer(t, natstest.WithoutJetStream())
			cfg := meshtest.Config{
				Conn:        natstest.Connect(t, s),
				OtherCaller: natstest.Connect(t, s, nats.CustomInboxPrefix("_INBOX.other")),
				Kinds:       []string{meshtest.KindEcho},
				Timeout:     5 * time.Second,
			}
			good := &fake{}
			good.serve(t, natstest.Connect(t, s), meshtest.DefaultPrefix)
			if r := runCheck(t, c.name, cfg); r.Failed() || r.Skipped() {
				t.Fatalf("%s fails against the fake without defect (skipped %v): %q", c.name, r.Skipped(), r.errs)
			}
			bad := &fake{}
			c.defect(bad)
			bs := natstest.RunServer(t, natstest.WithoutJetStream())
			bad.serve(t, natstest.Connect(t, bs), meshtest.DefaultPrefix)
			cfg.Conn = natstest.Connect(t, bs)
			cfg.OtherCaller = natstest.Connect(t, bs, nats.CustomInboxPrefix("_INBOX.other"))
			r := runCheck(t, c.name, cfg)
			if !r.Failed() {
				t.Fatalf("%s passes against the defective fake", c.name)
			}
			if !strings.Contains(strings.Join(r.errs, "\n"), c.want) {
				t.Errorf("%s fails, but without %q:\n%s", c.name, c.want, strings.Join(r.errs, "\n"))
			}
			t.Logf("%s against the defect: %d failures, first: %s", c.name, len(r.errs), r.errs[0])
		})
	}
}

// mitm stands in for a node generation (Config.Node "mitm.1") in front of
// a real one: it forwards every leg on its delivery subject to the real
// node's, in the order it received them on one connection, and the replies
// back, with switchable defects — so the direct checks can be shown to fail
// on each.
type mitm struct {
	prefix, real string // the real node's <name>.<gen>
	nc           *nats.Conn
	noWindow     bool // drop Mesh-Window from replies
	swap         bool // forward a lane's seq 3 before its seq 2
	badToken     bool // answers relayed with their last token digit changed

	mu      sync.Mutex
	n       int
	replies map[string]string // relay reply token → the sender's reply subject
	held    *nats.Msg         // seq 2, held until seq 3 went
}

func (x *mitm) serve(t *testing.T) {
	t.Helper()
	x.replies = map[string]string{}
	inbox := nats.NewInbox()
	answers := x.prefix + ".ans.mitm-relay.1"
	var answerTo sync.Map // Mesh-Id → the sender's answer subject
	rsub, err := x.nc.Subscribe(inbox+".*", func(r *nats.Msg) {
		x.mu.Lock()
		reply := x.replies[r.Subject]
		delete(x.replies, r.Subject)
		x.mu.Unlock()
		out := nats.NewMsg(reply)
		out.Header, out.Data = r.Header, r.Data
		if out.Header.Get("Mesh-Node") == x.real {
			out.Header.Set("Mesh-Node", "mitm.1")
		}
		if x.noWindow {
			out.Header.Del("Mesh-Window")
		}
		_ = x.nc.PublishMsg(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	asub, err := x.nc.Subscribe(answers, func(a *nats.Msg) {
		to, ok := answerTo.Load(a.Header.Get("Mesh-Id"))
		if !ok {
			return
		}
		if tok := a.Header.Get("Mesh-Answer-Token"); tok != "" {
			last := byte('0')
			if tok[len(tok)-1] == '0' {
				last = '1'
			}
			a.Header.Set("Mesh-Answer-Token", tok[:len(tok)-1]+string(last))
		}
		out := nats.NewMsg(to.(string))
		out.Header, out.Data = a.Header, a.Data
		_ = x.nc.PublishMsg(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	name, gen, _ := strings.Cut(x.real, ".")
	sub, err := x.nc.Subscribe(x.prefix+".dlv.mitm.1.>", func(m *nats.Msg) {
		fwd := nats.NewMsg(x.prefix + ".dlv." + name + "." + gen + strings.TrimPrefix(m.Subject, x.prefix+".dlv.mitm.1"))
		fwd.Header, fwd.Data = m.Header, m.Data
		if to := m.Header.Get("Mesh-Answer-To"); x.badToken && to != "" {
			answerTo.Store(m.Header.Get("Mesh-Id"), to)
			fwd.Header.Set("Mesh-Answer-To", answers)
			fwd.Header.Set("Mesh-Sender", "mitm-relay.1")
		}
		x.mu.Lock()
		x.n++
		fwd.Reply = inbox + "." + strconv.Itoa(x.n)
		x.replies[fwd.Reply] = m.Reply
		lane := m.Header.Get("Mesh-Lane")
		var out []*nats.Msg
		switch {
		case x.swap && strings.HasSuffix(lane, "/2"):
			x.held = fwd
		case x.swap && strings.HasSuffix(lane, "/3") && x.held != nil:
			out = []*nats.Msg{fwd, x.held} // 3, then 2
			x.held = nil
		default:
			out = []*nats.Msg{fwd}
		}
		x.mu.Unlock()
		for _, f := range out {
			_ = x.nc.PublishMsg(f)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe(); _ = rsub.Unsubscribe(); _ = asub.Unsubscribe() })
	if err := x.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestDirectChecksBite: the direct-subject checks pass through a faithful
// relay in front of a real node, and each fails on the relay's defect: a
// window grant dropped, two legs of a lane delivered out of order, an
// answer whose token does not bind it to the accepting generation.
func TestDirectChecksBite(t *testing.T) {
	t.Parallel()
	cases := []struct {
		check  string
		defect func(*mitm)
		want   string
	}{
		{"WindowedLane", func(*mitm) {}, ""},
		{"AnswerBinding", func(*mitm) {}, ""},
		{"WindowedLane", func(x *mitm) { x.noWindow = true }, "want a grant of 1–4096"},
		{"WindowedLane", func(x *mitm) { x.swap = true }, "out-of-order"},
		{"AnswerBinding", func(x *mitm) { x.badToken = true }, "Mesh-Answer-Token"},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%s/%d", c.check, i), func(t *testing.T) {
			s := natstest.RunServer(t)
			n := startNode(t, s, "real")
			x := &mitm{prefix: meshtest.DefaultPrefix, real: n.ID().String(), nc: natstest.Connect(t, s)}
			c.defect(x)
			x.serve(t)
			r := runCheck(t, c.check, meshtest.Config{Conn: natstest.Connect(t, s), Node: "mitm.1", Timeout: 5 * time.Second})
			if r.Skipped() {
				t.Fatalf("%s skipped", c.check)
			}
			if c.want == "" {
				if r.Failed() {
					t.Fatalf("%s fails through a faithful relay: %q", c.check, r.errs)
				}
				return
			}
			if !r.Failed() {
				t.Fatalf("%s passes through the defective relay", c.check)
			}
			if !strings.Contains(strings.Join(r.errs, "\n"), c.want) {
				t.Errorf("%s fails, but without %q:\n%s", c.check, c.want, strings.Join(r.errs, "\n"))
			}
			t.Logf("%s against the defect: %d failures, first: %s", c.check, len(r.errs), r.errs[0])
		})
	}
}
