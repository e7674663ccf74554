package integration

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// chaosDuration bounds TestClusterChaos: short in CI, longer on demand:
//
//	go test ./integration -run Chaos -v -args -chaos=5m
var chaosDuration = flag.Duration("chaos", 8*time.Second, "how long TestClusterChaos injects faults")

// TestClusterChaos runs steady request traffic on 30 lanes while nodes are
// SIGKILLed, drained (SIGTERM) and frozen (SIGSTOP), and NATS servers are
// killed, one fault at a time, each followed by recovery. It asserts what
// must hold whatever the faults: every request gets exactly one verdict;
// a request answered on its first attempt ran exactly once; no timeout is
// called resendable. It reports what faults may legitimately cause:
// deliveries lost with a killed node, re-executions of legs re-sent after
// their owner died, and late executions by a frozen handler.
func TestClusterChaos(t *testing.T) {
	longTest(t)
	c := StartCluster(t, 3)
	c.WaitReady(t)
	names := []string{"c1", "c2", "c3"}
	var nodesMu sync.Mutex
	nodes := startTestNodes(t, c.URL(), names...)
	tc := clientNode(t, c.URL())
	waitHosting(t, tc, "count", 3)
	execs := subscribeExecs(t, c.URL())

	type outcome struct {
		id       string
		attempts int
		err      error
	}
	var mu sync.Mutex
	var outcomes []outcome
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for l := 0; l < 30; l++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addr := subjects.Address(fmt.Sprintf("count/x%d", l%6))
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				id := fmt.Sprintf("chaos-%d-%d", l, seq)
				r, err := tc.Request(ctx, mesh.Delivery{ID: id, To: addr, Stream: subjects.Stream(fmt.Sprint(l)), Payload: []byte(fmt.Sprint(seq))})
				cancel()
				mu.Lock()
				outcomes = append(outcomes, outcome{id, r.Attempts, err})
				mu.Unlock()
			}
		}()
	}

	// Traffic flows before the first fault.
	natstest.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(outcomes) >= 300
	}, "traffic flowing (300 requests)")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	faults := map[string]int{}
	end := time.Now().Add(*chaosDuration)
	for time.Now().Before(end) {
		name := names[rng.IntN(len(names))]
		nodesMu.Lock()
		nd := nodes[name]
		nodesMu.Unlock()
		switch f := rng.IntN(4); f {
		case 0: // crash and restart
			_ = nd.Signal(syscall.SIGKILL)
			nd.Wait(t, 30*time.Second)
			faults["sigkill"]++
		case 1: // graceful restart
			_ = nd.Signal(syscall.SIGTERM)
			nd.Wait(t, 30*time.Second)
			faults["sigterm"]++
		case 2: // freeze past the detection time, then wake (it rejoins)
			_ = nd.Signal(syscall.SIGSTOP)
			deadline := time.Now().Add(20 * time.Second)
			for alive(tc, name) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			_ = nd.Signal(syscall.SIGCONT)
			faults["sigstop"]++
			waitHosting(t, tc, "count", 3)
			continue
		case 3: // a NATS server dies and comes back
			i := rng.IntN(3)
			c.Kill(i)
			time.Sleep(time.Second)
			c.Restart(i)
			c.WaitReady(t)
			faults["nats-server"]++
			continue
		}
		nodesMu.Lock()
		nodes[name] = StartTestNode(t, "--name", name, "--nats-url", c.URL(), "--kv-replicas", "3")
		nodesMu.Unlock()
		waitHosting(t, tc, "count", 3)
	}
	close(stop)
	wg.Wait()

	// A handler reports its execution (acknowledged) before it responds,
	// so every answered request's execution is already counted.
	execs.mu.Lock()
	runs := map[string]int{}
	for _, m := range execs.events {
		runs[m.Header.Get("Mesh-Id")]++
	}
	execs.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	byVerdict := map[string]int{}
	lost, reRun, firstAttemptOK := 0, 0, 0
	for _, o := range outcomes {
		byVerdict[verdict.Classify(o.err).String()]++
		if o.err != nil && verdict.IsResendable(o.err) && errors.Is(o.err, context.DeadlineExceeded) {
			t.Errorf("%s: a timeout classified resendable: %v", o.id, o.err)
		}
		switch {
		case o.err == nil && o.attempts == 1:
			firstAttemptOK++
			if runs[o.id] != 1 {
				t.Errorf("%s answered on its first attempt but ran %d times", o.id, runs[o.id])
			}
		case o.err == nil && runs[o.id] > 1:
			reRun++ // a leg re-sent after its owner died had run there too
		case o.err != nil && runs[o.id] == 0:
			lost++
		}
	}
	t.Logf("faults %v over %v; %d requests: %v; answered on first attempt %d; re-run after an owner died %d; failed and never ran %d",
		faults, *chaosDuration, len(outcomes), byVerdict, firstAttemptOK, reRun, lost)
	if len(outcomes) == 0 || byVerdict["Accepted"] == 0 {
		t.Fatal("no traffic got through")
	}
}

func alive(tc *mesh.Node, name string) bool {
	for _, m := range tc.Members().Members() {
		if m.Node.Name == name {
			return true
		}
	}
	return false
}
