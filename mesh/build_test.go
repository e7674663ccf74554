package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestSlowBuildParks: a hub whose build takes 3× the leg timeout: no
// delivery gets Failed, all are handled in order once it is ready.
func TestSlowBuildParks(t *testing.T) {
	const legTimeout = 100 * time.Millisecond
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a", WithLegTimeout(legTimeout))
	ready := make(chan struct{})
	_ = n.Register("slow", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		select {
		case <-time.After(3 * legTimeout): // a build slower than any leg
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		close(ready)
		return rec.factory(ctx, addr)
	})
	var ids []string
	for i := 0; i < 20; i++ {
		r, err := n.Deliver(context.Background(), Delivery{To: "slow/x", Payload: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatalf("delivery %d during the build: %v", i, err)
		}
		ids = append(ids, r.ID)
	}
	select {
	case <-ready:
		t.Fatalf("the build finished before the deliveries were accepted; the test proves nothing")
	default:
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return rec.total() == 20 }, "all handled after the build")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, d := range rec.handled["slow/x"] {
		if d.ID != ids[i] {
			t.Fatalf("handled #%d is %s, want %s", i, d.ID, ids[i])
		}
	}
	if n.Stats().Failed != 0 || n.Stats().Retries != 0 {
		t.Errorf("client stats %+v", n.Stats())
	}
}

// TestFailedBuildLateUnavailable: a build that fails: each accepted
// delivery gets exactly one late Unavailable (or, if the failure beat the
// reply, one synchronous Unavailable) — never both, never two.
func TestFailedBuildLateUnavailable(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	var mu sync.Mutex
	late := map[string]int{}
	n, _ := testNode(t, s, "a", WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(v.Err, verdict.ErrActivationFailed) || verdict.Classify(v.Err) != verdict.Unavailable {
			t.Errorf("late verdict %v", v.Err)
		}
		late[v.ID]++
	}))
	fail := make(chan struct{})
	_ = n.Register("broken", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		<-fail
		return nil, errors.New("cannot open the database")
	})
	var accepted []string
	for i := 0; i < 10; i++ {
		r, err := n.Deliver(context.Background(), Delivery{To: "broken/x"})
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		accepted = append(accepted, r.ID)
	}
	close(fail)
	natstest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(late) == len(accepted)
	}, "late verdicts")
	// A round trip through the same host after the failure flushes any
	// stray second answer before the count is read.
	_, err := n.Deliver(context.Background(), Delivery{To: "nokind/x"})
	if !errors.Is(err, verdict.ErrUnknownKind) {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range accepted {
		if late[id] != 1 {
			t.Errorf("delivery %s got %d late verdicts, want 1", id, late[id])
		}
	}
	if st := n.Host().Stats(); st.Late != int64(len(accepted)) || st.Activations != 0 {
		t.Errorf("host stats %+v", st)
	}
}

// TestIdleDeactivation: an idle activation is collected after the idle
// timeout and no goroutine stays behind; a build pins it meanwhile.
func TestIdleDeactivation(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Host: hub.Config{IdleTimeout: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var deactivations atomic.Int32
	build := make(chan struct{})
	_ = n.Register("k", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		<-build
		return &deactivatingHub{count: &deactivations}, nil
	})
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Deliver(context.Background(), Delivery{To: "k/x"}); err != nil {
		t.Fatal(err)
	}
	// While building (four idle periods), the activation stays.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.After(200 * time.Millisecond); ; {
		select {
		case <-tick.C:
			if n.Host().Stats().Activations != 1 {
				t.Fatalf("a building activation was collected")
			}
			continue
		case <-end:
		}
		break
	}
	close(build)
	natstest.Eventually(t, 5*time.Second, func() bool {
		return n.Host().Stats().Activations == 0 && deactivations.Load() == 1
	}, "idle activation collected and deactivated")
	// A new delivery activates it afresh.
	if _, err := n.Deliver(context.Background(), Delivery{To: "k/x"}); err != nil {
		t.Fatal(err)
	}
	if n.Host().Stats().Deactivated != 1 {
		t.Errorf("stats %+v", n.Host().Stats())
	}
}

type deactivatingHub struct{ count *atomic.Int32 }

func (h *deactivatingHub) Handle(context.Context, *hub.Delivery) error { return nil }
func (h *deactivatingHub) Deactivate(context.Context)                  { h.count.Add(1) }

// TestDrainSettles: drain answers new arrivals ShuttingDown and settles
// what it accepted; a delivery still queued when drain's ctx ends gets one
// late ShuttingDown.
func TestDrainSettles(t *testing.T) {
	s := natstest.RunServer(t)
	var mu sync.Mutex
	var lates []LateVerdict
	n, rec := testNode(t, s, "a", WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		lates = append(lates, v)
		mu.Unlock()
	}))
	block := make(chan struct{})
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if string(d.Payload) == "block" {
			select {
			case <-block:
			case <-ctx.Done():
			}
		}
		return nil
	}
	sender := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithRetry(RetryPolicy{MaxRetries: -1}), WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		lates = append(lates, v)
		mu.Unlock()
	}))
	ctx := context.Background()
	if _, err := sender.Deliver(ctx, Delivery{To: "rec/x", Payload: []byte("block")}); err != nil {
		t.Fatal(err)
	}
	queued, err := sender.Deliver(ctx, Delivery{To: "rec/x"})
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Host().Drain(dctx) }()
	natstest.Eventually(t, 5*time.Second, func() bool {
		_, err := sender.Deliver(ctx, Delivery{To: "rec/y"})
		return errors.Is(err, verdict.ErrHubShuttingDown) && verdict.IsResendable(err)
	}, "new arrivals refused ShuttingDown")
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drain = %v, want its deadline", err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lates) == 1
	}, "late ShuttingDown for the queued delivery")
	mu.Lock()
	defer mu.Unlock()
	if lates[0].ID != queued.ID || verdict.Classify(lates[0].Err) != verdict.ShuttingDown || !verdict.IsResendable(lates[0].Err) {
		t.Errorf("late verdict %+v", lates[0])
	}
	if rec.executions(queued.ID) != 0 {
		t.Errorf("the queued delivery was both handled and failed")
	}
}
