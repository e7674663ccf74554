package mesh

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestActivateFailedBuildNotRetried: an explicit activation (Host.Activate)
// of an address whose build fails runs the factory once and ends: with the
// activation-failed verdict if the failure came before it took its hold,
// else with a release of an activation that is gone — never a loop that
// builds (and, with membership, claims and releases) again and again
// without back-off until ctx ends. Many times, on a standalone node and on
// one with membership, so that the build fails at every point relative to
// Activate's look at it.
func TestActivateFailedBuildNotRetried(t *testing.T) {
	s := natstest.RunServer(t)
	for _, mode := range []string{"standalone", "membership"} {
		t.Run(mode, func(t *testing.T) {
			var n *Node
			if mode == "standalone" {
				n, _ = testNode(t, s, "solo")
			} else {
				n, _ = clusterNode(t, s, "member", newRecorder())
			}
			var builds atomic.Int64
			if err := n.Register("broken", func(context.Context, subjects.Address) (hub.Hub, error) {
				builds.Add(1)
				return nil, errors.New("cannot open the database")
			}); err != nil {
				t.Fatal(err)
			}
			const reps = 200
			failed := 0
			for i := range reps {
				addr := subjects.Address(fmt.Sprintf("broken/%d", i))
				before := builds.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				release, err := n.Host().Activate(ctx, addr)
				cancel()
				// Activate does not wait for the build: wait until the
				// address is no longer active (its build failed).
				natstest.Eventually(t, 5*time.Second, func() bool { return !slices.Contains(n.Host().Addresses(), addr) }, "activation %d gone", i)
				if got := builds.Load() - before; got != 1 {
					t.Fatalf("activation %d: the factory ran %d times (Activate: %v)", i, got, err)
				}
				switch {
				case err == nil:
					release()
				case errors.Is(err, verdict.ErrActivationFailed) && verdict.Classify(err) == verdict.Unavailable:
					failed++
				default:
					t.Fatalf("activation %d: %v, want activation-failed or a release", i, err)
				}
			}
			t.Logf("%d of %d activations saw their build fail before Activate returned", failed, reps)
			natstest.Eventually(t, 5*time.Second, func() bool { return n.Host().Stats().Activations == 0 }, "no activation left")
		})
	}
}
