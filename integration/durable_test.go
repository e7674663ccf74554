package integration

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/counterhub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// bindBucket binds the KV bucket name through url, retrying while it has no
// leader or does not exist yet (the nodes create the buckets when they join).
func bindBucket(t *testing.T, url, name string) jetstream.KeyValue {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var kv jetstream.KeyValue
	natstest.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		kv, err = js.KeyValue(ctx, name)
		return err == nil
	}, "bucket %s bound", name)
	return kv
}

// storedCounter reads a counter's stored record, retrying while the bucket
// has no leader (a NATS server was just restarted).
func storedCounter(t *testing.T, kv jetstream.KeyValue, addr subjects.Address) (uint64, hub.StateRecord) {
	t.Helper()
	var rec hub.StateRecord
	var err error
	natstest.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rec, err = hubstate.Read(ctx, kv, addr)
		return err == nil || errors.Is(err, hubstate.ErrNotFound)
	}, "read the state of %s", addr)
	if errors.Is(err, hubstate.ErrNotFound) {
		return 0, rec
	}
	n, perr := counterhub.Value(rec.Data)
	if perr != nil {
		t.Fatalf("state of %s: %q", addr, rec.Data)
	}
	return n, rec
}

// saveWatch follows every write to the state bucket (a KV watcher: an
// ordered consumer that resumes after a server dies) and counts writes whose
// epoch is below one already written for the same key — a save accepted
// from an activation after its successor took the state over.
type saveWatch struct {
	mu       sync.Mutex
	maxEpoch map[string]uint64
	writes   int
	stale    []string
	history  map[string][]watchedWrite // key -> the writes seen, in order
}

// watchedWrite is one write the watcher saw.
type watchedWrite struct {
	rev, epoch uint64
	owner      subjects.NodeID
	data       string
}

func (w watchedWrite) String() string {
	d := w.data
	if i := strings.LastIndexByte(d, '\n'); i >= 0 {
		first, _, _ := strings.Cut(d, "\n")
		d = first + " … newest " + d[i+1:]
	}
	return fmt.Sprintf("rev %d epoch %d owner %s: %s", w.rev, w.epoch, w.owner, d)
}

// around returns the writes of key whose counter is within 1 of v.
func (sw *saveWatch) around(key string, v uint64) []string {
	var out []string
	for _, w := range sw.history[key] {
		if n, err := counterhub.Value([]byte(w.data)); err == nil && n+1 >= v && n <= v+1 {
			out = append(out, w.String())
		}
	}
	return out
}

func watchSaves(t *testing.T, kv jetstream.KeyValue) *saveWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sw := &saveWatch{maxEpoch: map[string]uint64{}, history: map[string][]watchedWrite{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			r, err := hubstate.Decode(e.Value())
			sw.mu.Lock()
			sw.writes++
			sw.history[e.Key()] = append(sw.history[e.Key()], watchedWrite{e.Revision(), r.Epoch, r.Owner, string(r.Data)})
			switch {
			case err != nil:
				sw.stale = append(sw.stale, fmt.Sprintf("%s rev %d: %v", e.Key(), e.Revision(), err))
			case r.Epoch < sw.maxEpoch[e.Key()]:
				sw.stale = append(sw.stale, fmt.Sprintf("%s rev %d: epoch %d (by %s) written after epoch %d", e.Key(), e.Revision(), r.Epoch, r.Owner, sw.maxEpoch[e.Key()]))
			default:
				sw.maxEpoch[e.Key()] = r.Epoch
			}
			sw.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = w.Stop()
		cancel()
		<-done
	})
	return sw
}

// counterLog tallies one counter's acknowledged increments: each value
// must be acknowledged once (a value acknowledged twice is a lost update),
// each delivery ID once.
type counterLog struct {
	acked map[uint64]string // value -> delivery ID
	dup   []string
}

func (l *counterLog) record(id string, r mesh.Response) {
	v, err := strconv.ParseUint(string(r.Payload), 10, 64)
	if err != nil {
		l.dup = append(l.dup, fmt.Sprintf("%s: response %q", id, r.Payload))
		return
	}
	if prev, ok := l.acked[v]; ok {
		l.dup = append(l.dup, fmt.Sprintf("value %d acknowledged to %s and %s", v, prev, id))
	}
	l.acked[v] = id
}

// chaosFlagSet reports whether -chaos was given.
func chaosFlagSet() bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "chaos" })
	return set
}

// TestClusterDurableChaos (DESIGN §7a, issue 15 item 5): durable counters
// are incremented through Request — the response is sent only after the
// save is acknowledged — by 12 workers on 6 counters, while owners are
// SIGKILLed, drained (SIGTERM) and frozen past detection (SIGSTOP, then
// SIGCONT), and a NATS server is killed and restarted: each fault kind once
// (the bounded CI run), then, with -chaos=D, random faults for D. A worker
// re-sends an increment whose outcome it does not know with the same
// delivery ID until it is acknowledged (the counter remembers the IDs of
// the last increments of each stream — each worker sends on its own — in
// its durable state, so a re-send, even to a successor activation, is
// answered its value instead of counted again).
// So every increment is acknowledged exactly once, and afterwards every
// stored counter equals its number of acknowledged increments (0 lost, 0
// extra), the acknowledged values are exactly 1..n (no value acknowledged
// twice: no lost update), and no save was accepted from an activation after
// its successor took the state over (every write the test watched carries
// the highest epoch written for its key so far).
func TestClusterDurableChaos(t *testing.T) {
	longTest(t)
	began := time.Now()
	c := StartCluster(t, 3)
	c.WaitReady(t)
	t.Cleanup(func() {
		if t.Failed() {
			c.LogJetStream(t)
		}
	})
	names := []string{"d1", "d2", "d3"}
	nodes := startTestNodes(t, c.URL(), names...)
	var gone []*Meshd // processes replaced by a restart (their logs)
	tc := clientNode(t, c.URL())
	waitHosting(t, tc, "dctr", 3)
	kv := bindBucket(t, c.URL(), hubstate.BucketName(subjects.DefaultPrefix))
	saves := watchSaves(t, kv)

	const counters, workers = 6, 12
	logs := make([]*counterLog, counters)
	for i := range logs {
		logs[i] = &counterLog{acked: map[uint64]string{}}
	}
	var mu sync.Mutex
	reasons := map[string]int{}
	attempts, resent := 0, 0
	var unresolved []string
	tries := map[string][]string{} // delivery ID -> each attempt's outcome
	// increment sends one increment to counter i under id until it is
	// acknowledged, or until giveUp closes and a further minute passed.
	giveUp := make(chan struct{})
	increment := func(i int, stream, id string) bool {
		addr := subjects.Address(fmt.Sprintf("dctr/c%d", i))
		var deadline <-chan time.Time
		for try := 0; ; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			r, err := tc.Request(ctx, mesh.Delivery{ID: id, To: addr, Stream: subjects.Stream(stream), Type: counterhub.Inc})
			cancel()
			mu.Lock()
			attempts++
			if try > 0 {
				resent++
			}
			if err == nil {
				logs[i].record(id, r)
				tries[id] = append(tries[id], fmt.Sprintf("%s from %s", r.Payload, r.Node))
			} else {
				reasons[reasonOf(err)]++
				tries[id] = append(tries[id], err.Error())
			}
			mu.Unlock()
			if err == nil {
				return true
			}
			if deadline == nil {
				select {
				case <-giveUp:
					deadline = time.After(time.Minute)
				default:
				}
			}
			select {
			case <-deadline:
				mu.Lock()
				unresolved = append(unresolved, fmt.Sprintf("%s to %s: %v", id, addr, err))
				mu.Unlock()
				return false
			case <-time.After(50 * time.Millisecond): // not a hot loop against a fault
			}
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				increment(w%counters, fmt.Sprintf("w%d", w), fmt.Sprintf("dchaos-%d-%d", w, seq))
			}
		}()
	}
	natstest.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return attempts >= 200
	}, "traffic flowing (200 increments)")

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 15))
	faults := map[string]int{}
	plan := []int{0, 1, 2, 3} // each fault once, then random ones
	var end time.Time
	if chaosFlagSet() {
		end = time.Now().Add(*chaosDuration)
	}
	for k := 0; k < len(plan) || time.Now().Before(end); k++ {
		f := rng.IntN(4)
		if k < len(plan) {
			f = plan[k]
		}
		name := names[rng.IntN(len(names))]
		nd := nodes[name]
		began := time.Now()
		var phases []string
		phase := func(what string) {
			phases = append(phases, fmt.Sprintf("%s %v", what, time.Since(began).Round(time.Millisecond)))
		}
		switch f {
		case 0: // an owner crashes
			_ = nd.Signal(syscall.SIGKILL)
			nd.Wait(t, 30*time.Second)
			faults["sigkill"]++
		case 1: // an owner drains
			_ = nd.Signal(syscall.SIGTERM)
			nd.Wait(t, 30*time.Second)
			faults["sigterm"]++
		case 2: // an owner freezes past detection, then wakes (and rejoins)
			_ = nd.Signal(syscall.SIGSTOP)
			deadline := time.Now().Add(20 * time.Second)
			for alive(tc, name) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			phase("declared gone")
			_ = nd.Signal(syscall.SIGCONT)
			faults["sigstop"]++
		case 3: // a NATS server dies and comes back
			i := rng.IntN(3)
			name = c.Server(i).Name
			c.Kill(i)
			time.Sleep(time.Second)
			c.Restart(i)
			phase("restarted")
			c.WaitReady(t)
			phase("healthy")
			faults["nats-server"]++
		}
		if f <= 1 {
			gone = append(gone, nd)
			nodes[name] = StartTestNode(t, "--name", name, "--nats-url", c.URL(), "--kv-replicas", "3")
			phase("restarted")
		}
		waitHostingOrDump(t, tc, nodes)
		phase("all hosting")
		t.Logf("fault %d: %s of %s: %s", k, [...]string{"sigkill", "sigterm", "sigstop", "nats-server"}[f], name, strings.Join(phases, ", "))
	}
	close(stop)
	close(giveUp)
	wg.Wait()

	// Settle: one more acknowledged increment per counter takes each
	// address over wherever a woken activation might still hold it.
	for i := range counters {
		increment(i, "settle", fmt.Sprintf("dchaos-settle-%d", i))
	}

	mu.Lock()
	defer mu.Unlock()
	for _, u := range unresolved {
		t.Errorf("an increment never acknowledged: %s", u)
	}
	totalAcked := 0
	for i, l := range logs {
		addr := subjects.Address(fmt.Sprintf("dctr/c%d", i))
		got, rec := storedCounter(t, kv, addr)
		acked := uint64(len(l.acked))
		totalAcked += len(l.acked)
		t.Logf("%s: stored %d (epoch %d, owner %s); acknowledged %d", addr, got, rec.Epoch, rec.Owner, acked)
		for _, d := range l.dup {
			t.Errorf("%s: %s (a lost update)", addr, d)
		}
		if got != acked {
			t.Errorf("%s: stored %d, but %d increments were acknowledged (%d lost, %d extra)", addr, got, acked, max(0, int(acked)-int(got)), max(0, int(got)-int(acked)))
		}
		for v := uint64(1); v <= max(acked, got); v++ {
			if _, ok := l.acked[v]; ok {
				continue
			}
			t.Errorf("%s: value %d never acknowledged, though %d increments were", addr, v, acked)
			saves.mu.Lock()
			near := saves.around(hubstate.Key(addr), v)
			saves.mu.Unlock()
			t.Logf("%s: the writes watched around %d:\n  %s", addr, v, strings.Join(near, "\n  "))
			for _, id := range []string{l.acked[v-1], l.acked[v+1]} {
				t.Logf("%s: %s's attempts: %q", addr, id, tries[id])
			}
			for _, w := range near {
				if _, id, ok := strings.Cut(w, " … newest "); ok {
					_, id, _ = strings.Cut(id, " ")
					t.Logf("%s: %s's attempts: %q", addr, id, tries[id])
				}
			}
			break
		}
	}
	saves.mu.Lock()
	defer saves.mu.Unlock()
	for _, s := range saves.stale {
		t.Errorf("a save accepted from a stale activation: %s", s)
	}
	var standDowns, waitedJS int
	for _, n := range append(gone, slices.Collect(maps.Values(nodes))...) {
		standDowns += strings.Count(n.Stderr(), "activation stands down: its state cannot be persisted")
		for l := range strings.Lines(n.Stderr()) {
			if strings.Contains(l, "waiting for JetStream") {
				waitedJS++
				t.Logf("%s: %s", n.Node, strings.TrimSpace(l))
			}
		}
	}
	t.Logf("faults %v in %v; %d increments acknowledged (%d attempts, %d re-sends of an unknown or refused outcome: %v); %d writes watched, %d from a stale activation; stand-downs for unpersistable state %d; JetStream waits while joining %d",
		faults, time.Since(began).Round(time.Millisecond), totalAcked, attempts, resent, reasons, saves.writes, len(saves.stale), standDowns, waitedJS)
	if totalAcked == 0 {
		t.Fatal("no increment got through")
	}
}

// waitHostingOrDump waits until tc sees every node hosting dctr, or fails
// with the tail of each node's log.
func waitHostingOrDump(t *testing.T, tc *mesh.Node, nodes map[string]*Meshd) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // a woken node closes its old session (bounded 10 s) and rejoins
	for len(tc.Members().Hosting("dctr")) != len(nodes) {
		if time.Now().After(deadline) {
			for name, n := range nodes {
				lines := strings.Split(strings.TrimSpace(n.Stderr()), "\n")
				t.Logf("%s (alive %v), last log lines:\n%s", name, alive(tc, name), strings.Join(lines[max(0, len(lines)-15):], "\n"))
			}
			t.Fatalf("%d nodes hosting dctr after 60 s, want %d", len(tc.Members().Hosting("dctr")), len(nodes))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reasonOf names a failed request's reason for the tally.
func reasonOf(err error) string {
	var ve *verdict.Error
	switch {
	case errors.As(err, &ve):
		return ve.Reason.String()
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "other"
}

// holdWatch collects the test node's "test.hold" and "test.save" reports.
type holdWatch struct {
	mu    sync.Mutex
	holds map[string]string // delivery ID -> node name
	saves map[string]string // delivery ID -> save error ("" if it succeeded)
}

func watchHolds(t *testing.T, url string) *holdWatch {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	hw := &holdWatch{holds: map[string]string{}, saves: map[string]string{}}
	for _, subj := range []string{"test.hold", "test.save"} {
		_, err := nc.Subscribe(subj, func(m *nats.Msg) {
			hw.mu.Lock()
			if m.Subject == "test.hold" {
				hw.holds[m.Header.Get("Mesh-Id")] = m.Header.Get("Test-Node")
			} else {
				hw.saves[m.Header.Get("Mesh-Id")] = m.Header.Get("Test-Err")
			}
			hw.mu.Unlock()
			_ = m.Respond(nil)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	return hw
}

func (hw *holdWatch) held(id string) bool {
	hw.mu.Lock()
	defer hw.mu.Unlock()
	_, ok := hw.holds[id]
	return ok
}

func (hw *holdWatch) saved(id string) (string, bool) {
	hw.mu.Lock()
	defer hw.mu.Unlock()
	e, ok := hw.saves[id]
	return e, ok
}

// TestClusterStateFencing (issue 15 item 2) on real processes: an owner
// holds a turn between its change and its save while it loses the address —
// frozen past detection (SIGSTOP, then SIGCONT once the successor took the
// state over), superseded by a new process of its name (--replace), or its
// directory claim rewritten to another node. In each case the stale save
// fails fenced (nothing written), the held request is not acknowledged, the
// successor goes on from the stored value, and no save from the stale
// activation lands after the takeover.
func TestClusterStateFencing(t *testing.T) {
	longTest(t)
	c := StartCluster(t, 3)
	c.WaitReady(t)
	tc := clientNode(t, c.URL())
	hw := watchHolds(t, c.URL())
	for _, scenario := range []string{"freeze", "supersede", "claim-rewritten"} {
		t.Run(scenario, func(t *testing.T) {
			nodes := startTestNodes(t, c.URL(), scenario+"-a", scenario+"-b")
			a, b := nodes[scenario+"-a"], nodes[scenario+"-b"]
			aID, _ := subjects.ParseNodeID(a.Node)
			bID, _ := subjects.ParseNodeID(b.Node)
			natstest.Eventually(t, 30*time.Second, func() bool { return alive(tc, aID.Name) && alive(tc, bID.Name) }, "both nodes live")
			kv := bindBucket(t, c.URL(), hubstate.BucketName(subjects.DefaultPrefix))
			saves := watchSaves(t, kv)
			var addr subjects.Address
			for i := 0; ; i++ {
				addr = subjects.Address(fmt.Sprintf("dctr/%s-%d", scenario, i))
				if n, _ := directory.Place(addr, []subjects.NodeID{aID, bID}); n == aID {
					break
				}
			}
			ctx := context.Background()
			incr := func(id string) (uint64, error) {
				rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				defer cancel()
				r, err := tc.Request(rctx, mesh.Delivery{ID: id, To: addr, Type: counterhub.Inc})
				if err != nil {
					return 0, err
				}
				return strconv.ParseUint(string(r.Payload), 10, 64)
			}
			for i := range 3 {
				if v, err := incr(fmt.Sprintf("%s-pre-%d", scenario, i)); err != nil || v != uint64(i+1) {
					t.Fatalf("inc %d: %d, %v", i, v, err)
				}
			}
			if _, rec := storedCounter(t, kv, addr); rec.Owner != aID {
				t.Fatalf("owner %s, want %s", rec.Owner, aID)
			}
			holdID := scenario + "-hold"
			held := make(chan error, 1)
			go func() {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				_, err := tc.Request(rctx, mesh.Delivery{ID: holdID, To: addr, Type: counterhub.Inc, Payload: []byte("hold")})
				held <- err
			}()
			natstest.Eventually(t, 15*time.Second, func() bool { return hw.held(holdID) }, "the turn is held")

			var successor subjects.NodeID
			switch scenario {
			case "freeze":
				_ = a.Signal(syscall.SIGSTOP)
				natstest.Eventually(t, 20*time.Second, func() bool { return !alive(tc, aID.Name) }, "the frozen owner declared gone")
				successor = bID
			case "supersede":
				a2 := StartTestNode(t, "--name", aID.Name, "--nats-url", c.URL(), "--kv-replicas", "3", "--replace")
				successor, _ = subjects.ParseNodeID(a2.Node)
				defer func() { _ = a.Signal(syscall.SIGKILL) }()
			case "claim-rewritten":
				dir := bindBucket(t, c.URL(), directory.BucketName(subjects.DefaultPrefix))
				claim := fmt.Sprintf(`{"owner":%q,"claimed":%q}`, bID.String(), time.Now().UTC().Format(time.RFC3339Nano))
				if _, err := dir.Put(ctx, subjects.EncodeToken(string(addr)), []byte(claim)); err != nil {
					t.Fatal(err)
				}
				successor = bID
			}
			// The successor takes the state over and goes on from 3.
			unknown := 0
			var got uint64
			natstest.Eventually(t, 60*time.Second, func() bool {
				v, err := incr(fmt.Sprintf("%s-next-%d", scenario, time.Now().UnixNano()))
				if err != nil {
					unknown++
					return false
				}
				got = v
				return true
			}, "an increment on the successor")
			_, rec := storedCounter(t, kv, addr)
			if rec.Owner.Name != successor.Name || rec.Owner.Generation < successor.Generation {
				t.Errorf("state owned by %s, want %s", rec.Owner, successor)
			}
			if scenario == "freeze" {
				_ = a.Signal(syscall.SIGCONT)
			}
			// The held turn's save fails fenced; its request is not
			// acknowledged.
			natstest.Eventually(t, 30*time.Second, func() bool { _, ok := hw.saved(holdID); return ok }, "the held turn's save reported")
			// Fenced — or, when the node's own fencing cancelled the turn
			// while its save was out (the frozen node wakes, finds itself
			// gone and closes its session), unknown with the successor
			// named as the record's owner since: the store cannot tell a
			// refused write from one cut short. Either way not
			// acknowledged, and the checks below show nothing of it is
			// stored. (Seen once in CI's long step, freeze.)
			if e, _ := hw.saved(holdID); !strings.Contains(e, hub.ErrStateFenced.Error()) &&
				!(strings.Contains(e, hub.ErrStateUnknown.Error()) && strings.Contains(e, "context canceled") && strings.Contains(e, "of "+successor.Name+".")) {
				t.Errorf("the stale save: %q, want %v (or unknown, cut short by its own fencing, replaced by %s)", e, hub.ErrStateFenced, successor)
			}
			if err := <-held; err == nil {
				t.Error("the held request was acknowledged")
			} else {
				t.Logf("the held request: %v", err)
			}
			// Nothing the stale activation did is stored: the successor
			// went on from 3 (4, unless an unknown attempt counted).
			if got < 4 || got > 4+uint64(unknown) {
				t.Errorf("the successor's first increment answered %d (unknown attempts %d), want 4", got, unknown)
			}
			if v, _ := storedCounter(t, kv, addr); v != got {
				t.Errorf("stored %d after the successor answered %d", v, got)
			}
			saves.mu.Lock()
			for _, s := range saves.stale {
				t.Errorf("a save accepted from a stale activation: %s", s)
			}
			saves.mu.Unlock()
		})
	}
}
