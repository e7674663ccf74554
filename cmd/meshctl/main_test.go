package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

// startMesh runs a server and one node "n1" hosting the echo kind.
func startMesh(t *testing.T, opts ...natstest.Option) (*server.Server, *mesh.Node) {
	t.Helper()
	s := natstest.RunServer(t, opts...)
	return s, startNode(t, s, "n1")
}

func startNode(t *testing.T, s *server.Server, name string) *mesh.Node {
	t.Helper()
	nc := natstest.Connect(t, s)
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: name, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Register(hubs.EchoKind, hubs.Echo); err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })
	return node
}

type result struct {
	code           int
	stdout, stderr string
}

// meshctl runs the command in-process against s with stdin.
func meshctl(t *testing.T, s *server.Server, stdin string, args ...string) result {
	t.Helper()
	if s != nil {
		args = append([]string{"-s", s.ClientURL()}, args...)
	}
	var out, errb bytes.Buffer
	code := runIO(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func (r result) String() string {
	return "exit " + strconv.Itoa(r.code) + "\nstdout:\n" + r.stdout + "\nstderr:\n" + r.stderr
}

// wantCode checks the exit code; a failure must be one line on stderr.
func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	if code != 0 {
		if !strings.HasPrefix(r.stderr, "meshctl: ") || strings.Count(r.stderr, "\n") != 1 {
			t.Fatalf("want one line on stderr starting with meshctl:, got %q", r.stderr)
		}
	}
}

func TestRunUsesOSStdin(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := run([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "Exit codes") {
		t.Fatalf("help: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

func TestNodes(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	r := meshctl(t, s, "", "nodes")
	wantCode(t, r, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("want header and one row, got %q", r.stdout)
	}
	for _, col := range []string{"NAME", "GENERATION", "VERSION", "STARTED", "KINDS", "ACTIVATIONS", "LEGS IN FLIGHT", "DRAINING"} {
		if !strings.Contains(lines[0], col) {
			t.Errorf("header %q lacks %q", lines[0], col)
		}
	}
	f := strings.Fields(lines[1])
	if f[0] != "n1" || f[1] != strconv.FormatUint(node.ID().Generation, 10) || f[2] != mesh.Version || f[4] != "echo" || f[len(f)-1] != "no" {
		t.Errorf("row %q", lines[1])
	}

	r = meshctl(t, s, "", "nodes", "-o", "json")
	wantCode(t, r, 0)
	var st []mesh.NodeStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("json: %v\n%s", err, r.stdout)
	}
	if len(st) != 1 || st[0].Node != node.ID().String() || st[0].Prefix != string(subjects.DefaultPrefix) {
		t.Fatalf("statuses %+v", st)
	}
}

func TestNodesSeveralAndPrefixFilter(t *testing.T) {
	t.Parallel()
	s, _ := startMesh(t)
	startNode(t, s, "n2")
	// A node of another mesh on the same server is not listed.
	nc := natstest.Connect(t, s)
	other, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "other", Prefix: "mesh.other", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })

	r := meshctl(t, s, "", "nodes", "-o", "json")
	wantCode(t, r, 0)
	var st []mesh.NodeStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Name != "n1" || st[1].Name != "n2" {
		t.Fatalf("want n1, n2; got %s", r.stdout)
	}
	r = meshctl(t, s, "", "nodes", "-o", "json", "--prefix", "mesh.other")
	wantCode(t, r, 0)
	st = nil
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Name != "other" {
		t.Fatalf("want other; got %s", r.stdout)
	}
}

func TestNodesEmptyMesh(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	start := time.Now()
	r := meshctl(t, s, "", "nodes", "-o", "json")
	wantCode(t, r, 3)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("want [], got %q", r.stdout)
	}
	// Every listing: exit 3 and one line, no empty table.
	for _, cmd := range []string{"nodes", "hubs", "stats"} {
		r := meshctl(t, s, "", cmd)
		wantCode(t, r, 3)
		if r.stdout != "" || !strings.Contains(r.stderr, "no natsmesh node answered on prefix mesh.v1") {
			t.Errorf("%s: %s", cmd, r)
		}
	}
	// No responders ends discovery at once rather than after --timeout.
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("empty discovery took %v", d)
	}
}

func TestSendAndHubs(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	r := meshctl(t, s, "", "send", "echo/a", "hello", "--id", "id-1", "--type", "greeting", "--stream", "s1")
	wantCode(t, r, 0)
	if want := "Accepted by " + node.ID().String() + " (id id-1)\n"; r.stdout != want {
		t.Fatalf("want %q, got %q", want, r.stdout)
	}
	r = meshctl(t, s, "", "send", "echo/b", "hi", "-o", "json")
	wantCode(t, r, 0)
	var v struct{ Verdict, Node, ID string }
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatal(err)
	}
	if v.Verdict != "Accepted" || v.Node != node.ID().String() || len(v.ID) != 22 {
		t.Fatalf("got %+v", v)
	}

	r = meshctl(t, s, "", "hubs")
	wantCode(t, r, 0)
	if !strings.Contains(r.stdout, "echo/a, echo/b") || !strings.Contains(r.stdout, node.ID().String()) {
		t.Fatalf("hubs table: %s", r.stdout)
	}
	r = meshctl(t, s, "", "hubs", "-o", "json")
	wantCode(t, r, 0)
	var hr []mesh.HubsReport
	if err := json.Unmarshal([]byte(r.stdout), &hr); err != nil {
		t.Fatal(err)
	}
	if len(hr) != 1 || hr[0].Activations != 2 || strings.Join(hr[0].Addresses, " ") != "echo/a echo/b" || hr[0].Kinds[0] != "echo" {
		t.Fatalf("hubs: %s", r.stdout)
	}
}

func TestRequest(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	r := meshctl(t, s, "", "request", "echo/a", "ping me")
	wantCode(t, r, 0)
	if r.stdout != "ping me" { // byte for byte off a terminal
		t.Fatalf("want the echo, got %q", r.stdout)
	}
	// From stdin, binary, JSON output: base64.
	r = meshctl(t, s, "\xff\x00bin", "request", "echo/a", "-", "-o", "json", "--id", "req-2")
	wantCode(t, r, 0)
	var v map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatal(err)
	}
	if v["verdict"] != "Accepted" || v["node"] != node.ID().String() || v["id"] != "req-2" || v["payload_base64"] != "/wBiaW4=" {
		t.Fatalf("got %s", r.stdout)
	}
	r = meshctl(t, s, "text from stdin", "request", "echo/a", "-", "-o", "json")
	wantCode(t, r, 0)
	v = nil
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatal(err)
	}
	if v["payload"] != "text from stdin" {
		t.Fatalf("got %s", r.stdout)
	}
}

func TestFailureVerdict(t *testing.T) {
	t.Parallel()
	s, _ := startMesh(t)
	r := meshctl(t, s, "", "send", "nokind/a", "x")
	wantCode(t, r, 3)
	for _, want := range []string{"Failed", "unknown-kind"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr %q lacks %q", r.stderr, want)
		}
	}
	r = meshctl(t, s, "", "send", "nokind/a", "x", "-o", "json")
	wantCode(t, r, 3)
	var v map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatal(err)
	}
	if v["verdict"] != "Failed" || v["reason"] != "unknown-kind" {
		t.Fatalf("got %s", r.stdout)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	wantCode(t, meshctl(t, s, "", "send", "echo/a", "x"), 0)
	r := meshctl(t, s, "", "stats")
	wantCode(t, r, 0)
	for _, want := range []string{"SATURATION", "HOST", "CLIENT", "LEGS IN FLIGHT", "DEDUPE HITS", "RETRIES", "FAILURES BY VERDICT", node.ID().String()} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stats lacks %q:\n%s", want, r.stdout)
		}
	}
	r = meshctl(t, s, "", "stats", "-o", "json")
	wantCode(t, r, 0)
	var st []mesh.NodeStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	// The ingress node delivered to itself: its client and host both count it.
	if len(st) != 1 || st[0].Host.Accepted != 1 || st[0].Client.Accepted != 1 || st[0].Ingress != 1 || st[0].Saturation.MaxInFlight == 0 {
		t.Fatalf("stats: %s", r.stdout)
	}
}

func TestBenchBaseline(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	r := meshctl(t, s, "", "bench", "-n", "200", "-c", "4", "--baseline")
	wantCode(t, r, 0)
	for _, want := range []string{"mesh", "raw", "ratio mesh/raw", "Accepted=200", node.ID().String()} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bench output lacks %q:\n%s", want, r.stdout)
		}
	}
	// Off a terminal: no bar, at most progress lines.
	for line := range strings.Lines(r.stderr) {
		if !strings.HasPrefix(line, "bench mesh: ") && !strings.HasPrefix(line, "bench raw: ") {
			t.Errorf("stderr line %q is not a progress line", line)
		}
	}
	r = meshctl(t, s, "", "bench", "-n", "50", "-c", "3", "--size", "16", "--baseline", "--node", "n1", "-o", "json")
	wantCode(t, r, 0)
	var out benchOutput
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatal(err)
	}
	if out.Mesh == nil || out.Raw == nil || out.Ratio == nil || out.Mesh.Deliveries != 50 || out.Raw.Deliveries != 50 ||
		out.Mesh.Verdicts["Accepted"] != 50 || out.Raw.Verdicts["Accepted"] != 50 || out.Ratio.Throughput <= 0 || out.Mesh.Node != node.ID().String() {
		t.Fatalf("bench json: %s", r.stdout)
	}
	// Each lane is its own stream and activation is per address, so the
	// host saw the 250 mesh deliveries at one address, plus one warm-up
	// through the ingress (the run without --node finds the owner so).
	if got := node.Host().Stats().Accepted; got != 250+1 {
		t.Fatalf("host accepted %d, want 251", got)
	}
}

func TestBenchNoTarget(t *testing.T) {
	t.Parallel()
	s, _ := startMesh(t)
	wantCode(t, meshctl(t, s, "", "bench", "-n", "10", "--node", "nope"), 3)
	wantCode(t, meshctl(t, s, "", "bench", "-n", "10", "--to", "nokind/x"), 3)
	wantCode(t, meshctl(t, s, "", "bench", "-n", "0"), 1)
	empty := natstest.RunServer(t)
	wantCode(t, meshctl(t, empty, "", "bench", "-n", "10"), 3)
}

func TestDrain(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t)
	r := meshctl(t, s, "", "drain", "n1")
	wantCode(t, r, 0)
	if !strings.Contains(r.stdout, node.ID().String()) || !strings.Contains(r.stdout, "yes") {
		t.Fatalf("drain: %s", r.stdout)
	}
	// The node drains: its ingress goes away, so a send gets no node.
	natstest.Eventually(t, 10*time.Second, func() bool {
		return meshctl(t, s, "", "send", "echo/a", "x").code == 3
	}, "send after drain still accepted")
	r = meshctl(t, s, "", "send", "echo/a", "x")
	wantCode(t, r, 3)
	if !strings.Contains(r.stderr, "no mesh node serves the ingress") {
		t.Fatalf("stderr %q", r.stderr)
	}
	if !node.Status().Draining {
		t.Fatal("node not draining")
	}
	r = meshctl(t, s, "", "drain", "n1")
	wantCode(t, r, 3)
	if !strings.Contains(r.stderr, "no node named n1") {
		t.Fatalf("stderr %q", r.stderr)
	}
	wantCode(t, meshctl(t, s, "", "drain", "n1.5"), 1)
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	s, _ := startMesh(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad address", []string{"send", "noslash", "x"}, "invalid address"},
		{"bad request address", []string{"request", "/x", "x"}, "invalid address"},
		{"unknown flag", []string{"nodes", "--bogus"}, "--help"},
		{"unknown command", []string{"frob"}, "--help"},
		{"missing args", []string{"send"}, "--help"},
		{"bad output", []string{"nodes", "-o", "yaml"}, "--output"},
		{"bad prefix", []string{"nodes", "--prefix", "a..b"}, "--prefix"},
		{"long id", []string{"send", "echo/a", "x", "--id", strings.Repeat("i", 200)}, "ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := meshctl(t, s, "", tc.args...)
			wantCode(t, r, 1)
			if !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("stderr %q lacks %q", r.stderr, tc.want)
			}
			if r.stdout != "" {
				t.Fatalf("stdout %q, want nothing (no usage dump)", r.stdout)
			}
		})
	}
}

func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"nodes"}, {"send", "echo/a", "x"}, {"bench", "-n", "1"}, {"drain", "n1"}} {
		r := meshctl(t, nil, "", append([]string{"-s", "nats://127.0.0.1:1"}, args...)...)
		wantCode(t, r, 2)
		if !strings.Contains(r.stderr, "cannot connect") {
			t.Fatalf("%v: stderr %q", args, r.stderr)
		}
	}
}

func TestPayloadOverMaxPayload(t *testing.T) {
	t.Parallel()
	s, node := startMesh(t, natstest.WithMaxPayload(1024))
	big := strings.Repeat("x", 2000)
	r := meshctl(t, s, "", "send", "echo/a", big)
	wantCode(t, r, 1)
	if !strings.Contains(r.stderr, "max_payload") {
		t.Fatalf("stderr %q", r.stderr)
	}
	// From stdin too, and just under the limit with headers counted.
	wantCode(t, meshctl(t, s, big, "request", "echo/a", "-"), 1)
	wantCode(t, meshctl(t, s, "", "send", "echo/a", strings.Repeat("x", 1020)), 1)
	wantCode(t, meshctl(t, s, "", "bench", "-n", "1", "--size", "1024"), 1)
	// Nothing reached the mesh.
	if st := node.Status(); st.Ingress != 0 {
		t.Fatalf("ingress took %d messages", st.Ingress)
	}
	// (860: the forwarded leg carries the ingress node's headers, Mesh-Accept among them: about 150 bytes)
	wantCode(t, meshctl(t, s, "", "send", "echo/a", strings.Repeat("x", 860)), 0)
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	// Something serves the ingress but never answers.
	nc := natstest.Connect(t, s)
	sub, err := nc.QueueSubscribe(subjects.DefaultPrefix.IngressSubscription(), mesh.IngressQueueGroup, func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	r := meshctl(t, s, "", "send", "echo/a", "x", "--timeout", "200ms", "--id", "t-1")
	wantCode(t, r, 4)
	if !strings.Contains(r.stderr, "t-1") {
		t.Fatalf("stderr %q", r.stderr)
	}
}

// TestBenchAbortsWhenTargetGoes: a bench whose target node goes away stops
// after a bounded number of failures and prints what it measured.
func TestBenchAbortsWhenTargetGoes(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	n, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	_ = n.Register(hubs.EchoKind, hubs.Echo)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var out, errb bytes.Buffer
	var code int
	go func() {
		defer close(done)
		code = run([]string{"-s", s.ClientURL(), "--timeout", "200ms", "bench", "-n", "100000", "-c", "8"}, &out, &errb)
	}()
	natstest.Eventually(t, 10*time.Second, func() bool { return n.Host().Stats().Accepted > 100 }, "bench running")
	n.Close()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("bench did not stop after its target went away")
	}
	t.Logf("bench after its target went away (exit %d):\n%s", code, out.String())
	// Stopped by the target watch or by the run of failures, whichever
	// saw it first; the tally names the reasons.
	if code != exitVerdict || !strings.Contains(out.String(), "run aborted: ") || !strings.Contains(out.String(), "Accepted=") ||
		!strings.Contains(errb.String(), "run aborted") {
		t.Errorf("code %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
}

// TestBenchRidesOutServerRestart: meshctl bench against a node whose NATS
// server restarts mid-run (its connection and the node's reconnect): the run
// is not aborted — resendable failures are re-sent to the target, the target
// watch ignores silence while bench's own connection reconnects and a
// moment of no responders while the target's does — and it completes.
func TestBenchRidesOutServerRestart(t *testing.T) {
	port := freePort(t)
	conf := fmt.Sprintf("port: %d\n", port)
	s := natstest.RunConfig(t, conf)
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	n, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "moving", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	_ = n.Register(hubs.EchoKind, hubs.Echo)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	done := make(chan struct{})
	var out, errb bytes.Buffer
	var code int
	const total = 6000
	go func() {
		defer close(done)
		code = run([]string{"-s", s.ClientURL(), "--timeout", "15s", "bench", "-n", strconv.Itoa(total), "-c", "4"}, &out, &errb)
	}()
	accepted := func() int64 { return n.Host().Stats().Accepted }
	natstest.Eventually(t, 20*time.Second, func() bool { return accepted() > 200 }, "bench running")
	s.Shutdown()
	s.WaitForShutdown()
	natstest.RunConfig(t, conf) // the same port: both connections come back
	select {
	case <-done:
	case <-time.After(120 * time.Second):
		t.Fatal("bench did not finish")
	}
	if code != 0 || strings.Contains(out.String(), "aborted") {
		t.Fatalf("bench across a server restart: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "Accepted="+strconv.Itoa(total)) {
		t.Errorf("not every delivery accepted:\n%s", out.String())
	}
}

// freePort returns a loopback TCP port free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestSendWaitsBrieflyForTheIngress: a send that meets no responders on the
// ingress (a moment of a rolling restart: the nodes' queue subscriptions
// missing on a server) is re-sent for up to noIngressWait and succeeds once
// a node serves, whichever re-send finds it; with no node at all it still
// says so (exit 3).
func TestSendWaitsBrieflyForTheIngress(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	r := meshctl(t, s, "", "send", hubs.EchoKind+"/x", "hi")
	wantCode(t, r, exitVerdict)
	if !strings.Contains(r.stderr, "no mesh node serves the ingress") {
		t.Fatalf("no node: %s", r)
	}
	for k := 1; k <= 2; k++ { // the node comes after the k-th attempt met no responders
		s := natstest.RunServer(t)
		inMsgs := func() int64 {
			v, err := s.Varz(nil)
			if err != nil {
				t.Fatal(err)
			}
			return v.InMsgs
		}
		base := inMsgs()
		done := make(chan result, 1)
		go func() { done <- meshctl(t, s, "", "send", hubs.EchoKind+"/x", "hi") }()
		natstest.Eventually(t, 5*time.Second, func() bool { return inMsgs() >= base+int64(k) }, "attempt %d sent", k)
		startNode(t, s, fmt.Sprintf("late%d", k))
		r := <-done
		wantCode(t, r, 0)
	}
}
