package integration

import (
	"context"
	"errors"
	"fmt"
	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/syncstream"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Detection settings of the test nodes (testnode's defaults).
const (
	testHeartbeat = 250 * time.Millisecond
	testTTL       = time.Second
)

// clientNode joins the cluster's membership from the test process as a node
// that hosts nothing: a sender that learns departures like any node.
func clientNode(t *testing.T, url string, opts ...mesh.Option) *mesh.Node {
	return clientNodeTB(t, url, opts...)
}

func clientNodeTB(t testing.TB, url string, opts ...mesh.Option) *mesh.Node {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(membership.ConnNamePrefix+"tc"), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	n, err := mesh.NewNode(mesh.NodeConfig{
		Conn: nc, Name: "tc", DisableIngress: true, DisableControl: true, Logger: slog.New(slog.DiscardHandler),
		Membership: &mesh.MembershipConfig{Heartbeat: testHeartbeat, TTL: testTTL, Replicas: 3},
	}, append([]mesh.Option{mesh.WithSaturationThreshold(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// waitHosting waits until the client sees want live nodes hosting kind.
func waitHosting(t *testing.T, n *mesh.Node, kind string, want int) []subjects.NodeID {
	t.Helper()
	var h []subjects.NodeID
	natstest.Eventually(t, 30*time.Second, func() bool {
		h = n.Members().Hosting(kind)
		return len(h) == want
	}, "%d nodes hosting %q", want, kind)
	return h
}

func startTestNodes(t *testing.T, url string, names ...string) map[string]*Meshd {
	t.Helper()
	out := map[string]*Meshd{}
	for _, name := range names {
		out[name] = StartTestNode(t, "--name", name, "--nats-url", url, "--kv-replicas", "3")
	}
	return out
}

// addressesOn returns count addresses of kind that placement puts on node.
func addressesOn(kind string, node subjects.NodeID, live []subjects.NodeID, count int) []subjects.Address {
	var out []subjects.Address
	for i := 0; len(out) < count; i++ {
		a := subjects.Address(fmt.Sprintf("%s/%d", kind, i))
		if n, _ := directory.Place(a, live); n == node {
			out = append(out, a)
		}
	}
	return out
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}

// TestClusterKillOwnerFailsPromptly: SIGKILL the owner while 100 requests
// await responses: every one fails with the outcome-unknown departed verdict
// (accepted, so not resendable) within the
// detection time (asserted ≤ 2× the TTL), none waits for its timeout, and
// deliveries sent after the kill succeed on another node.
func TestClusterKillOwnerFailsPromptly(t *testing.T) {
	c := StartCluster(t, 3)
	c.WaitReady(t)
	nodes := startTestNodes(t, c.URL(), "n1", "n2", "n3")
	tc := clientNode(t, c.URL())
	live := waitHosting(t, tc, "hold", 3)
	victim := live[1]
	addrs := addressesOn("hold", victim, live, 100)

	type result struct {
		err error
		at  time.Time
	}
	results := make(chan result, len(addrs))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := tc.Stats().Accepted
	for _, a := range addrs {
		go func() {
			_, err := tc.Request(ctx, mesh.Delivery{To: a})
			results <- result{err, time.Now()}
		}()
	}
	natstest.Eventually(t, 30*time.Second, func() bool { return tc.Stats().Accepted-before >= int64(len(addrs)) },
		"all %d requests accepted", len(addrs))
	killedAt := time.Now()
	if err := nodes[victim.Name].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for range addrs {
		r := <-results
		if !errors.Is(r.err, verdict.ErrOutcomeUnknown) || !errors.Is(r.err, verdict.ErrDeparted) || verdict.IsResendable(r.err) || verdict.Classify(r.err) != verdict.Failed {
			t.Fatalf("accepted request after the owner's SIGKILL: %v; want the outcome-unknown departed verdict", r.err)
		}
		took = append(took, r.at.Sub(killedAt))
	}
	t.Logf("100 awaited responses failed after SIGKILL: p50 %v, p99 %v, max %v (TTL %v)", percentile(took, .5), percentile(took, .99), percentile(took, 1), testTTL)
	if m := percentile(took, 1); m > 2*testTTL {
		t.Errorf("slowest failure %v > 2× the detection time %v", m, testTTL)
	}
	// Deliveries after the kill go to the survivors.
	for _, a := range addrs[:10] {
		r, err := tc.Deliver(ctx, mesh.Delivery{To: a})
		if err != nil || r.Node == victim {
			t.Fatalf("delivery to %s after the kill: %+v %v", a, r, err)
		}
	}
}

// TestClusterMeshdOneActivation: three meshd processes joined to a 3-server
// cluster, all hosting echo: deliveries from any node, through the library
// and through the ingress, reach the one activation of each address.
func TestClusterMeshdOneActivation(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	c.WaitReady(t)
	var mds []*Meshd
	for i := 1; i <= 3; i++ {
		// Each meshd talks to a different server first.
		urls := append(c.URLs()[i-1:], c.URLs()[:i-1]...)
		mds = append(mds, StartMeshd(t, "--name", fmt.Sprintf("m%d", i), "--nats-url", fmt.Sprint(joinURLs(urls)), "--kv-replicas", "3", "--http", ""))
	}
	tc := clientNode(t, c.URL())
	waitHosting(t, tc, "echo", 3)
	plain, err := nats.Connect(c.URLs()[2])
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	const n = 60
	for i := 0; i < n; i++ {
		to := subjects.Address(fmt.Sprintf("echo/%d", i))
		if _, err := tc.Request(context.Background(), mesh.Delivery{To: to, Payload: []byte("x")}); err != nil {
			t.Fatalf("library request %s: %v", to, err)
		}
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress(to, "s"))
		m.Header.Set("Mesh-Expect-Response", "true")
		m.Data = []byte("y")
		r, err := plain.RequestMsg(m, 20*time.Second)
		if err != nil || r.Header.Get("Mesh-Verdict") != "Accepted" || string(r.Data) != "y" {
			t.Fatalf("ingress request %s: %v %v", to, err, r)
		}
	}
	// Ask every node for its activations over its control subject.
	seen := map[string][]string{}
	for _, md := range mds {
		var hr mesh.HubsReport
		name := md.Node[:2]
		msg, err := plain.Request(subjects.DefaultPrefix.Control(name, mesh.ControlHubs), nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := jsonUnmarshal(msg.Data, &hr); err != nil {
			t.Fatal(err)
		}
		for _, a := range hr.Addresses {
			seen[a] = append(seen[a], name)
		}
	}
	spread := map[string]int{}
	for i := 0; i < n; i++ {
		on := seen[fmt.Sprintf("echo/%d", i)]
		if len(on) != 1 {
			t.Errorf("echo/%d active on %v", i, on)
		} else {
			spread[on[0]]++
		}
	}
	t.Logf("activations per node: %v", spread)
}

// TestClusterRestartSameName: a node restarted with the same name before its
// TTL: the old generation is retired at once and a request addressed to it
// fails promptly; the old process, when it wakes, stands down.
func TestClusterRestartSameName(t *testing.T) {
	longTest(t) // the quick suite's forms: TestMeshdSameName, TestRestartSupersedesOwnGeneration
	c := StartCluster(t, 3)
	c.WaitReady(t)
	old := StartTestNode(t, "--name", "same", "--nats-url", c.URL(), "--kv-replicas", "3", "--ttl", "30s", "--heartbeat", "1s")
	tc := clientNode(t, c.URL())
	live := waitHosting(t, tc, "hold", 1)
	addr := addressesOn("hold", live[0], live, 1)[0]
	res := make(chan error, 1)
	go func() {
		_, err := tc.Request(context.Background(), mesh.Delivery{To: addr})
		res <- err
	}()
	natstest.Eventually(t, 30*time.Second, func() bool { return tc.Stats().Accepted > 0 }, "the request accepted")
	// Freeze the old process (it keeps its TCP connection for a while) and
	// start a new one with the same name.
	if err := old.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	fresh := StartTestNode(t, "--name", "same", "--nats-url", c.URL(), "--kv-replicas", "3", "--ttl", "30s", "--heartbeat", "1s")
	err := <-res
	if !errors.Is(err, verdict.ErrDeparted) {
		t.Fatalf("request to the superseded generation: %v", err)
	}
	t.Logf("request to the old generation failed %v after the new process was launched (it serves in %v; TTL 30s)", time.Since(started), time.Since(started))
	if time.Since(started) > 5*time.Second {
		t.Errorf("took %v", time.Since(started))
	}
	if err := old.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := old.Wait(t, 30*time.Second); code == 0 {
		t.Errorf("the superseded process exited 0; want an error exit")
	}
	if r, err := tc.Deliver(context.Background(), mesh.Delivery{To: addr}); err != nil || r.Node.String() != fresh.Node {
		t.Errorf("after restart: %+v %v (new node %s)", r, err, fresh.Node)
	}
}

// TestClusterFrozenOwnerFenced: SIGSTOP an owner for longer than the
// detection time, then SIGCONT: it does not serve the addresses it lost, and
// nothing it still held is handled twice.
func TestClusterFrozenOwnerFenced(t *testing.T) {
	c := StartCluster(t, 3)
	c.WaitReady(t)
	nodes := startTestNodes(t, c.URL(), "f1", "f2")
	tc := clientNode(t, c.URL())
	live := waitHosting(t, tc, "count", 2)
	victim := live[0]
	addrs := addressesOn("count", victim, live, 5)
	execs := subscribeExecs(t, c.URL())
	for _, a := range addrs {
		if _, err := tc.Request(context.Background(), mesh.Delivery{To: a, Payload: []byte("before")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nodes[victim.Name].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	natstest.Eventually(t, 20*time.Second, func() bool { return !tc.Members().Alive(victim) }, "the frozen owner declared gone")
	t.Logf("frozen owner declared gone after %v", time.Since(frozen))
	for _, a := range addrs {
		r, err := tc.Request(context.Background(), mesh.Delivery{To: a, Payload: []byte("during")})
		if err != nil || r.Node == victim {
			t.Fatalf("delivery while frozen: %+v %v", r, err)
		}
	}
	if err := nodes[victim.Name].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The woken process rejoins with a new generation; its old generation
	// serves nothing.
	natstest.Eventually(t, 20*time.Second, func() bool {
		h := tc.Members().Hosting("count")
		return len(h) == 2 && !slices.Contains(h, victim)
	}, "the woken node rejoined with a new generation")
	plain, err := nats.Connect(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	for _, a := range addrs {
		m := nats.NewMsg(subjects.DefaultPrefix.Delivery(victim, a, ""))
		m.Header.Set("Mesh-Id", "stale-"+string(a))
		r, err := plain.RequestMsg(m, 5*time.Second)
		if err == nil {
			if _, verr := verdict.Decode(r.Header); verr == nil {
				t.Errorf("the old generation accepted %s after waking", a)
			}
		} else if !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("old generation: %v", err)
		}
	}
	for _, a := range addrs {
		if got := execs.count(string(a)); got != 2 {
			t.Errorf("%s executed %d times, want 2 (before and during)", a, got)
		}
	}
}

func joinURLs(u []string) string {
	out := ""
	for i, s := range u {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}

// execLog counts test.exec events (executions in testnode's count kinds),
// one per Test-Exec nonce (a report retried after a lost answer counts once).
type execLog struct {
	mu     sync.Mutex
	events []*nats.Msg
	seen   map[string]bool
}

func (e *execLog) count(addr string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, m := range e.events {
		if m.Header.Get("Test-Address") == addr {
			n++
		}
	}
	return n
}

func subscribeExecs(t *testing.T, url string) *execLog {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	log := &execLog{seen: map[string]bool{}}
	sub, err := nc.Subscribe("test.exec", func(m *nats.Msg) {
		log.mu.Lock()
		if nonce := m.Header.Get("Test-Exec"); !log.seen[nonce] {
			log.seen[nonce] = true
			log.events = append(log.events, m)
		}
		log.mu.Unlock()
		_ = m.Respond(nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = nc.Flush()
	return log
}

// TestClusterRollingRestart: every node drained and restarted, one at a
// time, under steady traffic on 50 streams: every delivery gets exactly one
// verdict, none Failed, per-stream order holds end to end, and each accepted
// delivery is executed exactly once.
func TestClusterRollingRestart(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	c.WaitReady(t)
	names := []string{"r1", "r2", "r3"}
	nodes := startTestNodes(t, c.URL(), names...)
	tc := clientNode(t, c.URL())
	waitHosting(t, tc, "count", 3)
	execs := subscribeExecs(t, c.URL())

	type lane struct {
		addr   subjects.Address
		stream subjects.Stream
	}
	var lanes []lane
	for a := 0; a < 10; a++ {
		for s := 0; s < 5; s++ {
			lanes = append(lanes, lane{subjects.Address(fmt.Sprintf("count/a%d", a)), subjects.Stream(fmt.Sprintf("s%d", s))})
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := map[lane]int{}   // deliveries accepted per lane (seq 0..n-1)
	verdicts := map[string]int{} // by verdict
	var failures []error
	for _, l := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				// Request paces each lane by its handler (a Deliver would
				// outrun the handlers and fill the inbox: Ignored).
				_, err := tc.Request(context.Background(), mesh.Delivery{To: l.addr, Stream: l.stream, Payload: []byte(fmt.Sprint(seq))})
				mu.Lock()
				verdicts[verdict.Classify(err).String()]++
				if err == nil {
					accepted[l]++
				} else {
					failures = append(failures, err)
				}
				mu.Unlock()
				if err != nil {
					return // the lane's order is only meaningful while accepted
				}
			}
		}()
	}
	// progress waits until the lanes have had n more deliveries accepted:
	// steady traffic between restarts, measured rather than slept.
	progress := func(n int) {
		sum := func() int {
			mu.Lock()
			defer mu.Unlock()
			s := 0
			for _, v := range accepted {
				s += v
			}
			return s
		}
		target := sum() + n
		natstest.Eventually(t, 30*time.Second, func() bool { return sum() >= target }, "%d deliveries accepted (traffic stalled?)", target)
	}
	for _, name := range names {
		progress(500)
		if err := nodes[name].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := nodes[name].Wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s exit %d after SIGTERM\n%s", name, code, nodes[name].Stderr())
		}
		nodes[name] = StartTestNode(t, "--name", name, "--nats-url", c.URL(), "--kv-replicas", "3")
		waitHosting(t, tc, "count", 3)
	}
	progress(500)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range accepted {
		total += n
	}
	t.Logf("verdicts: %v; %d deliveries accepted across the restarts", verdicts, total)
	for _, err := range failures {
		t.Errorf("delivery failed: %v", err)
	}
	natstest.Eventually(t, 20*time.Second, func() bool {
		execs.mu.Lock()
		defer execs.mu.Unlock()
		return len(execs.events) >= total
	}, "%d executions reported", total)
	execs.mu.Lock()
	defer execs.mu.Unlock()
	type exec struct {
		seq int
		at  int64
	}
	byLane := map[lane][]exec{}
	for _, m := range execs.events {
		var seq int
		var at int64
		fmt.Sscan(string(m.Data), &seq)
		fmt.Sscan(m.Header.Get("Test-At"), &at)
		l := lane{subjects.Address(m.Header.Get("Test-Address")), subjects.Stream(m.Header.Get("Test-Stream"))}
		byLane[l] = append(byLane[l], exec{seq, at})
	}
	inversions, dups, missing := 0, 0, 0
	for _, l := range lanes {
		ex := byLane[l]
		slices.SortFunc(ex, func(a, b exec) int { return int(a.at - b.at) })
		seen := map[int]int{}
		for i, e := range ex {
			seen[e.seq]++
			if i > 0 && e.seq < ex[i-1].seq {
				inversions++
			}
		}
		for seq := 0; seq < accepted[l]; seq++ {
			switch seen[seq] {
			case 0:
				missing++
			case 1:
			default:
				dups++
			}
		}
	}
	t.Logf("executions: %d; inversions %d, duplicates %d, missing %d", len(execs.events), inversions, dups, missing)
	if inversions != 0 || dups != 0 || missing != 0 {
		t.Errorf("per-stream order or exactly-once broken: inversions %d, duplicates %d, missing %d", inversions, dups, missing)
	}
}

// TestClusterKillNATSServer: one NATS server of the three is killed under
// traffic: clients reconnect, traffic continues, and verdicts stay truthful
// (an error is never Accepted's opposite in disguise: a failure that is not
// resendable is a timeout or a refusal, and accepted deliveries run once).
func TestClusterKillNATSServer(t *testing.T) {
	c := StartCluster(t, 3)
	c.WaitReady(t)
	nodes := startTestNodes(t, c.URL(), "k1", "k2", "k3")
	_ = nodes
	// A delivery accepted by a node that then lost its registration (its
	// server died and its entry expired) is failed late, ShuttingDown: that
	// late verdict replaces its Accepted.
	var lateMu sync.Mutex
	late := map[string]error{}
	tc := clientNode(t, c.URLs()[0]+","+c.URLs()[1]+","+c.URLs()[2], mesh.WithLateVerdicts(func(v mesh.LateVerdict) {
		lateMu.Lock()
		late[v.ID] = v.Err
		lateMu.Unlock()
	}))
	waitHosting(t, tc, "count", 3)
	execs := subscribeExecs(t, c.URLs()[1]+","+c.URLs()[2])

	var mu sync.Mutex
	verdicts := map[string]int{}
	accepted := map[string]bool{}
	var errs []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for s := 0; s < 20; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("kn-%d-%d", s, i)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, err := tc.Deliver(ctx, mesh.Delivery{ID: id, To: subjects.Address(fmt.Sprintf("count/k%d", s%7)), Stream: subjects.Stream(fmt.Sprint(s))})
				cancel()
				mu.Lock()
				verdicts[verdict.Classify(err).String()]++
				if err == nil {
					accepted[id] = true
				} else {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted)
	}
	waitFor := func(n int) {
		natstest.Eventually(t, 60*time.Second, func() bool { return count() >= n }, "%d deliveries accepted (traffic stalled?)", n)
	}
	waitFor(500)
	c.Kill(0)
	killedAt := count()
	waitFor(killedAt + 2000) // traffic continues after the kill
	close(stop)
	wg.Wait()
	mu.Lock()
	t.Logf("verdicts around the server kill: %v", verdicts)
	kinds := map[string]int{}
	for _, err := range errs {
		kinds[fmt.Sprintf("%s/%s", verdict.Classify(err), rootCause(err))]++
	}
	t.Logf("failures by verdict/cause: %v", kinds)
	for _, err := range errs {
		// Truthful: anything not accepted is classified, and a timeout is
		// never called resendable.
		if errors.Is(err, context.DeadlineExceeded) && verdict.IsResendable(err) {
			t.Errorf("a timeout classified resendable: %v", err)
		}
	}
	mu.Unlock()
	deadline := time.Now().Add(40 * time.Second)
	for {
		execs.mu.Lock()
		n := 0
		ids := map[string]int{}
		for _, m := range execs.events {
			ids[m.Header.Get("Mesh-Id")]++
		}
		execs.mu.Unlock()
		lateMu.Lock()
		for id := range accepted {
			if ids[id] >= 1 {
				n++
			} else if err, ok := late[id]; ok {
				if !verdict.IsResendable(err) {
					t.Errorf("%s: late verdict %v is not resendable", id, err)
				}
				n++ // truthfully failed late: not executed
			}
		}
		lateFailed := len(late)
		lateMu.Unlock()
		if n == len(accepted) {
			t.Logf("%d accepted deliveries were failed late (ShuttingDown) by a node that lost its registration", lateFailed)
			dups := 0
			for _, k := range ids {
				if k > 1 {
					dups++
				}
			}
			t.Logf("%d accepted deliveries all executed; %d executed more than once", n, dups)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d accepted deliveries executed", n, len(accepted))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rootCause names the innermost recognisable cause of err.
func rootCause(err error) string {
	for _, e := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders, nats.ErrDisconnected, nats.ErrConnectionClosed, verdict.ErrDeparted, verdict.ErrHubShuttingDown, verdict.ErrNotOwner, verdict.ErrDirectoryUnavailable} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return err.Error()
}

// TestClusterIngressFailsPromptly: a raw nats.go client (not the mesh
// library) awaits responses through the ingress from an owner that is then
// SIGKILLed: the ingress answers at once — Failed/outcome-unknown (they were
// accepted), ShuttingDown/departed for those marked Mesh-Idempotent —
// instead of letting the client wait out its timeout.
func TestClusterIngressFailsPromptly(t *testing.T) {
	longTest(t) // the quick suite's form, in one process: mesh's TestIngressOwnerCrash
	c := StartCluster(t, 3)
	c.WaitReady(t)
	victim := StartTestNode(t, "--name", "v", "--nats-url", c.URLs()[0], "--kv-replicas", "3", "--ingress=false")
	gateway := StartTestNode(t, "--name", "g", "--nats-url", c.URLs()[1], "--kv-replicas", "3", "--http", "127.0.0.1:0")
	tc := clientNode(t, c.URLs()[2])
	live := waitHosting(t, tc, "hold", 2)
	var vid subjects.NodeID
	for _, n := range live {
		if n.Name == "v" {
			vid = n
		}
	}
	addrs := addressesOn("hold", vid, live, 20)
	raw, err := nats.Connect(c.URLs()[2])
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	type res struct {
		msg *nats.Msg
		err error
		at  time.Time
	}
	out := make(chan res, len(addrs))
	for i, a := range addrs {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress(a, ""))
		m.Header.Set("Mesh-Id", fmt.Sprintf("raw-%d", i))
		m.Header.Set("Mesh-Expect-Response", "true")
		if i%2 == 0 {
			m.Header.Set("Mesh-Idempotent", "true")
		}
		go func() {
			r, err := raw.RequestMsg(m, 30*time.Second)
			out <- res{r, err, time.Now()}
		}()
	}
	// Wait until the victim holds them all (its queued + running count).
	natstest.Eventually(t, 20*time.Second, func() bool {
		msg, err := raw.Request(subjects.DefaultPrefix.Control("v", mesh.ControlStats), nil, 2*time.Second)
		var st mesh.NodeStatus
		return err == nil && jsonUnmarshal(msg.Data, &st) == nil && st.Host.Accepted == int64(len(addrs))
	}, "the victim holding every request")
	killed := time.Now()
	if err := victim.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for range addrs {
		r := <-out
		if r.err != nil {
			t.Fatalf("raw request: %v", r.err)
		}
		v, reason := r.msg.Header.Get("Mesh-Verdict"), r.msg.Header.Get("Mesh-Reason")
		var idem int
		fmt.Sscanf(r.msg.Header.Get("Mesh-Id"), "raw-%d", &idem)
		want, wantReason := "Failed", "outcome-unknown" // accepted, then the owner died: not resendable
		if idem%2 == 0 {
			want, wantReason = "ShuttingDown", "departed" // Mesh-Idempotent: resendable
		}
		if v != want || reason != wantReason {
			t.Fatalf("ingress answer to %s: %s %s %q; want %s %s", r.msg.Header.Get("Mesh-Id"), v, reason, r.msg.Header.Get("Mesh-Message"), want, wantReason)
		}
		took = append(took, r.at.Sub(killed))
	}
	t.Logf("ingress answered %d raw requests ShuttingDown: p50 %v, max %v after the owner's SIGKILL", len(took), percentile(took, .5), percentile(took, 1))
	if m := percentile(took, 1); m > 2*testTTL {
		t.Errorf("slowest ingress answer %v", m)
	}
	// The gateway's metrics show the departure and how fast it was seen.
	m := regexp.MustCompile(`(?m)^testnode: http (\S+)$`).FindStringSubmatch(gateway.Stdout())
	if m == nil {
		t.Fatalf("no http address in %q", gateway.Stdout())
	}
	// The membership watcher counts the event on its own goroutine, which
	// may follow the cluster view that failed the requests: poll.
	wants := []string{`natsmesh_membership_events_total{type="disconnected"} 1`, `natsmesh_departure_detection_seconds_count{how="disconnected"} 1`}
	var body string
	natstest.Eventually(t, 10*time.Second, func() bool {
		_, body = httpGet(t, "http://"+m[1]+"/metrics")
		for _, want := range wants {
			if !strings.Contains(body, want) {
				return false
			}
		}
		return true
	}, "/metrics shows the departure (%s); membership lines:\n%s", strings.Join(wants, ", "),
		lazy(func() string {
			return grepLines(body, "natsmesh_membership_events_total", "natsmesh_departure_detection_seconds_count")
		}))
}

// lazy formats as f's result when the message is printed (after the poll).
type lazy func() string

func (l lazy) String() string { return l() }

// grepLines returns the lines of s that start with one of prefixes.
func grepLines(s string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestClusterClaimRace: two nodes on different servers of the cluster race
// to activate the same 1 000 addresses: exactly one activation each.
func TestClusterClaimRace(t *testing.T) {
	longTest(t)
	c := StartCluster(t, 3)
	c.WaitReady(t)
	var nodes []*mesh.Node
	for i, name := range []string{"ra", "rb"} {
		nc, err := nats.Connect(c.URLs()[i], nats.Name(membership.ConnNamePrefix+name))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		n, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: name, DisableIngress: true, DisableControl: true, Logger: slog.New(slog.DiscardHandler),
			Membership: &mesh.MembershipConfig{Heartbeat: testHeartbeat, TTL: testTTL, Replicas: 3}})
		if err != nil {
			t.Fatal(err)
		}
		_ = n.Register("race", func(context.Context, subjects.Address) (hub.Hub, error) {
			return hub.HandlerFunc(func(context.Context, *hub.Delivery) error { return nil }), nil
		})
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		nodes = append(nodes, n)
	}
	const count = 1000
	var wg sync.WaitGroup
	for k, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < count; j++ {
				i := j
				if k == 1 {
					i = count - 1 - j // from the other end: the two meet and contend
				}
				release, err := n.Host().Activate(context.Background(), subjects.Address(fmt.Sprintf("race/%d", i)))
				if err == nil {
					release()
				} else if !errors.Is(err, verdict.ErrNotOwner) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	on := map[subjects.Address]int{}
	for _, n := range nodes {
		for _, a := range n.Host().Addresses() {
			on[a]++
		}
	}
	if len(on) != count {
		t.Errorf("%d addresses active, want %d", len(on), count)
	}
	for a, k := range on {
		if k != 1 {
			t.Errorf("%s active on %d nodes", a, k)
		}
	}
	t.Logf("claims: %s %d, %s %d", nodes[0].ID(), nodes[0].Directory().Owned(), nodes[1].ID(), nodes[1].Directory().Owned())
}

// TestClusterSubscriberFollowsKilledOwner: a sync-stream subscriber whose
// owner's process is SIGKILLed converges on the new activation (another
// node) by itself; the time from the kill to the first frame of the new
// epoch is reported.
func TestClusterSubscriberFollowsKilledOwner(t *testing.T) {
	longTest(t) // the quick suite's form, in one process: syncstream's TestOwnerKilledResubscribes
	c := StartCluster(t, 3)
	c.WaitReady(t)
	nodes := startTestNodes(t, c.URL(), "s1", "s2")
	tc := clientNode(t, c.URLs()[2])
	live := waitHosting(t, tc, hubs.KVKind, 2)
	addr := addressesOn(hubs.KVKind, live[0], live, 1)[0]
	var mu sync.Mutex
	var epochs []uint64
	var firstNew time.Time
	ss, err := syncstream.Subscribe(context.Background(), tc, addr, "", func(f syncstream.Frame) {
		mu.Lock()
		defer mu.Unlock()
		if len(epochs) > 0 && f.Epoch != epochs[len(epochs)-1] && firstNew.IsZero() {
			firstNew = time.Now()
		}
		epochs = append(epochs, f.Epoch)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	if _, err := tc.Request(context.Background(), mesh.Delivery{To: addr, Type: hubs.KVSet, Payload: []byte("a=1")}); err != nil {
		t.Fatal(err)
	}
	// The owner answers the subscribe on acceptance and sends its snapshot
	// afterwards, on its own lane to the subscriber: kill it only once the
	// subscriber has applied that snapshot, or there is no first owner to
	// follow away from (the new activation's snapshot would be the first).
	if !natstest.Poll(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(epochs) > 0
	}) {
		a, st, rs := ss.Stats()
		t.Fatalf("the first owner's snapshot never reached the subscriber: applied %d stale %d resubscribes %d", a, st, rs)
	}
	killed := time.Now()
	if err := nodes[live[0].Name].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !natstest.Poll(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !firstNew.IsZero()
	}) {
		a, st, rs := ss.Stats()
		e, v := ss.Position()
		t.Fatalf("the subscriber did not follow the owner to a new activation: applied %d stale %d resubscribes %d position (%d,%d) err %v members %v\nsurvivor stderr:\n%s",
			a, st, rs, e, v, ss.Err(), tc.Members().Members(), nodes[live[1].Name].Stderr())
	}
	mu.Lock()
	t.Logf("subscriber converged on the new activation %v after the owner's SIGKILL", firstNew.Sub(killed))
	mu.Unlock()
}
