package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// The scenarios of issue 9 (DESIGN §6): a 3-server NATS cluster, three
// testnode processes with the production membership defaults, and a sender
// node in the test with steady Deliver and Request traffic on 30 lanes
// (10 addresses × 3 streams; each lane alternates a Deliver and a Request,
// one at a time), while the NATS side fails. Every handler execution is
// logged with its node and its start and end times; every factory run too.
// Each scenario asserts: no node changes generation unless DESIGN §6 says
// it must; no hub factory runs again for an address that stayed put; no
// two nodes run turns for one address at overlapping times; 0 Failed; no
// delivery waits longer than a few seconds; one verdict each; 0 inversions.
// It logs the figures (generations before/after, factory runs, overlapping
// turns, verdict counts, worst latency).
//
// In CI each scenario runs once; with -chaos=D (see chaos_test.go) each runs
// max(1, D/30s) times:
//
//	go test ./integration -run 'TestScenario' -v -args -chaos=10m

// scenarioReps is how many times each scenario runs.
func scenarioReps() int {
	if *chaosDuration <= 8*time.Second {
		return 1
	}
	return max(1, int(*chaosDuration/(30*time.Second)))
}

// prodNodeArgs are testnode flags with the production membership defaults.
func prodNodeArgs(name, url string) []string {
	return []string{"--name", name, "--nats-url", url, "--kv-replicas", "3", "--report-factories",
		"--ttl", membership.DefaultTTL.String(), "--heartbeat", membership.DefaultHeartbeat.String()}
}

// senderNode is the test's sending node: production membership defaults and
// the node connection settings.
func senderNode(t *testing.T, url string, late func(mesh.LateVerdict), opts ...mesh.Option) *mesh.Node {
	t.Helper()
	n, _ := senderNodeConn(t, url, late, opts...)
	return n
}

// senderNodeConn is senderNode that also returns the node's connection.
func senderNodeConn(t *testing.T, url string, late func(mesh.LateVerdict), opts ...mesh.Option) (*mesh.Node, *nats.Conn) {
	t.Helper()
	log := &natstest.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sender log:\n%s", log.String())
		}
	})
	var nodeRef atomic.Pointer[mesh.Node]
	nc, err := nats.Connect(url, nats.Name(membership.ConnNamePrefix+"sender"), nats.MaxReconnects(-1),
		nats.ReconnectWait(membership.ClientReconnectWait), nats.PingInterval(membership.ClientPingInterval),
		nats.MaxPingsOutstanding(membership.ClientMaxPingsOut), mesh.LameDuckHandler(&nodeRef))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	n, err := mesh.NewNode(mesh.NodeConfig{
		Conn: nc, Name: "sender", DisableIngress: true, DisableControl: true, Logger: slog.New(slog.NewJSONHandler(log, nil)),
		Membership: &mesh.MembershipConfig{Replicas: 3},
	}, append([]mesh.Option{mesh.WithSaturationThreshold(0), mesh.WithLateVerdicts(late)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	nodeRef.Store(n)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, nc
}

// factoryLog records test.factory events.
type factoryLog struct {
	mu     sync.Mutex
	seen   map[string]bool
	byAddr map[string][]string // address -> nodes, in order
}

func subscribeFactories(t *testing.T, url string) *factoryLog {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f := &factoryLog{seen: map[string]bool{}, byAddr: map[string][]string{}}
	if _, err := nc.Subscribe("test.factory", func(m *nats.Msg) {
		f.mu.Lock()
		if n := m.Header.Get("Test-Exec"); !f.seen[n] {
			f.seen[n] = true
			a := m.Header.Get("Test-Address")
			f.byAddr[a] = append(f.byAddr[a], m.Header.Get("Test-Node"))
		}
		f.mu.Unlock()
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	return f
}

// deliveryID names a lane's seq-th delivery.
func deliveryID(l laneKey, seq int) string { return fmt.Sprintf("%s.%s.%d", l.addr, l.stream, seq) }

type laneKey struct {
	addr   subjects.Address
	stream subjects.Stream
}

// sent is one delivery's outcome.
type sent struct {
	lane    laneKey
	seq     int
	request bool
	took    time.Duration
	err     error
}

// traffic drives the 30 lanes.
type traffic struct {
	t     *testing.T
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	out   []sent
	lanes []laneKey
}

func startTraffic(t *testing.T, n *mesh.Node) *traffic {
	tr := &traffic{t: t, stop: make(chan struct{})}
	for a := range 10 {
		for s := range 3 {
			tr.lanes = append(tr.lanes, laneKey{subjects.Address(fmt.Sprintf("count/s%d", a)), subjects.Stream(fmt.Sprintf("l%d", s))})
		}
	}
	for _, l := range tr.lanes {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-tr.stop:
					return
				default:
				}
				d := mesh.Delivery{ID: deliveryID(l, seq), To: l.addr, Stream: l.stream, Payload: []byte(strconv.Itoa(seq))}
				ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
				start := time.Now()
				var err error
				req := seq%2 == 1
				if req {
					_, err = n.Request(ctx, d)
				} else {
					_, err = n.Deliver(ctx, d)
				}
				cancel()
				tr.mu.Lock()
				tr.out = append(tr.out, sent{lane: l, seq: seq, request: req, took: time.Since(start), err: err})
				tr.mu.Unlock()
			}
		}()
	}
	return tr
}

func (tr *traffic) accepted() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, s := range tr.out {
		if s.err == nil {
			n++
		}
	}
	return n
}

// progress waits until n more deliveries were accepted.
func (tr *traffic) progress(n int) {
	target := tr.accepted() + n
	natstest.Eventually(tr.t, 60*time.Second, func() bool { return tr.accepted() >= target }, "%d deliveries accepted (traffic stalled?)", target)
}

func (tr *traffic) finish() []sent {
	close(tr.stop)
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.out)
}

// generations returns each live node name's generation as sender sees it.
func generations(n *mesh.Node, names []string) map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range n.Members().Members() {
		if slices.Contains(names, m.Node.Name) {
			out[m.Node.Name] = m.Node.Generation
		}
	}
	return out
}

// expect says which rules a scenario asserts.
type expect struct {
	// sameGenerations: no node changes generation (nothing proves a
	// process gone).
	sameGenerations bool
	// maxWait bounds the worst delivery latency.
	maxWait time.Duration
	// noLostResponses: no accepted Request's answer may be lost either
	// (0 Failed of any kind): nothing proves an owner gone, and the
	// sender moves its own connection off a server in lame duck mode
	// before the server closes it (mesh.LameDuckHandler).
	noLostResponses bool
}

// scenarioReport is what a scenario measured.
type scenarioReport struct {
	gensBefore, gensAfter map[string]uint64
	factoryRuns           int // in all
	refactored            []string
	overlaps              int
	verdicts              map[string]int
	worst                 time.Duration
	inversions, dups      int
	missing               int            // accepted, never executed, no late verdict
	lateFailed            int            // accepted, then failed late (not executed)
	lostResponses         int            // Requests accepted whose answer was lost (outcome unknown, or a deadline while awaited)
	lostBy                map[string]int // lostResponses by cause
	executions            int
}

func (r scenarioReport) String() string {
	return fmt.Sprintf("generations before %v after %v; factory runs %d (again for %d addresses: %v); overlapping turns %d; verdicts %v (of the Failed, %d Requests accepted whose answer was lost: outcome unknown, by cause %v); worst latency %v (the lost responses aside); executions %d, accepted then failed late %d, duplicates %d, missing %d, inversions %d",
		r.gensBefore, r.gensAfter, r.factoryRuns, len(r.refactored), r.refactored, r.overlaps, r.verdicts, r.lostResponses, r.lostBy, r.worst.Round(time.Millisecond), r.executions, r.lateFailed, r.dups, r.missing, r.inversions)
}

// runScenario starts the cluster, the sender and the execution logs, and
// runs fault, which starts the nodes and the traffic (s.start), injects its
// faults and checks (s.check).
func runScenario(t *testing.T, fault func(s *scenario)) scenarioReport {
	c := StartCluster(t, 3)
	c.WaitReady(t)
	s := &scenario{t: t, c: c, names: []string{"n1", "n2", "n3"}, nodes: map[string]*Meshd{}}
	s.execs = subscribeExecs(t, c.URL())
	s.factories = subscribeFactories(t, c.URL())
	s.late = map[string]error{}
	s.sender = senderNode(t, c.URL(), func(v mesh.LateVerdict) {
		s.lateMu.Lock()
		s.late[v.ID] = v.Err
		s.lateMu.Unlock()
	})
	fault(s) // setup part: s.start is called by fault
	return s.report
}

type scenario struct {
	t         *testing.T
	c         *Cluster
	names     []string
	nodes     map[string]*Meshd
	sender    *mesh.Node
	execs     *execLog
	factories *factoryLog
	tr        *traffic
	before    map[string]uint64
	lateMu    sync.Mutex
	late      map[string]error // late verdicts by delivery ID
	report    scenarioReport
}

// start launches the nodes (url picks each one's NATS URL) and the traffic.
func (s *scenario) start(url func(name string) string) {
	s.startIdle(url)
	s.startTraffic()
}

// startIdle launches the nodes without traffic.
func (s *scenario) startIdle(url func(name string) string) {
	for _, name := range s.names {
		s.nodes[name] = StartTestNode(s.t, prodNodeArgs(name, url(name))...)
	}
	// Registered after the nodes' own cleanups, so it runs before they
	// are killed.
	s.t.Cleanup(func() {
		if !s.t.Failed() {
			return
		}
		// What the nodes logged (membership decisions among it) explains a
		// failure: a departure, a lost registration, a heartbeat's error.
		for _, name := range s.names {
			if nd := s.nodes[name]; nd != nil {
				s.t.Logf("%s stderr:\n%s", name, nd.Stderr())
			}
		}
	})
	waitHosting(s.t, s.sender, "count", 3)
	s.before = generations(s.sender, s.names)
}

// startTraffic starts the traffic and waits until it flows.
func (s *scenario) startTraffic() {
	s.tr = startTraffic(s.t, s.sender)
	s.tr.progress(300)
}

// check stops the traffic and evaluates the rules.
func (s *scenario) check(ex expect) {
	t := s.t
	s.tr.progress(300) // traffic flows after the faults
	out := s.tr.finish()
	natstest.Eventually(t, 30*time.Second, func() bool { return len(generations(s.sender, s.names)) == len(s.names) }, "every node live")
	r := scenarioReport{gensBefore: s.before, gensAfter: generations(s.sender, s.names), verdicts: map[string]int{}, lostBy: map[string]int{}}
	accepted := map[string]bool{} // lane/seq
	for _, d := range out {
		r.verdicts[verdict.Classify(d.err).String()]++
		switch {
		case d.err == nil:
			accepted[deliveryID(d.lane, d.seq)] = true
		case lostResponse(d):
			// Accepted, then its answer was lost (a connection moved, its
			// owner departed): the truthful outcome-unknown verdict of
			// DESIGN §3 (the handler may have run), or a deadline while
			// the response was awaited. Re-sending an awaited Request
			// and answering it from the kept response (DESIGN §6 "in
			// transit when a connection moves") is issue 10's; until
			// then these are counted, not asserted.
			r.lostResponses++
			r.lostBy[lostCause(d.err)]++
			if ex.noLostResponses {
				t.Errorf("Failed, its response lost: %v (lane %v seq %d, after %v)", d.err, d.lane, d.seq, d.took)
			}
			continue // it may or may not have run: not required to
		case verdict.Classify(d.err) == verdict.Failed:
			t.Errorf("Failed: %v (lane %v seq %d, after %v)", d.err, d.lane, d.seq, d.took)
		default:
			// A resendable verdict the caller got back (the ladder gave
			// up): truthful, but worth seeing.
			t.Logf("%s: %v (lane %v seq %d, after %v)", verdict.Classify(d.err), d.err, d.lane, d.seq, d.took)
		}
		r.worst = max(r.worst, d.took)
	}
	// Every accepted delivery's execution is reported, or it was failed
	// late (truthfully: its activation was dropped before handling it).
	executedOrLate := func() (missing, lateFailed int) {
		s.execs.mu.Lock()
		got := map[string]bool{}
		for _, m := range s.execs.events {
			got[m.Header.Get("Mesh-Id")] = true
		}
		s.execs.mu.Unlock()
		s.lateMu.Lock()
		defer s.lateMu.Unlock()
		for id := range accepted {
			switch {
			case got[id]:
			case s.late[id] != nil:
				lateFailed++
			default:
				missing++
			}
		}
		return missing, lateFailed
	}
	pollUntil(30*time.Second, func() bool { m, _ := executedOrLate(); return m == 0 })
	r.missing, r.lateFailed = executedOrLate()
	type exec struct {
		node       string
		seq        int
		start, end int64
	}
	s.execs.mu.Lock()
	byLane := map[laneKey][]exec{}
	byAddr := map[subjects.Address][]exec{}
	count := map[string]int{}
	for _, m := range s.execs.events {
		var e exec
		e.node = m.Header.Get("Test-Node")
		e.seq, _ = strconv.Atoi(string(m.Data))
		e.start, _ = strconv.ParseInt(m.Header.Get("Test-Start"), 10, 64)
		e.end, _ = strconv.ParseInt(m.Header.Get("Test-At"), 10, 64)
		l := laneKey{subjects.Address(m.Header.Get("Test-Address")), subjects.Stream(m.Header.Get("Test-Stream"))}
		if !strings.HasPrefix(string(l.addr), "count/s") {
			continue
		}
		byLane[l] = append(byLane[l], e)
		byAddr[l.addr] = append(byAddr[l.addr], e)
		count[deliveryID(l, e.seq)]++
	}
	r.executions = len(s.execs.events)
	s.execs.mu.Unlock()
	for k := range accepted {
		if count[k] > 1 {
			r.dups++
		}
	}
	for _, ex := range byLane {
		sort.Slice(ex, func(i, j int) bool { return ex[i].start < ex[j].start })
		for i := 1; i < len(ex); i++ {
			if ex[i].seq < ex[i-1].seq {
				r.inversions++
			}
		}
	}
	for _, ex := range byAddr {
		sort.Slice(ex, func(i, j int) bool { return ex[i].start < ex[j].start })
		maxEnd := map[string]int64{}
		for _, e := range ex {
			for n, end := range maxEnd {
				if n != e.node && end > e.start {
					r.overlaps++
				}
			}
			maxEnd[e.node] = max(maxEnd[e.node], e.end)
		}
	}
	s.factories.mu.Lock()
	for a, nodes := range s.factories.byAddr {
		if !strings.HasPrefix(a, "count/s") {
			continue
		}
		r.factoryRuns += len(nodes)
		if len(nodes) > 1 {
			r.refactored = append(r.refactored, a+"@"+strings.Join(nodes, ","))
		}
	}
	s.factories.mu.Unlock()
	sort.Strings(r.refactored)
	t.Logf("scenario figures: %s", r)
	if ex.sameGenerations {
		for _, n := range s.names {
			if r.gensBefore[n] != r.gensAfter[n] {
				t.Errorf("%s changed generation %d -> %d although its process did not die", n, r.gensBefore[n], r.gensAfter[n])
			}
		}
		if len(r.refactored) != 0 {
			t.Errorf("hub factories ran again for addresses that stayed put: %v", r.refactored)
		}
	}
	if r.overlaps != 0 {
		t.Errorf("%d overlapping turns on two nodes for one address", r.overlaps)
	}
	if r.inversions != 0 {
		t.Errorf("%d per-lane inversions", r.inversions)
	}
	if r.missing != 0 {
		t.Errorf("%d accepted deliveries never executed and never failed late", r.missing)
	}
	if ex.maxWait > 0 && r.worst > ex.maxWait {
		t.Errorf("a delivery waited %v (bound %v)", r.worst, ex.maxWait)
	}
	s.report = r
}

// lostResponse reports whether d is a Request that was accepted and whose
// answer was lost: outcome unknown (its owner departed, or this sender's
// link dropped, while the response was awaited), or the caller's deadline
// passed while it was awaited.
func lostResponse(d sent) bool {
	return d.request && (errors.Is(d.err, verdict.ErrOutcomeUnknown) ||
		errors.Is(d.err, context.DeadlineExceeded) && strings.Contains(d.err.Error(), "no response"))
}

// lostCause names why an accepted Request's answer was lost.
func lostCause(err error) string {
	switch msg := err.Error(); {
	case strings.Contains(msg, "own link dropped"):
		return "own-link"
	case strings.Contains(msg, "owner departed"):
		return "owner-departed"
	case strings.Contains(msg, "no response"):
		return "deadline"
	}
	return "other"
}

// registryLeader returns the index of the server leading the registry's
// stream.
func (s *scenario) registryLeader() int {
	t := s.t
	nc := natstest.ConnectURL(t, s.c.URL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var idx int
	natstest.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, "KV_"+membership.BucketName(subjects.DefaultPrefix))
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		idx = s.c.Index(info.Cluster.Leader)
		return idx >= 0
	}, "the registry stream's leader")
	return idx
}

const scenarioWait = 10 * time.Second // "a few seconds", on a loaded 2-core CI machine

// TestScenarioLameDuckRollingRestart: every NATS server is put in lame duck
// mode, exits, and is restarted, one at a time, under traffic. A
// connection is not a generation: nothing changes generation, no hub is
// rebuilt, nothing Failed — no Request's response is lost either: what was
// in transit when an owner's connection moved is re-sent (its dedupe
// answers with the kept response), and every node and the sender move
// their connection off a server in lame duck mode before it closes it.
func TestScenarioLameDuckRollingRestart(t *testing.T) {
	longTest(t) // three lame-duck rolls, about 30 s; TestClusterRollingRestart is the quick one
	for rep := range scenarioReps() {
		t.Run(fmt.Sprint(rep), func(t *testing.T) {
			runScenario(t, func(s *scenario) {
				s.start(func(string) string { return s.c.URL() })
				for i := range s.c.N() {
					s.c.LameDuck(i)
					s.c.Restart(i)
					s.c.WaitReady(t)
					s.tr.progress(200)
				}
				s.check(expect{sameGenerations: true, maxWait: scenarioWait, noLostResponses: true})
			})
		})
	}
}

// TestScenarioKillRegistryLeader: SIGKILL the server leading the registry's
// stream, idle and under traffic, then restart it. Nobody is expired for
// silence while the registry elects a leader, no heartbeat fences its node,
// and nobody is expired by a node whose registry watcher died with the
// killed server (idle: it stays down past a TTL with the registry back):
// no node changes generation, in every repetition.
func TestScenarioKillRegistryLeader(t *testing.T) {
	t.Parallel()
	for rep := range scenarioReps() {
		for _, idle := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d/idle=%v", rep, idle), func(t *testing.T) {
				// Idle, it waits past a TTL with the server down; under
				// traffic it waits out an election (about 15 s).
				longTest(t)
				runScenario(t, func(s *scenario) {
					if idle {
						s.startIdle(func(string) string { return s.c.URL() })
						i := s.registryLeader()
						s.c.Kill(i)
						natstest.Eventually(t, 30*time.Second, func() bool {
							return s.registryLeader() != i
						}, "a new registry leader")
						// The killed server stays down past a TTL with the
						// registry back: whatever lived on it (a node's
						// registry watcher among it) stays lost meanwhile.
						time.Sleep(membership.DefaultTTL + 4*time.Second)
						s.c.Restart(i)
						s.c.WaitReady(t)
						// Idle: more than a TTL passes with the restarted
						// server back (an expiry would have happened).
						time.Sleep(membership.DefaultTTL + 2*time.Second)
						s.startTraffic()
						s.check(expect{sameGenerations: true, maxWait: scenarioWait})
					} else {
						s.start(func(string) string { return s.c.URL() })
						i := s.registryLeader()
						killed := time.Now()
						s.c.Kill(i)
						natstest.Eventually(t, 30*time.Second, func() bool {
							return s.registryLeader() != i
						}, "a new registry leader")
						// A node whose link moved starts no turn until a
						// heartbeat confirms it (self-fencing), so its
						// deliveries wait out the registry's election
						// (2.7–5.5 s measured, longer on a loaded
						// machine): the bound is a few seconds beyond it.
						election := time.Since(killed)
						s.tr.progress(300)
						s.c.Restart(i)
						s.c.WaitReady(t)
						t.Logf("the registry had no leader for about %v", election.Round(100*time.Millisecond))
						s.check(expect{sameGenerations: true, maxWait: scenarioWait + election})
					}
				})
			})
		}
	}
}

// TestScenarioOwnerLinkCut: one node reaches NATS through a proxy whose link
// is cut for less than the TTL, closed or silently dropped, under traffic.
// The server's advisory (Client Closed, Stale Connection) proves the node
// cut off, so DESIGN §6 departs it: it fences itself and rejoins under a
// new generation, and survivors take its addresses over only after the
// fencing delay — so no two nodes run turns for one address at once, and
// nothing Failed.
func TestScenarioOwnerLinkCut(t *testing.T) {
	t.Parallel()
	// The quick suite cuts the link silently only (the harder case: nothing
	// tells either side); a closed link is also what the kill tests do.
	modes := []CutMode{CutDrop}
	if natstest.Long() {
		modes = []CutMode{CutClose, CutDrop}
	}
	for rep := range scenarioReps() {
		for _, mode := range modes {
			name := map[CutMode]string{CutClose: "closed", CutDrop: "dropped"}[mode]
			t.Run(fmt.Sprintf("%d/%s", rep, name), func(t *testing.T) {
				runScenario(t, func(s *scenario) {
					p := StartProxy(t, strings.TrimPrefix(s.c.URLs()[0], "nats://"))
					s.start(func(name string) string {
						if name == "n1" {
							return p.URL()
						}
						return s.c.URL()
					})
					p.Cut(mode)
					time.Sleep(3 * time.Second) // shorter than the TTL (8 s)
					p.Restore()
					s.check(expect{maxWait: scenarioWait})
				})
			})
		}
	}
}

// LameDuck puts server i in lame duck mode (SIGUSR2) and waits until it has
// closed its clients and exited.
func (c *Cluster) LameDuck(i int) {
	c.t.Helper()
	s := c.servers[i]
	if err := s.Signal(syscall.SIGUSR2); err != nil {
		c.t.Fatalf("lame duck %s: %v", s.Name, err)
	}
	s.Wait(c.t, 60*time.Second)
	s.NATSServer = nil
}

// pollUntil polls cond until it holds or timeout passes (then the caller
// reports what it finds).
func pollUntil(timeout time.Duration, cond func() bool) {
	for deadline := time.Now().Add(timeout); !cond() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
}
