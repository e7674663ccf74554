package mesh

import (
	"maps"
	"runtime"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
)

// TestLegMsgReuse: a pooled leg message carries exactly the headers set for
// its current leg, whatever earlier legs set (and trace context added).
// It never puts its message into the package's pool: the pool is the
// process's, and a message put there more than once would be handed to two
// legs of a later test at the same time (it was, once, while this test put
// it back after each use).
func TestLegMsgReuse(t *testing.T) {
	t.Parallel()
	lm := &legMsg{msg: nats.Msg{Header: nats.Header{}}}
	use := func(foreign bool, set map[int]string) {
		t.Helper()
		for i, v := range set {
			lm.set(i, v)
		}
		if foreign {
			lm.header()["traceparent"] = []string{"tp"}
		}
		got := map[string]string{}
		for k, v := range lm.ready().Header {
			if len(v) != 1 {
				t.Fatalf("header %s has %d values", k, len(v))
			}
			got[k] = v[0]
		}
		want := map[string]string{}
		for i, v := range set {
			want[legHeaderNames[i]] = v
		}
		if foreign {
			want["traceparent"] = "tp"
		}
		if !maps.Equal(got, want) {
			t.Fatalf("headers %v, want %v", got, want)
		}
		lm.reset() // what putLegMsg does before the pool takes it
	}
	use(false, map[int]string{hdrID: "a", hdrAttempt: "2", hdrAnswerTo: "x", hdrLane: "e/1"})
	use(false, map[int]string{hdrID: "b", hdrAnswerTo: "x"})
	use(true, map[int]string{hdrID: "c", hdrType: "t"})
	use(false, map[int]string{hdrID: "d", hdrLane: "e/2", hdrFrom: "k/f"})
	use(false, map[int]string{hdrID: "e"})
}

// TestDeliveryIDsUnique: delivery IDs generated concurrently (pooled NUID
// generators, one per P in effect) are unique and valid delivery IDs.
func TestDeliveryIDsUnique(t *testing.T) {
	t.Parallel()
	const workers, each = 16, 5000
	var src idSource
	ids := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				ids[w] = append(ids[w], src.next())
				if i%1000 == 0 {
					runtime.GC() // the pool drops its generators: new ones take over
				}
			}
		}()
	}
	wg.Wait()
	seen := make(map[string]bool, workers*each)
	for _, l := range ids {
		for _, id := range l {
			if seen[id] {
				t.Fatalf("duplicate delivery ID %q", id)
			}
			seen[id] = true
			if err := hub.ValidateID(id); err != nil {
				t.Fatalf("generated ID %q: %v", id, err)
			}
		}
	}
}
