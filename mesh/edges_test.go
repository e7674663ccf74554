package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// unsentVerdict reports whether err is the verdict of a delivery whose
// deadline passed before any leg left: resendable Unavailable, never a
// timeout.
func unsentVerdict(err error) bool {
	return errors.Is(err, verdict.ErrDeadlineUnsent) && verdict.IsResendable(err) &&
		verdict.Classify(err) == verdict.Unavailable && !errors.Is(err, context.DeadlineExceeded)
}

// TestExpiredDeadlineSendsNothing: a Deliver, DeliverAsync or Request whose
// deadline has already passed when it is called sends no leg and returns
// verdict.ErrDeadlineUnsent — never a timeout, which would tell the caller
// the callee may hold a delivery that was sent after its deadline.
func TestExpiredDeadlineSendsNothing(t *testing.T) {
	s := natstest.RunServer(t)
	in := acceptIntake(t, s, "acc", func(id string) []byte { return []byte(id) })
	c := newClient(t, natstest.Connect(t, s), genResolver("acc"))
	for rep := range reps(t, 60) {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
		id := fmt.Sprintf("late-%d", rep)
		d := Delivery{ID: id, To: subjects.Address(fmt.Sprintf("k/%d", rep%3))}
		var err error
		switch rep % 3 {
		case 0:
			_, err = c.Deliver(ctx, d)
		case 1:
			err = (<-c.DeliverAsync(ctx, d)).Err
		case 2:
			_, err = c.Request(ctx, d)
		}
		cancel()
		// A probe on the same connection: if the late delivery had been
		// published, the intake would have counted it before the probe.
		probe := fmt.Sprintf("probe-%d", rep)
		if _, err := c.Deliver(context.Background(), Delivery{ID: probe, To: d.To}); err != nil {
			t.Fatal(err)
		}
		if n := in.count(id); n != 0 || !unsentVerdict(err) {
			t.Fatalf("rep %d (call %d): sent %d legs, verdict %v (resendable %v, %v); want nothing sent and ErrDeadlineUnsent",
				rep, rep%3, n, err, verdict.IsResendable(err), verdict.Classify(err))
		}
	}
}

// TestDirectoryOutageResendable: a delivery whose owner cannot be resolved
// because the directory does not answer (its NATS server is down) was never
// sent: its verdict is resendable (directory-unavailable, or
// deadline-unsent once the caller's deadline passed), never a timeout.
func TestDirectoryOutageResendable(t *testing.T) {
	s := natstest.RunServer(t)
	rec := newRecorder()
	nc := natstest.Connect(t, s, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}), nats.MaxReconnects(-1))
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Membership: &mc})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register("rec", rec.factory); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	s.Shutdown()
	for rep := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rep+1)*3*time.Second)
		_, err := n.Deliver(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/fresh-%d", rep))})
		cancel()
		if !verdict.IsResendable(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			t.Errorf("rep %d: directory unreachable, nothing sent: %v (resendable %v, %v); want resendable, not a timeout",
				rep, err, verdict.IsResendable(err), verdict.Classify(err))
		}
	}
}

// TestCloseRacesNewDeliveries: Close while other goroutines keep starting
// Deliver, DeliverAsync and Request calls. Every call ends with exactly one
// verdict — accepted (handled once) or verdict.ErrClosing — and nothing
// races (run under -race: a call joining as Close waits for the calls in
// progress must not be a WaitGroup misuse).
func TestCloseRacesNewDeliveries(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	nc := natstest.Connect(t, s)
	for rep := range reps(t, 100) {
		c, err := NewClient(Config{Conn: nc, Resolver: StaticResolver{Node: n.ID()}, Identity: subjects.NodeID{Name: "c", Generation: uint64(rep + 1)}})
		if err != nil {
			t.Fatal(err)
		}
		const callers = 4
		started := make(chan struct{}, callers)
		type out struct {
			id  string
			err error
		}
		outs := make(chan out, 1024)
		done := make(chan struct{})
		var wg sync.WaitGroup
		for g := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					id := fmt.Sprintf("c%d-%d-%d", rep, g, i)
					d := Delivery{ID: id, To: subjects.Address(fmt.Sprintf("rec/c%d", g))}
					var err error
					switch i % 3 {
					case 0:
						_, err = c.Deliver(context.Background(), d)
					case 1:
						err = (<-c.DeliverAsync(context.Background(), d)).Err
					case 2:
						_, err = c.Request(context.Background(), d)
					}
					outs <- out{id, err}
					if i == 0 {
						started <- struct{}{}
					}
					if err != nil {
						return
					}
					select {
					case <-done:
						return
					default:
					}
				}
			}()
		}
		for range callers {
			<-started
		}
		c.Close()
		close(done)
		wg.Wait()
		close(outs)
		for o := range outs {
			if o.err != nil && !errors.Is(o.err, verdict.ErrClosing) && !errors.Is(o.err, verdict.ErrOutcomeUnknown) {
				t.Fatalf("rep %d: %s: %v; want accepted or ErrClosing (a Request accepted before Close: outcome unknown)", rep, o.id, o.err)
			}
			if o.err == nil {
				natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions(o.id) == 1 }, "%s accepted, handled once", o.id)
			}
		}
	}
}
