package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// brkRecorder records what its hubs handled: per delivery ID how often,
// and per address the IDs in handling order.
type brkRecorder struct {
	mu    sync.Mutex
	count map[string]int
	order map[subjects.Address][]string
}

func (r *brkRecorder) factory(context.Context, subjects.Address) (hub.Hub, error) {
	return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
		r.mu.Lock()
		r.count[d.ID]++
		r.order[d.To] = append(r.order[d.To], d.ID)
		r.mu.Unlock()
		return nil
	}), nil
}

// TestBreakerServerRestartMidWindow: windows pipelined (DeliverAsync,
// window 32) on several lanes from an in-process client to an in-process
// node, through a real nats-server process that is SIGKILLed and
// restarted on the same port four times while the windows are full: legs and
// replies in flight are lost with it, legs published meanwhile wait in the
// reconnect buffer, and the node's subscription comes back after the
// client's. Every delivery ends accepted (re-sent under its ID, deduped),
// is handled exactly once, and each lane is handled in call order.
func TestBreakerServerRestartMidWindow(t *testing.T) {
	longTest(t)
	tb := time.Now()
	b := Build(t)
	t.Logf("built in %v", time.Since(tb))
	port := FreePort(t)
	dir := t.TempDir()
	args := []string{"-a", "127.0.0.1", "-p", fmt.Sprint(port), "-sd", dir}
	srv := Start(t, b.NATSServer, args...)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	WaitTCP(t, fmt.Sprintf("127.0.0.1:%d", port), 15*time.Second)
	quiet := slog.New(slog.DiscardHandler)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	n, err := mesh.NewNode(mesh.NodeConfig{Conn: connect(), Name: "rs", DisableControl: true, DisableIngress: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rec := &brkRecorder{count: map[string]int{}, order: map[subjects.Address][]string{}}
	if err := n.Register("rec", rec.factory); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	nc := connect()
	c, err := mesh.NewClient(mesh.Config{Conn: nc, Resolver: mesh.StaticResolver{Node: n.ID()}}, mesh.WithLogger(quiet), mesh.WithWindow(32),
		mesh.WithRetry(mesh.RetryPolicy{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond, MaxRetries: 400}),
		mesh.WithRequestTimeout(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if _, err := c.Deliver(context.Background(), mesh.Delivery{To: "rec/warm"}); err != nil {
		t.Fatal(err)
	}
	const lanes, per = 4, 1000
	type call struct {
		id  string
		ch  <-chan mesh.Result
		err error
	}
	calls := make([][]*call, lanes)
	addrOf := func(l int) subjects.Address { return subjects.Address(fmt.Sprint("rec/rs", l%2)) }
	restarts := 0
	t0 := time.Now()
	for i := range per {
		for l := range lanes {
			k := &call{id: fmt.Sprintf("rs-%d-%d", l, i)}
			k.ch = c.DeliverAsync(context.Background(), mesh.Delivery{ID: k.id, To: addrOf(l), Stream: subjects.Stream(fmt.Sprint(l)), Payload: []byte(k.id)})
			calls[l] = append(calls[l], k)
		}
	}
	// Kill the server under the full windows, again each time some more
	// deliveries were accepted since it came back.
	for restarts < 4 {
		before := n.Host().Stats().Accepted
		natstest.Eventually(t, 20*time.Second, func() bool { return n.Host().Stats().Accepted >= before+150 }, "progress after restart %d", restarts)
		_ = srv.Signal(syscall.SIGKILL)
		srv.Wait(t, 10*time.Second)
		srv = Start(t, b.NATSServer, args...)
		WaitTCP(t, fmt.Sprintf("127.0.0.1:%d", port), 15*time.Second)
		restarts++
		t.Logf("restart %d at %v, %d accepted before", restarts, time.Since(t0), n.Host().Stats().Accepted)
	}
	byID := map[string]*call{}
	for l := range lanes {
		for _, k := range calls[l] {
			select {
			case r := <-k.ch:
				k.err = r.Err
			case <-time.After(90 * time.Second):
				t.Fatalf("%s: no verdict", k.id)
			}
			select {
			case r := <-k.ch:
				t.Errorf("%s: a second verdict %+v", k.id, r)
			default:
			}
			byID[k.id] = k
			if k.err != nil && !errors.Is(k.err, context.DeadlineExceeded) {
				t.Errorf("%s: %v (resendable %v)", k.id, k.err, verdict.IsResendable(k.err))
			}
		}
	}
	t.Logf("verdicts at %v", time.Since(t0))
	natstest.Eventually(t, 20*time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for id, k := range byID {
			if k.err == nil && rec.count[id] == 0 {
				return false
			}
		}
		return true
	}, "every accepted delivery handled")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for id, k := range byID {
		if n := rec.count[id]; n > 1 || k.err == nil && n != 1 {
			t.Errorf("%s (%v): handled %d times", id, k.err, n)
		}
	}
	next := make([]int, lanes)
	for _, a := range []subjects.Address{addrOf(0), addrOf(1)} {
		for _, id := range rec.order[a] {
			var l, i int
			if _, err := fmt.Sscanf(id, "rs-%d-%d", &l, &i); err != nil {
				continue
			}
			if i < next[l] {
				t.Errorf("lane %d: #%d handled after #%d", l, i, next[l]-1)
			}
			next[l] = i + 1
		}
	}
	t.Logf("%d deliveries, %d server restarts; client %+v; host %+v", lanes*per, restarts, c.Stats(), n.Host().Stats())
}
