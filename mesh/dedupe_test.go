package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestDeactivatedQueueResent: an activation deactivated with a queue fails
// each queued delivery late with the resendable not-owner; the dedupe window
// forgets those IDs, so re-sending them to the same generation is accepted
// and each is handled exactly once — not answered Accepted from the window
// and never handled (a loss reported as success).
func TestDeactivatedQueueResent(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	var lateMu sync.Mutex
	late := map[string]error{}
	n, rec := testNode(t, s, "a", WithLateVerdicts(func(v LateVerdict) {
		lateMu.Lock()
		late[v.ID] = v.Err
		lateMu.Unlock()
	}))
	release := make(chan struct{})
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.Type == "block" {
			<-release
		}
		return nil
	}
	ctx := context.Background()
	if _, err := n.Deliver(ctx, Delivery{To: "rec/q", ID: "head", Type: "block"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.executions("head") == 1 }, "head running")
	const queued = 50
	ids := make([]string, queued)
	for i := range ids {
		ids[i] = fmt.Sprintf("q-%d", i)
		if _, err := n.Deliver(ctx, Delivery{To: "rec/q", ID: ids[i], Stream: "s"}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		n.Host().Deactivate("rec/q") // fails the queue at once, then waits for the head's handler
		close(done)
	}()
	natstest.Eventually(t, 5*time.Second, func() bool {
		lateMu.Lock()
		defer lateMu.Unlock()
		return len(late) == queued
	}, "late verdicts for the queue")
	close(release)
	<-done
	for _, id := range ids {
		if err := late[id]; !errors.Is(err, verdict.ErrNotOwner) || !verdict.IsResendable(err) {
			t.Fatalf("%s: late verdict %v", id, err)
		}
		if rec.executions(id) != 0 {
			t.Fatalf("%s handled before its re-send", id)
		}
	}
	for _, id := range ids {
		if _, err := n.Deliver(ctx, Delivery{To: "rec/q", ID: id, Stream: "s"}); err != nil {
			t.Fatalf("re-send %s: %v", id, err)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == queued+1 }, "re-sent deliveries handled: %d", rec.total())
	for _, id := range ids {
		if got := rec.executions(id); got != 1 {
			t.Errorf("%s handled %d times, want once", id, got)
		}
	}
	// The re-sent ones are remembered again: a duplicate is not run twice.
	if _, err := n.Deliver(ctx, Delivery{To: "rec/q", ID: ids[0], Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	if got := rec.executions(ids[0]); got != 1 {
		t.Errorf("duplicate of a handled delivery ran again (%d)", got)
	}
}

// TestDuplicateRequestGetsResponse: a duplicate of a handled Request gets
// its response again from the window (handler run once); once the bounded
// store dropped it, the duplicate gets verdict.ErrResponseGone — never
// Accepted followed by silence.
func TestDuplicateRequestGetsResponse(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		return d.Respond([]byte("re:" + d.ID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		resp, err := n.Request(ctx, Delivery{To: "rec/r", ID: "once"})
		if err != nil || string(resp.Payload) != "re:once" {
			t.Fatalf("request %d: %q %v", i, resp.Payload, err)
		}
	}
	if got := rec.executions("once"); got != 1 {
		t.Errorf("handler ran %d times", got)
	}

	nc := natstest.Connect(t, s)
	small, err := NewNode(NodeConfig{Conn: nc, Name: "small", Host: hub.Config{DedupeResponseBytes: 16}})
	if err != nil {
		t.Fatal(err)
	}
	rec2 := newRecorder()
	rec2.fn = rec.fn
	if err := small.Register("rec", rec2.factory); err != nil {
		t.Fatal(err)
	}
	if err := small.Start(); err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if _, err := small.Request(ctx, Delivery{To: "rec/r", ID: "first-one"}); err != nil {
		t.Fatal(err)
	}
	if _, err := small.Request(ctx, Delivery{To: "rec/r", ID: "second-one"}); err != nil { // evicts the first response (16 bytes)
		t.Fatal(err)
	}
	if resp, err := small.Request(ctx, Delivery{To: "rec/r", ID: "second-one"}); err != nil || string(resp.Payload) != "re:second-one" {
		t.Fatalf("duplicate of a kept response: %q %v", resp.Payload, err)
	}
	_, err = small.Request(ctx, Delivery{To: "rec/r", ID: "first-one"})
	if !errors.Is(err, verdict.ErrResponseGone) || verdict.IsTransient(err) {
		t.Fatalf("duplicate of a dropped response: %v; want ErrResponseGone", err)
	}
	if rec2.executions("first-one") != 1 || rec2.executions("second-one") != 1 {
		t.Errorf("executions %d, %d", rec2.executions("first-one"), rec2.executions("second-one"))
	}
}

// TestDrainDeadlineFlushesLateVerdicts: a drain that reaches its deadline
// with deliveries still queued fails each with a late ShuttingDown, and
// every one of those late verdicts reaches its sender before the drain
// returns — so the server may stop right after it (as an embedded one
// does).
func TestDrainDeadlineFlushesLateVerdicts(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	release := make(chan struct{})
	defer close(release)
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.Type == "block" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}
	var mu sync.Mutex
	late := map[string]error{}
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		late[v.ID] = v.Err
		mu.Unlock()
	}))
	ctx := context.Background()
	if _, err := c.Deliver(ctx, Delivery{To: "rec/d", Type: "block"}); err != nil {
		t.Fatal(err)
	}
	const queued = 200
	for i := range queued {
		if _, err := c.Deliver(ctx, Delivery{To: "rec/d", ID: fmt.Sprintf("q%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := n.Drain(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain = %v, want its deadline", err)
	}
	got := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(late)
	}
	t.Logf("drain returned; %d late verdicts received so far; client %+v", got(), c.Stats())
	s.Shutdown() // what an embedded server does right after the drain
	natstest.Eventually(t, 5*time.Second, func() bool { return got() == queued }, "late verdicts received (%d queued)", queued)
	mu.Lock()
	defer mu.Unlock()
	for id, err := range late {
		if !errors.Is(err, verdict.ErrHubShuttingDown) || !verdict.IsResendable(err) {
			t.Fatalf("%s: %v", id, err)
		}
	}
}

// TestDuplicateRequestWhileQueued: a Request re-sent by another sender (an
// outside client re-sending through a second ingress node) while the first
// copy is still queued or running is answered Accepted without a second
// copy, and the one answer — the response, or the late verdict if the queue
// is failed — reaches both senders. The duplicate lands at every position:
// queued behind a running turn, and while its own turn runs.
func TestDuplicateRequestWhileQueued(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	release := make(chan struct{})
	running := make(chan string, 64)
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.Type == "block" {
			running <- d.ID
			<-release
		}
		return d.Respond([]byte("re:" + d.ID))
	}
	res := StaticResolver{Node: n.ID()}
	a := newClient(t, natstest.Connect(t, s), res)
	b := newClient(t, natstest.Connect(t, s), res)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type got struct {
		resp Response
		err  error
	}
	request := func(c *Client, d Delivery) <-chan got {
		out := make(chan got, 1)
		go func() {
			r, err := c.Request(ctx, d)
			out <- got{r, err}
		}()
		return out
	}
	hits := func() int64 { return n.Host().Stats().DedupeHits }
	accepted := func() int64 { return n.Host().Stats().Accepted }

	for round := range 20 {
		queued := round%2 == 0 // else the duplicate arrives while its own turn runs
		release = make(chan struct{})
		id := fmt.Sprintf("dup-%d", round)
		var head <-chan got
		before := accepted()
		if queued {
			head = request(a, Delivery{To: "rec/q", ID: fmt.Sprintf("head-%d", round), Type: "block"})
			<-running
		}
		typ := ""
		if !queued {
			typ = "block"
		}
		first := request(a, Delivery{To: "rec/q", ID: id, Type: typ})
		if queued {
			natstest.Eventually(t, 5*time.Second, func() bool { return accepted() >= before+2 }, "first copy accepted")
		} else {
			<-running
		}
		h0 := hits()
		second := request(b, Delivery{To: "rec/q", ID: id, Type: typ})
		natstest.Eventually(t, 5*time.Second, func() bool { return hits() > h0 }, "duplicate answered from the window")
		close(release)
		if head != nil {
			if g := <-head; g.err != nil {
				t.Fatal(g.err)
			}
		}
		for name, ch := range map[string]<-chan got{"first": first, "duplicate": second} {
			g := <-ch
			if g.err != nil || string(g.resp.Payload) != "re:"+id {
				t.Fatalf("round %d (queued %v), %s sender: %q %v", round, queued, name, g.resp.Payload, g.err)
			}
		}
		if e := rec.executions(id); e != 1 {
			t.Fatalf("round %d: handler ran %d times", round, e)
		}
	}

	// A queue failed late: both senders get the one late verdict.
	release = make(chan struct{})
	head := request(a, Delivery{To: "rec/f", ID: "f-head", Type: "block"})
	<-running
	before := accepted()
	first := request(a, Delivery{To: "rec/f", ID: "f-dup"})
	natstest.Eventually(t, 5*time.Second, func() bool { return accepted() > before }, "first copy accepted")
	h0 := hits()
	second := request(b, Delivery{To: "rec/f", ID: "f-dup"})
	natstest.Eventually(t, 5*time.Second, func() bool { return hits() > h0 }, "duplicate answered from the window")
	done := make(chan struct{})
	go func() { n.Host().Deactivate("rec/f"); close(done) }()
	for name, ch := range map[string]<-chan got{"first": first, "duplicate": second} {
		g := <-ch
		if !errors.Is(g.err, verdict.ErrNotOwner) {
			t.Errorf("%s sender of a queue failed late: %v, want the late not-owner", name, g.err)
		}
	}
	close(release)
	<-head
	<-done
	if e := rec.executions("f-dup"); e != 0 {
		t.Errorf("failed delivery handled %d times", e)
	}
}

// TestDrainedHostAnswersDuplicates: after a host's drain, until the node
// closes it (a node's drain does so once it has left the registry), a
// sender's re-send under the ID of a delivery the host handled is answered
// from the dedupe window — Accepted, the kept response again, the handler
// not run again — and a new delivery is refused ShuttingDown (resendable).
// Before, the drained host unsubscribed at once: the re-send met no
// responders, re-resolved, and ran again on the address's next owner (the
// nemesis, seed 2104 with idle collection: a re-send 1 ms after a drain
// began).
func TestDrainedHostAnswersDuplicates(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	rec.fn = func(ctx context.Context, d *hub.Delivery) error { return d.Respond([]byte("re:" + d.ID)) }
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: n.ID()}, WithRetry(RetryPolicy{Initial: time.Millisecond, Max: time.Millisecond, MaxRetries: 2}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const handled = 20
	for i := range handled {
		id := fmt.Sprintf("h-%d", i)
		r, err := c.Request(ctx, Delivery{To: "rec/d", ID: id, Stream: subjects.Stream(fmt.Sprint(i % 3))})
		if err != nil || string(r.Payload) != "re:"+id {
			t.Fatalf("request %s: %q, %v", id, r.Payload, err)
		}
		if i%2 == 0 { // plain deliveries too
			if _, err := c.Deliver(ctx, Delivery{To: "rec/d", ID: "p-" + id}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := n.Host().Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	for i := range handled {
		id := fmt.Sprintf("h-%d", i)
		r, err := c.Request(ctx, Delivery{To: "rec/d", ID: id, Stream: subjects.Stream(fmt.Sprint(i % 3))})
		if err != nil || string(r.Payload) != "re:"+id {
			t.Errorf("re-sent %s after the drain: %q, %v; want the kept response", id, r.Payload, err)
		}
		if i%2 == 0 {
			if _, err := c.Deliver(ctx, Delivery{To: "rec/d", ID: "p-" + id}); err != nil {
				t.Errorf("re-sent p-%s after the drain: %v; want Accepted from the dedupe window", id, err)
			}
		}
		if k := rec.executions(id); k != 1 {
			t.Errorf("%s ran %d times", id, k)
		}
	}
	_, err := c.Deliver(ctx, Delivery{To: "rec/d", ID: "new-after-drain"})
	if verdict.Classify(err) != verdict.ShuttingDown || !verdict.IsResendable(err) {
		t.Errorf("a new delivery after the drain: %v; want a resendable ShuttingDown", err)
	}
	if rec.executions("new-after-drain") != 0 {
		t.Errorf("a new delivery ran on a drained host")
	}
}
