package integration

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

// buildExample builds ./examples/<name> into a temporary directory.
func buildExample(t *testing.T, name string) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", append(goBuild(), "-o", out, "./examples/"+name)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/%s: %v\n%s", name, err, b)
	}
	return out
}

var rawSummaryRe = regexp.MustCompile(`sent (\d+), failed (\d+), slowest (\S+); re-sent: (\d+) after a resendable verdict, (\d+) after no responders, (\d+) after a dropped connection; moves on lame duck: (\d+)`)

// TestRawIngressLameDuck (issue 24, item 3): a raw ingress caller that
// follows docs/operations.md §12 (examples/rawingress: move on the lame duck
// notice, re-send only what is resendable, and what a dropped connection
// lost, under the same Mesh-Id) sees a rolling restart of all three NATS
// servers, each in lame duck mode, under its traffic: every request is
// answered Accepted, and none waits anywhere near a timeout. A caller that
// ignores the rules (-naive) runs beside it for comparison.
func TestRawIngressLameDuck(t *testing.T) {
	longTest(t)
	c := StartCluster(t, 3)
	c.WaitReady(t)
	for i := range 3 {
		StartMeshd(t, "--name", "n"+strconv.Itoa(i), "--nats-url", c.URL(), "--kv-replicas", "3", "--http", "")
	}
	bin := buildExample(t, "rawingress")
	t.Setenv("NATS_URL", c.URL()) // the callers' environment (Start passes it on)
	caller := Start(t, bin, "-n", "0", "-q", "echo/lameduck", "hello")
	naive := Start(t, bin, "-n", "0", "-q", "-naive", "echo/lameduck-naive", "hello")
	// Traffic flows before the restarts.
	raw, err := nats.Connect(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ingressed := func() int64 {
		var sum int64
		for i := range 3 {
			msg, err := raw.Request(subjects.DefaultPrefix.Control("n"+strconv.Itoa(i), mesh.ControlStats), nil, 2*time.Second)
			var st mesh.NodeStatus
			if err == nil && jsonUnmarshal(msg.Data, &st) == nil {
				sum += st.Ingress
			}
		}
		return sum
	}
	natstest.Eventually(t, 20*time.Second, func() bool { return ingressed() > 100 }, "the callers' requests flowing")
	for i := range c.N() {
		c.LameDuck(i)
		c.Restart(i)
		c.WaitReady(t)
	}
	for _, p := range []*Process{caller, naive} {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	naive.Wait(t, 90*time.Second)
	code := caller.Wait(t, 90*time.Second)
	m := rawSummaryRe.FindStringSubmatch(caller.Stdout())
	nm := rawSummaryRe.FindStringSubmatch(naive.Stdout())
	if m == nil || nm == nil {
		t.Fatalf("no summary line\ncaller:\n%s\n%s\nnaive:\n%s", caller.Stdout(), caller.Stderr(), naive.Stdout())
	}
	t.Logf("rule-following caller: %s", m[0])
	t.Logf("naive caller:          %s", nm[0])
	sent, _ := strconv.Atoi(m[1])
	slowest, perr := time.ParseDuration(m[3])
	if perr != nil {
		t.Fatal(perr)
	}
	if code != 0 || m[2] != "0" {
		t.Errorf("the caller failed %s of %s requests (exit %d):\n%s", m[2], m[1], code, caller.Stdout())
	}
	if sent < 100 {
		t.Errorf("only %d requests sent during the restarts", sent)
	}
	if slowest > 5*time.Second {
		t.Errorf("slowest request %v: a reply was lost and waited for", slowest)
	}
	if m[7] == "0" {
		t.Errorf("the caller never saw a lame duck notice")
	}
}
