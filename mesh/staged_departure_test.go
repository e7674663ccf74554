package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// movingResolver names generation hold.<gen> until done, then the real
// node; cached says whether it is a cachedResolver (legs staged).
type movingResolver struct {
	gen  atomic.Uint64
	done atomic.Bool
	real subjects.NodeID
}

func (r *movingResolver) owner() subjects.NodeID {
	if r.done.Load() {
		return r.real
	}
	return subjects.NodeID{Name: "hold", Generation: r.gen.Load()}
}

func (r *movingResolver) Resolve(context.Context, subjects.Address) (subjects.NodeID, error) {
	return r.owner(), nil
}
func (r *movingResolver) Invalidate(subjects.Address, subjects.NodeID) {}

// Gone reports whether node is a "hold" generation the resolver moved on
// from: the resolver is its client's cluster view, which knows a departure
// before the client is told (failNode), as a node's membership does.
func (r *movingResolver) Gone(node subjects.NodeID) bool {
	return node.Name == "hold" && (r.done.Load() || node.Generation < r.gen.Load())
}

type cachedMovingResolver struct{ *movingResolver }

func (r cachedMovingResolver) Cached(subjects.Address) (subjects.NodeID, bool) {
	return r.owner(), true
}

// TestBreakStagedWaitersPayForDepartures: a stop-and-wait lane (window 1)
// whose head's leg is in flight to an owner that never answers, and
// callers waiting behind it in the lane — nothing of theirs sent. The
// owner departs (failNode) twice, the lane's owner re-resolved each
// time, then the real node takes over. With held legs (a resolver without
// a cache) the waiters are not touched: nothing of them was sent or
// addressed. With staged legs (the owner cached) every waiter's prepared
// leg is indexed under the departing owner, so each departure costs every
// waiter an attempt and a back-off although it never sent a leg — with
// MaxRetries 2 they fail with the departed verdict, attempts exhausted,
// having sent nothing. The same facts give two verdicts depending on
// whether the owner was cached (DESIGN §3: "a verdict follows from what
// was sent and accepted"), and a deep lane's waiters burn their ladder on
// departures of owners they never reached.
func TestStagedWaitersDoNotPayForDepartures(t *testing.T) {
	for _, staged := range []bool{false, true} {
		t.Run(fmt.Sprintf("staged=%v", staged), func(t *testing.T) {
			s := natstest.RunServer(t)
			n, rec := testNode(t, s, "a")
			hc := natstest.Connect(t, s)
			var legs atomic.Int64
			sub, err := hc.Subscribe(subjects.DefaultPrefix.Sub("dlv.hold.>"), func(*nats.Msg) { legs.Add(1) }) // never answers
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			_ = hc.Flush()
			mr := &movingResolver{real: n.ID()}
			mr.gen.Store(1)
			var res Resolver = mr
			if staged {
				res = cachedMovingResolver{mr}
			}
			c := newClient(t, natstest.Connect(t, s), res, WithWindow(1), WithClock(newFakeClock()),
				WithRetry(RetryPolicy{MaxRetries: 2}), WithLegTimeout(time.Minute), WithRequestTimeout(2*time.Minute), WithView(mr))
			const waiters = 10
			key := LaneKey{Addr: "rec/w"}
			type out struct {
				r   Receipt
				err error
			}
			outs := make([]out, waiters+1)
			var wg sync.WaitGroup
			for i := range waiters + 1 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := c.Deliver(context.Background(), Delivery{ID: fmt.Sprintf("w%d", i), To: "rec/w"})
					outs[i] = out{r, err}
				}()
				natstest.Eventually(t, 5*time.Second, func() bool { return c.laneDepth(key) == i+1 }, "call %d joined", i)
				if i == 0 {
					natstest.Eventually(t, 5*time.Second, func() bool { return legs.Load() == 1 }, "head's leg in flight")
				}
			}
			for d := range 2 {
				before := legs.Load()
				old := mr.owner()
				mr.gen.Add(1)
				c.failNode(old, "break: departs")
				// The head is re-sent to the next generation.
				natstest.Eventually(t, 5*time.Second, func() bool { return legs.Load() > before }, "departure %d: head re-sent", d)
			}
			old := mr.owner()
			mr.done.Store(true)
			c.failNode(old, "break: departs, the real node takes over")
			wg.Wait()
			var failed []string
			for i := 1; i <= waiters; i++ {
				if outs[i].err != nil || outs[i].r.Attempts != 1 {
					failed = append(failed, fmt.Sprintf("w%d: attempts %d, %v", i, outs[i].r.Attempts, outs[i].err))
				}
			}
			t.Logf("head: attempts %d, %v; legs to departing owners %d; handled %d; retries %d", outs[0].r.Attempts, outs[0].err, legs.Load(), rec.total(), c.Stats().Retries)
			if len(failed) > 0 {
				var de bool
				for i := 1; i <= waiters; i++ {
					de = de || errors.Is(outs[i].err, verdict.ErrDeparted)
				}
				t.Errorf("waiters that never sent a leg before the real owner took over paid for the departures (departed verdicts: %v):\n%v", de, failed)
			}
		})
	}
}
