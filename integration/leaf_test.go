package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/internal/nemesis"
)

// TestLeafNodeMeshd (DESIGN §12, leaf nodes): a 3-server hub cluster
// (StartLeafHubCluster: a leafnodes listener and the line
// docs/operations.md gives, default_js_domain: {MESH: ""}), two testnodes
// on it, and a third whose embedded server is a leaf node of the hub
// (meshd --leaf-remote, through a proxy so the test can cut the leaf link):
//   - the leaf node joins the hub's mesh (the hub's registry and
//     directory, over the leaf connection) and hosts addresses: a client
//     on the leaf server activates every workload address on it
//     (placement near the caller);
//   - a sender on the hub reaches them there, under the recorded workload,
//     while the leaf's client sends too;
//   - the leaf link is cut silently: the leaf node keeps its link to its
//     own server, its heartbeats go unacknowledged, its registration lease
//     lapses within the TTL and it starts no turn; the hub's nodes take
//     its addresses over after the TTL and the fencing delay;
//   - the link comes back: the leaf node finds its registration gone and
//     rejoins under a new generation.
//
// The checkers judge the whole history: no two turns of an address overlap
// (bar one running when the lease lapsed), one truthful verdict each, lane
// order, linearizable registers.
func TestLeafNodeMeshd(t *testing.T) {
	longTest(t)
	c := StartLeafHubCluster(t, 3)
	c.WaitReady(t)
	px := StartProxy(t, fmt.Sprintf("127.0.0.1:%d", c.servers[0].LeafPort))
	nodes := []primedNode{{"e1", []string{"--nats-url", c.URL()}}, {"e2", []string{"--nats-url", c.URL()}},
		{"l1", []string{"--leaf-remote", "nats-leaf://" + px.Addr, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--http", ""}}}
	leafURL := func(ns []*nemesisNode) string { return ns[2].proc.NATSURL }
	n, addrs, primer := primedWorkload(t, c, c.URL(), leafURL, nodes, "l")
	t.Logf("the leaf node joined the hub's mesh and hosts every workload address")

	w := n.startWorkload(1)
	wl := n.startWorkloadFrom(primer, 2, 1000, "l") // the leaf's own callers
	w.progress(t, 200)
	cut := time.Now()
	stopped := px.Cut(CutDrop)
	t.Logf("the leaf link's proxy last moved bytes %v before the cut", cut.Sub(stopped))
	lapse := cut.Add(testTTL)
	back := servedOnEast(t, n, addrs, cut)
	t.Logf("every address served on the hub %v after the leaf link was cut (TTL %v)", back, testTTL)
	w.progress(t, 200)
	restored := time.Now()
	px.Restore()
	// The leaf node rejoins: its old generation was declared gone.
	l1 := n.nodes[2].proc
	natstest.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(l1.Stderr(), "generation declared gone")
	}, "the leaf node did not find its registration gone after the link came back")
	w.progress(t, 100)
	w.stop()
	wl.stop()
	n.waitTurnsSettled()
	turns := n.turns()
	for _, tr := range turns {
		if strings.HasPrefix(tr.Node, "l") && tr.Start > lapse.Add(nemesis.PartitionGrace).UnixNano() && tr.Start < restored.UnixNano() {
			t.Errorf("a turn started on %s.%d %v after the leaf link was cut (the lease lapses within %v): %+v",
				tr.Node, tr.Generation, time.Duration(tr.Start-cut.UnixNano()), testTTL, tr)
		}
	}
	// As in TestSuperclusterGatewayCut: the link's cut (the at-least-once
	// window) and the lease's lapse (turns running then may run on).
	n.addLeaseCut(n.nodes[2], stopped, lapse, restored, "leaf link cut")
	h := n.rec.Finish(time.Now().UnixNano(), turns)
	n.report(scenarioConfig(t), h)
}
