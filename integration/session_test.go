package integration

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMeshdDrainBoundNATSUnreachable: meshd exits within --drain-timeout
// plus a small fixed margin when its NATS server is gone (killed) while it
// drains; it used to take 13 s with a 3 s deadline.
func TestMeshdDrainBoundNATSUnreachable(t *testing.T) {
	t.Parallel()
	ns := StartNATSServer(t)
	md := StartMeshd(t, "--name", "bound", "--nats-url", ns.URL, "--http", "", "--drain-timeout", "1s")
	if err := ns.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	ns.Wait(t, 10*time.Second)
	start := time.Now()
	if err := md.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := md.Wait(t, 30*time.Second)
	took := time.Since(start)
	t.Logf("meshd --drain-timeout 1s, NATS killed: exited %d after %v", code, took)
	if took > 1*time.Second+2*time.Second {
		t.Errorf("meshd took %v to exit with --drain-timeout 1s\n%s", took, md.Stderr())
	}
}

// TestMeshdSameName: a second meshd with a live node's name exits at once
// with one clear line and leaves the live node alone; with --replace it
// takes the name over and the old process exits.
func TestMeshdSameName(t *testing.T) {
	t.Parallel()
	ns := StartNATSServer(t)
	first := StartMeshd(t, "--name", "same", "--nats-url", ns.URL, "--http", "")
	stdout, stderr, code := Run(t, 30*time.Second, nil, Build(t).Meshd, "--name", "same", "--nats-url", ns.URL, "--http", "", "--log-format", "json")
	lines := 0
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if strings.HasPrefix(l, "meshd:") {
			lines++
		}
	}
	if code != 2 || lines != 1 || !strings.Contains(stderr, "name in use") || !strings.Contains(stderr, "--replace") {
		t.Fatalf("second meshd with a live name: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	out, _, code := meshctl(t, ns.URL, "nodes")
	if gen := strings.TrimPrefix(first.Node, "same."); code != 0 || !strings.Contains(out, gen) {
		t.Fatalf("the live node is not listed after the refused start: %d %s", code, out)
	}
	second := StartMeshd(t, "--name", "same", "--nats-url", ns.URL, "--http", "", "--replace")
	if second.Node == first.Node {
		t.Fatal("--replace kept the generation")
	}
	if code := first.Wait(t, 30*time.Second); code == 0 {
		t.Errorf("the replaced meshd exited 0; want an error exit")
	}
	t.Logf("replaced %s by %s", first.Node, second.Node)
}
