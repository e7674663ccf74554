package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/nemesis"
	"github.com/natsmesh/natsmesh/internal/plant"
)

// TestNemesisPlanted: proof the checkers bite (issue 21). Each subtest
// runs the nemesis — CI's seed, every fault kind, the recorded workload —
// against testnodes built with a known bug planted (package
// internal/plant, build tag natsmesh_plant, switched on by
// NATSMESH_PLANT), and requires the check that guards that guarantee to
// report violations. The same run without the bug is TestNemesis, which
// must find none.
//
// resend-timeout is planted in the sender, which is this test process: it
// runs only in a test binary built with the tag (CI's long step runs it
// so), and under its own schedule — route cuts alone, two of them
// dropping the routes for 7 and 11 s, so that legs across the cut time
// out (the leg timeout, 5 s, is shorter than the TTL after which the
// nodes beyond the cut are declared gone). release-by-address runs with
// the nodes' idle timeout at 30 ms, so collections race the next
// delivery's claim (the planted release runs plant.ReleaseDelay late, as
// round 2's serial collection made it: released at once and in parallel,
// as the collection does now, the next claim rarely lands first — CI
// caught nothing twice in a row without it); claim-current catches it on the node itself, from the
// turns that start under a claim their node's directory no longer holds
// (the next claim lands on the same node, so no second node ever runs
// the address).
func TestNemesisPlanted(t *testing.T) {
	longTest(t)
	bin := BuildPlantedTestNode(t)
	for _, tc := range []struct {
		bug   plant.Bug
		check string // the checker's name (nemesis.Checkers)
		// inSender: planted in the sender (this process), so the test
		// binary must have the tag too; seed, duration and kinds, if
		// set, replace CI's schedule.
		inSender bool
		seed     uint64
		duration time.Duration
		kinds    []nemesis.FaultKind
		idle     time.Duration // the nodes' idle timeout, if set
	}{
		{bug: plant.SkipDedupe, check: "at-most-once"},
		{bug: plant.ReorderLane, check: "lane-order"},
		{bug: plant.AckUnsaved, check: "durable-writes"},
		{bug: plant.StaleStream, check: "stream-convergence"},
		{bug: plant.ResendTimeout, check: "timeout-not-resent", inSender: true,
			seed: 30, duration: 16 * time.Second, kinds: []nemesis.FaultKind{nemesis.RouteCut}},
		// Round 2's race: collections (30 ms idle) racing the next
		// delivery's claim on the same node, under slow links only.
		{bug: plant.ReleaseByAddress, check: "claim-current", idle: 30 * time.Millisecond,
			seed: nemesisSeed, duration: 20 * time.Second, kinds: []nemesis.FaultKind{nemesis.LinkSlow}},
	} {
		t.Run(string(tc.bug), func(t *testing.T) {
			if tc.inSender && !plant.Built {
				t.Skipf("%s is planted in the sender, this process: run with go test -tags natsmesh_plant (CI's long step does)", tc.bug)
			}
			t.Setenv(plant.EnvVar, string(tc.bug)) // the node processes inherit it (and this one reads it)
			cfg := nemesisFromEnv(t)
			cfg.ownOut = true
			if tc.seed != 0 {
				cfg.seed, cfg.duration, cfg.kinds = tc.seed, tc.duration, tc.kinds
			}
			if tc.idle != 0 {
				cfg.idle = tc.idle
			}
			_, h := runNemesis(t, cfg, bin)
			results := nemesis.Run(h, nemesis.Options{OutDir: cfg.out})
			found := false
			var summary []string
			for _, r := range results {
				summary = append(summary, fmt.Sprintf("%s %d", r.Name, len(r.Violations)))
				if r.Name == tc.check && len(r.Violations) > 0 {
					found = true
					t.Logf("%s caught %s: %d violations, e.g. %v", tc.check, tc.bug, len(r.Violations), r.Violations[0])
				}
			}
			t.Logf("violations by check: %s", strings.Join(summary, ", "))
			if !found {
				t.Errorf("planted %s, and %s found no violation", tc.bug, tc.check)
			}
		})
	}
}
