package mesh

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestRegisterRacesRejoin: a kind registered at any moment of a rejoin — as
// the old generation is declared gone, while the next one joins, as it is
// installed — is on the host of the session that follows and announced in
// its registry entry, for good, and Register does not report the old
// session's lost registration as its own failure. Kinds are registered
// back to back from two goroutines through several rejoins, so every
// position of the rejoin is reached, and concurrent Registers race each
// other's announcements too.
func TestRegisterRacesRejoin(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	n, nc := clusterNode(t, s, "a", rec)
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	kinds := []string{"rec"}
	failed := 0
	register := func(kind string) {
		err := n.Register(kind, rec.factory)
		mu.Lock()
		defer mu.Unlock()
		// Registered either way: a second Register of it is refused.
		kinds = append(kinds, kind)
		if err != nil {
			if failed++; failed <= 3 {
				t.Errorf("Register(%q): %v", kind, err)
			}
		}
	}
	// announced is what n's current generation's registry entry lists.
	announced := func() (subjects.NodeID, []string) {
		e, err := kv.Get(context.Background(), "a")
		if err != nil {
			return subjects.NodeID{}, nil
		}
		var m membership.Member
		if json.Unmarshal(e.Value(), &m) != nil {
			return subjects.NodeID{}, nil
		}
		return m.Node, m.Kinds
	}
	const rounds = 5
	for round := range rounds {
		old := n.ID()
		rejoins := n.rejoins.Load()
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Back to back until the rejoin is installed, then once
				// more: every position of it.
				for j := 0; ; j++ {
					done := n.rejoins.Load() > rejoins
					register(fmt.Sprintf("k%d-%d-%d", round, g, j))
					if done || j > 10_000 {
						return
					}
				}
			}()
		}
		if err := kv.Delete(context.Background(), "a"); err != nil { // declared gone behind its back
			t.Fatal(err)
		}
		natstest.Eventually(t, 15*time.Second, func() bool { return n.rejoins.Load() > rejoins && n.ID() != old }, "round %d: a new session", round)
		wg.Wait()
		mu.Lock()
		want := slices.Clone(kinds)
		mu.Unlock()
		var missingHost, missingReg []string
		natstest.Eventually(t, 10*time.Second, func() bool {
			missingHost, missingReg = nil, nil
			id := n.ID()
			hosted := n.Host().Kinds()
			node, ann := announced()
			for _, k := range want {
				if !slices.Contains(hosted, k) {
					missingHost = append(missingHost, k)
				}
				if node != id || !slices.Contains(ann, k) {
					missingReg = append(missingReg, k)
				}
			}
			return len(missingHost) == 0 && len(missingReg) == 0
		}, "round %d: every registered kind on the new session: %v", round, lazy(func() any {
			return fmt.Sprintf("%d kinds registered (%d Register calls failed); missing from the host %v, from the registry entry %v", len(want), failed, missingHost, missingReg)
		}))
		if t.Failed() {
			t.FailNow()
		}
	}
}
