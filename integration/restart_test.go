package integration

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestRestartSupersedesOwnGeneration (issue 24, item 5): meshd holds an OS
// lock on its --data-dir. On a server that publishes no disconnect
// advisories (only the registry TTL, 30 s here, detects a crash):
//
//   - a second meshd on the same directory, even while the first is
//     frozen (SIGSTOP: alive, so the lock is still held), exits 2 with one
//     line and writes nothing;
//   - after a SIGKILL, meshd restarted on the same directory supersedes its
//     own previous generation at once (the lock proves it gone): it serves
//     well under the TTL, the survivor learns the old generation is gone
//     with the proof, and the crashed generation's addresses are taken
//     over without a fencing delay;
//   - callers see nothing wrong: under write traffic through the ingress,
//     every answer is Accepted, resendable (ShuttingDown) or, for a write
//     in flight at the kill, outcome-unknown; resending the resendable ones
//     completes every write, and each address's stored value after the
//     restart is its last acknowledged write (or the one whose outcome was
//     unknown).
func TestRestartSupersedesOwnGeneration(t *testing.T) {
	t.Parallel()
	s := StartNATSServer(t)
	const ttl = 30 * time.Second
	dirA, dirB := t.TempDir(), t.TempDir()
	args := func(name, dir string) []string {
		return []string{"--name", name, "--nats-url", s.URL, "--data-dir", dir, "--ttl", ttl.String(), "--heartbeat", "1s", "--http", ""}
	}
	a := StartMeshd(t, args("a", dirA)...)
	b := StartMeshd(t, args("b", dirB)...)
	raw, err := nats.Connect(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()

	// A second meshd on a's directory, with a's name or another: refused
	// at once, one line, exit 2.
	for _, name := range []string{"a", "other"} {
		out, errOut, code := Run(t, 30*time.Second, nil, Build(t).Meshd, args(name, dirA)...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || len(lines) != 1 || !strings.Contains(errOut, "held by another meshd") || !strings.Contains(errOut, "pid ") {
			t.Fatalf("second meshd (%s) on a's data dir: exit %d, stdout %q, stderr %q; want exit 2 and one line", name, code, out, errOut)
		}
		t.Logf("second meshd on a's data dir: exit %d: %s", code, lines[0])
	}

	// Addresses owned by a: kv addresses whose first write a accepts.
	var addrs []subjects.Address
	for i := 0; len(addrs) < 6; i++ {
		addr := subjects.Address(fmt.Sprintf("kv/r%d", i))
		r, _, err := ingressKV(raw, addr, "set", "n=0", fmt.Sprintf("init-%d", i), 10*time.Second)
		if err != nil || r.Header.Get("Mesh-Verdict") != "Accepted" {
			t.Fatalf("first write to %s: %v %v", addr, err, r)
		}
		if r.Header.Get("Mesh-Node") == a.Node {
			addrs = append(addrs, addr)
		}
	}

	// A frozen a still holds the lock: a restart on its directory is
	// refused (it must not supersede a live process).
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := Run(t, 30*time.Second, nil, Build(t).Meshd, args("a", dirA)...)
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code != 2 || !strings.Contains(errOut, "held by another meshd") {
		t.Fatalf("meshd on the directory of a frozen a: exit %d, %q; want exit 2", code, errOut)
	}

	// Write traffic from a mesh sender (a raw ingress client whose request
	// the dying node itself took from the queue group would wait out its
	// timeout, the documented exception): one writer per address, each
	// write awaited; a resendable verdict is re-sent under the same ID.
	tc := clientNode(t, s.URL)
	type tally struct {
		acked   atomic.Int64 // last acknowledged n
		unknown atomic.Int64 // n whose outcome is unknown (0: none)
	}
	tallies := make([]*tally, len(addrs))
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wrong []string
	seen := map[string]int{}
	for i, addr := range addrs {
		tl := &tally{}
		tallies[i] = tl
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; !stop.Load(); n++ {
				d := mesh.Delivery{To: addr, ID: fmt.Sprintf("%s-%d", addr, n), Type: "set", Payload: []byte(fmt.Sprintf("n=%d", n))}
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
					_, err := tc.Request(ctx, d)
					cancel()
					mu.Lock()
					seen[verdict.Classify(err).String()+"/"+verdict.ReasonOf(err).String()]++
					mu.Unlock()
					switch {
					case err == nil:
						tl.acked.Store(int64(n))
					case verdict.IsResendable(err):
						continue // the same ID again
					case errors.Is(err, verdict.ErrOutcomeUnknown) && tl.unknown.Load() == 0:
						tl.unknown.Store(int64(n))
					default:
						mu.Lock()
						wrong = append(wrong, fmt.Sprintf("%s: %v", d.ID, err))
						mu.Unlock()
						return
					}
					break
				}
			}
		}()
	}
	natstest.Eventually(t, 20*time.Second, func() bool {
		for _, tl := range tallies {
			if tl.acked.Load() < 5 {
				return false
			}
		}
		return true
	}, "writes acknowledged on every address")

	if err := a.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.Wait(t, 10*time.Second)
	restarted := time.Now()
	a2 := StartMeshd(t, args("a", dirA)...)
	serving := time.Since(restarted)
	if !strings.Contains(a2.Stderr(), "superseding it at once") {
		t.Errorf("the restarted meshd did not say it superseded its predecessor at once:\n%s", a2.Stderr())
	}
	// Every address is written again, by the new generation.
	before := make([]int64, len(addrs))
	for i, tl := range tallies {
		before[i] = tl.acked.Load()
	}
	natstest.Eventually(t, ttl, func() bool {
		for i, tl := range tallies {
			if tl.acked.Load() <= before[i] {
				return false
			}
		}
		return true
	}, "writes acknowledged again on every address after the restart")
	resumed := time.Since(restarted)
	stop.Store(true)
	wg.Wait()
	t.Logf("restarted meshd serving %v after its launch, every address written again %v after it (TTL %v); answers seen: %v", serving, resumed, ttl, seen)
	if serving > ttl/4 || resumed > ttl/4 {
		t.Errorf("restart took %v to serve and %v to take the addresses over; want well under the TTL %v", serving, resumed, ttl)
	}
	if len(wrong) > 0 {
		t.Errorf("caller-visible wrongness: %v", wrong)
	}
	// The survivor learned the old generation was gone by the proof.
	depRe := regexp.MustCompile(`"msg":"node departed".*"departed":"` + regexp.QuoteMeta(a.Node) + `".*"how":"superseded".*proved its process gone`)
	natstest.Eventually(t, 10*time.Second, func() bool { return depRe.MatchString(b.Stderr()) }, "b logging a's departure as proven")
	// Each address's stored value is its last acknowledged write, or the
	// later one whose outcome was unknown (then acknowledged by its resend
	// or not).
	for i, addr := range addrs {
		r, _, err := ingressKV(raw, addr, "get", "n", "final-"+string(addr), 10*time.Second)
		if err != nil || r.Header.Get("Mesh-Verdict") != "Accepted" {
			t.Fatalf("read %s: %v %v", addr, err, r)
		}
		got, _ := strconv.ParseInt(string(r.Data), 10, 64)
		if acked := tallies[i].acked.Load(); got != acked && got != acked+1 {
			t.Errorf("%s holds n=%d; last acknowledged n=%d", addr, got, acked)
		}
		if node := r.Header.Get("Mesh-Node"); node != a2.Node {
			t.Logf("%s read on %s (restarted a is %s)", addr, node, a2.Node)
		}
	}
}

// TestMeshdDrainCommand: "meshd drain --data-dir DIR" (the Kubernetes
// preStop hook of deploy/kubernetes) drains the meshd holding DIR and
// returns once it has exited: that meshd's drain is clean (exit 0), and
// its registry entry is gone (a graceful leave). With no meshd on the
// directory it has nothing to do and exits 0.
func TestMeshdDrainCommand(t *testing.T) {
	t.Parallel()
	s := StartNATSServer(t)
	dir := t.TempDir()
	m := StartMeshd(t, "--name", "d", "--nats-url", s.URL, "--data-dir", dir, "--http", "")
	out, errOut, code := Run(t, 60*time.Second, nil, Build(t).Meshd, "drain", "--data-dir", dir, "--timeout", "45s")
	if code != 0 || !strings.Contains(out, "drained and exited") {
		t.Fatalf("meshd drain: exit %d, %q %q", code, out, errOut)
	}
	if c := m.Wait(t, time.Second); c != 0 {
		t.Errorf("the drained meshd exited %d; want 0 (a clean drain)\n%s", c, m.Stderr())
	}
	if !strings.Contains(m.Stderr(), `"msg":"drained"`) {
		t.Errorf("the meshd did not log its drain:\n%s", m.Stderr())
	}
	t.Logf("meshd drain: %s", strings.TrimSpace(out))
	out, errOut, code = Run(t, 30*time.Second, nil, Build(t).Meshd, "drain", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "nothing to drain") {
		t.Errorf("meshd drain with no meshd: exit %d, %q %q", code, out, errOut)
	}
}

// TestMeshdDrainCommandCutShort: "meshd drain" says so when the drain was
// not clean — here the node's NATS server is gone, so its drain is cut
// short by --drain-timeout — instead of "drained and exited" with exit 0
// (a fresh-user trial: the preStop hook reported success while the node
// logged "drain cut short"). The node records how its run ended in its
// data directory before it lets the lock go; a node killed outright
// records nothing, which meshd drain reports as not clean too.
func TestMeshdDrainCommandCutShort(t *testing.T) {
	t.Parallel()
	s := StartNATSServer(t)
	dir := t.TempDir()
	m := StartMeshd(t, "--name", "c", "--nats-url", s.URL, "--data-dir", dir, "--http", "", "--drain-timeout", "1s")
	_ = s.Signal(syscall.SIGKILL)
	s.Wait(t, 10*time.Second)
	out, errOut, code := Run(t, 60*time.Second, nil, Build(t).Meshd, "drain", "--data-dir", dir, "--timeout", "30s")
	if code != 2 || strings.Contains(out, "drained and exited") || !strings.Contains(errOut, "without a clean drain") {
		t.Fatalf("meshd drain of a node whose drain was cut short: exit %d, %q %q; want exit 2 saying it was not clean", code, out, errOut)
	}
	if c := m.Wait(t, 5*time.Second); c == 0 {
		t.Errorf("the meshd whose drain was cut short exited 0")
	}
	t.Logf("meshd drain: %s", strings.TrimSpace(errOut))
}
