package mesh

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// spawner's turn starts a goroutine that, after the turn returned, sends a
// Request with the turn's ctx to hop/b, whose turn requests spawn/a back.
// spawn/a is waiting on nothing then: the request into it is no cycle.
type spawner struct {
	c    *Client
	errs chan error
}

func (s *spawner) Handle(ctx context.Context, d *hub.Delivery) error {
	if d.Type != "go" {
		return d.Respond([]byte("a"))
	}
	go func() {
		time.Sleep(300 * time.Millisecond) // the turn is long over
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := s.c.Request(rctx, Delivery{To: "hop/b", Payload: []byte("spawn/a")})
		s.errs <- err
	}()
	return nil
}

// A goroutine that outlives its turn and keeps using the turn's ctx (a
// documented way to reach ChainOf: "derived from a hub turn's") carries a
// chain naming its address for ever: a later A → B → A through it is no
// cycle (A's turn returned long ago), yet must not be refused.
func TestStaleTurnCtxNoFalseCycle(t *testing.T) {
	t.Parallel()
	n := hopNode(t)
	sp := &spawner{c: n.Client, errs: make(chan error, 1)}
	if err := n.Register("spawn", func(context.Context, subjects.Address) (hub.Hub, error) { return sp, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Request(context.Background(), Delivery{To: "spawn/a", Type: "go"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-sp.errs:
		if err != nil {
			t.Fatalf("B → A after A's turn returned: %v (call-cycle: %v)", err, errors.Is(err, verdict.ErrCallCycle))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
}

// A cycle made from a goroutine the turn spawned and waits on, with the
// turn's ctx, is refused at once.
type waiter struct{ c *Client }

func (w *waiter) Handle(ctx context.Context, d *hub.Delivery) error {
	if len(d.Payload) == 0 {
		return d.Respond([]byte("w"))
	}
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err = w.c.Request(ctx, Delivery{To: "hop/b", Payload: d.Payload})
	}()
	wg.Wait()
	return err
}

func TestCycleFromSpawnedGoroutineDetected(t *testing.T) {
	t.Parallel()
	n := hopNode(t)
	if err := n.Register("wait", func(context.Context, subjects.Address) (hub.Hub, error) { return &waiter{c: n.Client}, nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := n.Request(ctx, Delivery{To: "wait/a", Payload: []byte("wait/a,x")})
	if !errors.Is(err, verdict.ErrCallCycle) {
		t.Fatalf("A(goroutine) → B → A: %v", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("took %v", el)
	}
}

// Many unrelated chains through shared addresses at once (X_i → S → T_i):
// none is refused as a cycle.
func TestUnrelatedChainsNoFalseCycle(t *testing.T) {
	t.Parallel()
	n := hopNode(t)
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := n.Request(ctx, Delivery{To: subjects.Address("hop/x" + strconv.Itoa(i)), Payload: []byte(fmt.Sprintf("hop/shared,re/t%d,hop/shared2", (i+j)%5))})
				cancel()
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Read-only turns under many senders: 8 streams of exclusive writes (each
// sent in order by one goroutine, half Deliver, half Request), 32 readers.
func TestReadOnlyManySenders(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	r := &register{readWork: 2 * time.Millisecond, setWork: 500 * time.Microsecond}
	n := registerNode(t, s, r)
	ctx := context.Background()
	const writes, streams, readers = 60, 8, 32
	var wg sync.WaitGroup
	errs := make(chan error, streams*writes+readers*writes)
	for st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range writes {
				d := Delivery{To: "reg/x", Stream: subjects.Stream(fmt.Sprint(st)), Type: "set", Payload: []byte(strconv.Itoa(i))}
				var err error
				if st%2 == 0 {
					_, err = n.Deliver(ctx, d)
				} else {
					_, err = n.Request(ctx, d)
				}
				errs <- err
			}
		}()
	}
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range writes {
				_, err := n.Request(ctx, Delivery{To: "reg/x", Type: "get"})
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 20*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.writes) == streams*writes
	}, "not every write ran")
	if v := r.violations.Load(); v != 0 {
		t.Fatalf("%d turns overlapped an exclusive turn", v)
	}
	next := map[string]int{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.writes {
		var st string
		var i int
		fmt.Sscanf(w, "%1s:%d", &st, &i)
		if i != next[st] {
			t.Fatalf("stream %s: write %d ran after %d", st, i, next[st]-1)
		}
		next[st]++
	}
	t.Logf("up to %d read-only turns at once", r.maxReaders.Load())
}

// A read-only turn that requests its own address (A(read) → B → A(read)):
// documented refused (the waiting reads hold the inbox head) - must fail
// fast, not hang.
type roHop struct {
	c *Client
}

func (h *roHop) ReadOnlyTypes() []string { return []string{"get"} }
func (h *roHop) Handle(ctx context.Context, d *hub.Delivery) error {
	if len(d.Payload) == 0 {
		return d.Respond([]byte("ro"))
	}
	_, err := h.c.Request(ctx, Delivery{To: "hop/b", Type: "", Payload: d.Payload})
	return err
}

func TestReadOnlyCycleFailsFast(t *testing.T) {
	t.Parallel()
	n := hopNode(t)
	if err := n.Register("ro", func(context.Context, subjects.Address) (hub.Hub, error) { return &roHop{c: n.Client}, nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	// hop/b requests ro/a (type "" = exclusive) while ro/a runs a read.
	_, err := n.Request(ctx, Delivery{To: "ro/a", Type: "get", Payload: []byte("ro/a")})
	if !errors.Is(err, verdict.ErrCallCycle) || time.Since(start) > 3*time.Second {
		t.Fatalf("read-only A → B → A: %v after %v", err, time.Since(start))
	}
}
