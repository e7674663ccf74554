package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

func meshctl(t *testing.T, url string, args ...string) (string, string, int) {
	t.Helper()
	return Run(t, 60*time.Second, nil, Build(t).Meshctl, append([]string{"-s", url}, args...)...)
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMeshdEmbedded: meshd on its embedded server, driven by meshctl; then
// SIGTERM drains and exits 0.
func TestMeshdEmbedded(t *testing.T) {
	t.Parallel()
	md := StartMeshd(t, "--name", "e2e", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", t.TempDir())
	url := md.NATSURL

	out, errOut, code := meshctl(t, url, "nodes")
	if code != 0 || !strings.Contains(out, "e2e") {
		t.Fatalf("meshctl nodes: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = meshctl(t, url, "send", "echo/x", "hello")
	if code != 0 || !strings.Contains(out, "Accepted") {
		t.Fatalf("meshctl send: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = meshctl(t, url, "request", "echo/x", "ping")
	if code != 0 || !strings.Contains(out, "ping") {
		t.Fatalf("meshctl request: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = meshctl(t, url, "-o", "json", "stats")
	if code != 0 {
		t.Fatalf("meshctl stats: code %d\n%s%s", code, out, errOut)
	}
	var stats []map[string]any
	if err := json.Unmarshal([]byte(out), &stats); err != nil || len(stats) != 1 {
		t.Fatalf("stats JSON %q: %v", out, err)
	}
	out, errOut, code = meshctl(t, url, "hubs")
	if code != 0 || !strings.Contains(out, "echo") {
		t.Fatalf("meshctl hubs: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = meshctl(t, url, "bench", "-n", "300", "-c", "4", "--baseline")
	if code != 0 || !strings.Contains(strings.ToLower(out), "ratio") {
		t.Fatalf("meshctl bench: code %d\n%s%s", code, out, errOut)
	}
	t.Logf("meshctl bench --baseline:\n%s", out)

	// Bad input: one line, non-zero exit.
	_, errOut, code = meshctl(t, url, "send", "noslash", "x")
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("bad address: code %d, stderr %q", code, errOut)
	}
	// No node hosts the kind: after the placement wait (about a second;
	// a node may join), Unavailable.
	_, errOut, code = meshctl(t, url, "send", "nokind/x", "x")
	if code != 3 || !strings.Contains(errOut, "no-placement") {
		t.Errorf("unknown kind: code %d, stderr %q", code, errOut)
	}

	// Metrics and health.
	if md.HTTPAddr == "" {
		t.Fatal("no HTTP address logged")
	}
	if c, body := httpGet(t, "http://"+md.HTTPAddr+"/metrics"); c != 200 || !strings.Contains(body, `natsmesh_hub_accepted_total`) || !strings.Contains(body, `natsmesh_deliveries_total{verdict="Accepted"}`) {
		t.Errorf("/metrics: %d\n%s", c, body)
	}
	if c, _ := httpGet(t, "http://"+md.HTTPAddr+"/healthz"); c != 200 {
		t.Errorf("/healthz %d", c)
	}
	if c, _ := httpGet(t, "http://"+md.HTTPAddr+"/readyz"); c != 200 {
		t.Errorf("/readyz %d", c)
	}

	if err := md.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := md.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("meshd exit code after SIGTERM = %d\n%s", code, md.Stderr())
	}
	if !strings.Contains(md.Stderr(), `"msg":"drained"`) {
		t.Errorf("no drained log line:\n%s", md.Stderr())
	}
}

// TestMeshdExternal: meshd joined to an external nats-server process; a
// plain nats.go client (not the mesh library) delivers through the ingress
// with only the headers docs/protocol.md documents; meshctl drain stops it.
func TestMeshdExternal(t *testing.T) {
	t.Parallel()
	ns := StartNATSServer(t)
	md := StartMeshd(t, "--name", "ext", "--nats-url", ns.URL, "--http", "")
	if md.NATSURL != ns.URL {
		t.Errorf("meshd uses %s, want %s", md.NATSURL, ns.URL)
	}
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for i := 0; i < 10; i++ {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("echo/plain", "s"))
		m.Header.Set("Mesh-Id", fmt.Sprintf("plain-%d", i))
		m.Header.Set("Mesh-Expect-Response", "true")
		m.Data = []byte(fmt.Sprint(i))
		r, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if r.Header.Get("Mesh-Verdict") != "Accepted" || string(r.Data) != fmt.Sprint(i) || !strings.HasPrefix(r.Header.Get("Mesh-Node"), "ext.") {
			t.Fatalf("reply %q %v", r.Data, r.Header)
		}
	}
	out, errOut, code := meshctl(t, ns.URL, "send", "echo/x", "hello")
	if code != 0 || !strings.Contains(out, "Accepted") {
		t.Fatalf("meshctl send: %d %s%s", code, out, errOut)
	}
	out, errOut, code = meshctl(t, ns.URL, "drain", "ext")
	if code != 0 {
		t.Fatalf("meshctl drain: %d %s%s", code, out, errOut)
	}
	if code := md.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("meshd exit code after drain = %d\n%s", code, md.Stderr())
	}
	// The node is gone: the ingress has no responders.
	m := nats.NewMsg(subjects.DefaultPrefix.Ingress("echo/plain", ""))
	m.Header.Set("Mesh-Id", "after")
	if _, err := nc.RequestMsg(m, 2*time.Second); !verdict.IsResendable(err) {
		t.Errorf("after drain: %v, want no responders", err)
	}
}

// TestBadInput: each binary answers bad input with one line and a non-zero
// exit, never a stack trace.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := Build(t)
	cases := []struct {
		bin  string
		args []string
		code int
	}{
		{b.Meshd, []string{"--bogus"}, 1},
		{b.Meshd, []string{"--name", "bad name"}, 1},
		{b.Meshd, []string{"--hubs", "nosuchkind", "--listen", "127.0.0.1:0", "--http", ""}, 1},
		{b.Meshd, []string{"--nats-url", "nats://127.0.0.1:1", "--http", ""}, 2},
		{b.Meshctl, []string{"--bogus"}, 1},
		{b.Meshctl, []string{"-s", "nats://127.0.0.1:1", "nodes"}, 2},
	}
	for _, c := range cases {
		_, errOut, code := Run(t, 30*time.Second, nil, c.bin, c.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != c.code || strings.Contains(errOut, "goroutine ") || len(lines) > 2 {
			t.Errorf("%s %v: code %d (want %d), stderr:\n%s", c.bin, c.args, code, c.code, errOut)
		}
	}
}

// TestMeshdEmbeddedDrainedByMeshctl: `meshctl drain` stops a meshd running
// its own embedded server; meshctl reports the drain and exits 0.
func TestMeshdEmbeddedDrainedByMeshctl(t *testing.T) {
	t.Parallel()
	md := StartMeshd(t, "--name", "solo", "--listen", "127.0.0.1:0", "--http", "", "--data-dir", t.TempDir())
	out, errOut, code := meshctl(t, md.NATSURL, "drain", "solo")
	if code != 0 || !strings.Contains(out, "yes") {
		t.Fatalf("meshctl drain: code %d\n%s%s", code, out, errOut)
	}
	if code := md.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("meshd exit code = %d\n%s", code, md.Stderr())
	}
}
