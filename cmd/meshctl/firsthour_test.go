package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/loadgen"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestRequestByteExact: request's output is the response byte for byte off
// a terminal (and with --raw): a binary round trip through stdin and stdout
// is exact, whatever the last byte.
func TestRequestByteExact(t *testing.T) {
	t.Parallel()
	s, _ := startMesh(t)
	for _, body := range []string{"", "\n", "no newline", "ends with newline\n", "\xff\x00\x01bin\r\n\x00", strings.Repeat("\x00\xfe", 5000)} {
		for _, extra := range [][]string{nil, {"--raw"}} {
			r := meshctl(t, s, body, append([]string{"request", "echo/bin", "-"}, extra...)...)
			wantCode(t, r, 0)
			if r.stdout != body {
				t.Errorf("request %q %v: stdout %q", body, extra, r.stdout)
			}
		}
	}
}

// TestPayloadTrueSize: an oversized payload from stdin is reported with its
// true size, not the size read before refusing.
func TestPayloadTrueSize(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	max := natstest.Connect(t, s).MaxPayload()
	for _, n := range []int64{max + 1, 2_000_000, 5 * max} {
		r := meshctl(t, s, strings.Repeat("x", int(n)), "request", "echo/a", "-")
		wantCode(t, r, 1)
		if want := fmt.Sprintf("payload of %d bytes is over the server's max_payload of %d bytes", n, max); !strings.Contains(r.stderr, want) {
			t.Errorf("%d bytes: stderr %q, want %q", n, r.stderr, want)
		}
	}
	if st := node.Status(); st.Ingress != 0 {
		t.Fatalf("ingress took %d messages", st.Ingress)
	}
}

// TestErrorsSayEachThingOnce: a failure verdict names its verdict, reason,
// node and ID once each, and never a zero node.
func TestErrorsSayEachThingOnce(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	r := meshctl(t, s, "", "send", "nokind/a", "x", "--id", "once-1")
	wantCode(t, r, 3)
	for _, want := range []string{"Failed", "unknown-kind", node.ID().String(), "once-1"} {
		if n := strings.Count(r.stderr, want); n != 1 {
			t.Errorf("stderr names %q %d times: %q", want, n, r.stderr)
		}
	}
	if strings.Contains(r.stderr, ".0") || strings.Contains(r.stderr, "mesh: deliver") {
		t.Errorf("stderr %q", r.stderr)
	}
	// On the wire too: Mesh-Message is the fact, without the verdict name,
	// the node or the sender's wrapping.
	nc := natstest.Connect(t, s)
	m := nats.NewMsg(subjects.DefaultPrefix.Ingress("nokind/b", ""))
	m.Header.Set(hub.HeaderID, "once-2")
	reply, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	msg := reply.Header.Get(verdict.HeaderMessage)
	if strings.Contains(msg, "Failed") || strings.Contains(msg, "mesh: deliver") || strings.Count(msg, node.ID().String()) > 1 {
		t.Errorf("Mesh-Message %q", msg)
	}
}

// TestTimeoutDoesNotBoundConnecting: a tiny --timeout is a timeout, not
// "cannot connect".
func TestTimeoutDoesNotBoundConnecting(t *testing.T) {
	t.Parallel()
	s, _ := startMesh(t)
	r := meshctl(t, s, "", "send", "echo/a", "x", "--timeout", "1us")
	if r.code == exitNoNATS || strings.Contains(r.stderr, "cannot connect") {
		t.Fatalf("--timeout 1us: %s", r)
	}
}

func TestMeshctlVersion(t *testing.T) {
	t.Parallel()
	r := meshctl(t, nil, "", "--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "meshctl "+mesh.Version+", build ") || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("%s", r)
	}
	// nodes -o json carries the protocol version and the build.
	s, _ := startMesh(t)
	r = meshctl(t, s, "", "nodes", "-o", "json")
	wantCode(t, r, 0)
	var st []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st) != 1 {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if st[0]["version"] != mesh.Version || st[0]["build"] == "" || st[0]["build"] == nil {
		t.Errorf("version %v, build %v", st[0]["version"], st[0]["build"])
	}
}

func TestMeshctlEnvStrict(t *testing.T) {
	for _, kv := range [][2]string{{"MESHCTL_TIMEOUT", "10"}, {"MESHCTL_TIMEOUT", "soon"}, {"MESHCTL_OUTPUT", "yaml"}, {"MESHCTL_PREFIX", "a..b"}} {
		t.Run(kv[0]+"="+kv[1], func(t *testing.T) {
			t.Setenv(kv[0], kv[1]) // restored when the subtest ends
			r := meshctl(t, nil, "", "nodes")
			wantCode(t, r, 1)
			if !strings.Contains(r.stderr, kv[0]) && !strings.Contains(r.stderr, kv[1]) {
				t.Errorf("stderr %q names neither the variable nor its value", r.stderr)
			}
		})
	}
}

func TestTallyKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "Accepted"},
		{fmt.Errorf("leg: %w", nats.ErrTimeout), "Failed/timeout"},
		{fmt.Errorf("leg: %w", nats.ErrNoResponders), "ShuttingDown/no-responders"},
		{verdict.ErrInboxFull, "Ignored/inbox-full"},
		{fmt.Errorf("x: %w", verdict.ErrNotOwner), "ShuttingDown/not-owner"},
		{fmt.Errorf("x: %w", nats.ErrDisconnected), "ShuttingDown/disconnected"},
	} {
		if got := loadgen.TallyKey(tc.err); got != tc.want {
			t.Errorf("TallyKey(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// frozenNode is a stand-in node "frozen.1" that answers discovery, its
// control ping and deliveries (Accepted) until freeze, and then nothing —
// like a process stopped with SIGSTOP: no disconnect, no refusal.
type frozenNode struct {
	frozen   atomic.Bool
	accepted atomic.Int64
}

func startFrozenNode(t *testing.T, nc *nats.Conn) *frozenNode {
	t.Helper()
	f := &frozenNode{}
	id := subjects.NodeID{Name: "frozen", Generation: 1}
	info, _ := json.Marshal(micro.Info{ServiceIdentity: micro.ServiceIdentity{Name: mesh.ServiceName, Version: mesh.Version, Metadata: map[string]string{
		mesh.MetaNode: id.String(), mesh.MetaPrefix: string(subjects.DefaultPrefix)}}})
	status, _ := json.Marshal(mesh.NodeStatus{Node: id.String(), Name: id.Name, Generation: id.Generation, Kinds: []string{"echo"}})
	infoSubject, _ := micro.ControlSubject(micro.InfoVerb, mesh.ServiceName, "")
	for subject, answer := range map[string]func(*nats.Msg){
		infoSubject: func(m *nats.Msg) { _ = m.Respond(info) },
		subjects.DefaultPrefix.Control(id.Name, mesh.ControlPing): func(m *nats.Msg) { _ = m.Respond(status) },
		"mesh.v1.dlv.frozen.1.>": func(m *nats.Msg) {
			r := nats.NewMsg(m.Reply)
			verdict.Encode(r.Header, nil, id.String())
			f.accepted.Add(1)
			_ = m.RespondMsg(r)
		},
	} {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			if !f.frozen.Load() {
				answer(m)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestBenchNoticesFrozenTarget: a target that stops answering without
// refusing anything is noticed by the target watch (not after the legs'
// --timeout), and the partial results are printed.
func TestBenchNoticesFrozenTarget(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	f := startFrozenNode(t, natstest.Connect(t, s))
	done := make(chan struct{})
	var out, errb bytes.Buffer
	var code int
	go func() {
		defer close(done)
		code = run([]string{"-s", s.ClientURL(), "--timeout", "5m", "bench", "-n", "10000000", "-c", "4"}, &out, &errb)
	}()
	natstest.Eventually(t, 30*time.Second, func() bool { return f.accepted.Load() > 100 }, "bench running")
	frozeAt := time.Now()
	f.frozen.Store(true)
	select {
	case <-done:
	case <-time.After(2 * time.Minute): // far below --timeout's 5m
		t.Fatal("bench did not stop after its target froze")
	}
	t.Logf("stopped %v after the freeze (exit %d):\n%s%s", time.Since(frozeAt).Round(time.Millisecond), code, out.String(), errb.String())
	if code != exitVerdict || !strings.Contains(out.String(), "run aborted: target node frozen.1 did not answer its control ping") ||
		!strings.Contains(out.String(), "in flight when the run stopped") || !strings.Contains(out.String(), "Accepted=") {
		t.Errorf("exit %d\n%s", code, out.String())
	}
	for line := range strings.Lines(errb.String()) {
		if !strings.HasPrefix(line, "bench mesh: ") && !strings.HasPrefix(line, "meshctl: bench: run aborted") {
			t.Errorf("stderr line %q", line)
		}
	}
}

// TestDescribeErrorOnce: subscribe's one-line description of a refusal says
// the verdict and the node once.
func TestDescribeErrorOnce(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&verdict.Error{Reason: verdict.ReasonUnknownKind, Message: `node n1.7 hosts no hub of kind "x"`, Node: "n1.7"},
		fmt.Errorf("subscribe: %w", &verdict.Error{Reason: verdict.ReasonNotOwner, Message: "address kv/x is owned by n1.7", Node: "n1.7"}),
		&verdict.Error{Reason: verdict.ReasonInboxFull, Node: "n1.7"},
	} {
		d := describeError(err)
		if strings.Count(d, "n1.7") != 1 || strings.Count(d, verdict.Classify(err).String()) != 1 {
			t.Errorf("describeError(%v) = %q", err, d)
		}
	}
}
