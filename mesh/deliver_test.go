package mesh

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

func TestDeliverAccepted(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	ctx := context.Background()
	r, err := n.Deliver(ctx, Delivery{To: "rec/x", Stream: "s", Type: "greet", Payload: []byte("hi"), From: "rec/me"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Node != n.ID() || r.Attempts != 1 || r.ID == "" {
		t.Errorf("receipt %+v", r)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 1 }, "handled")
	d := rec.handled["rec/x"][0]
	if d.ID != r.ID || string(d.Payload) != "hi" || d.Type != "greet" || d.Stream != "s" || d.From != "rec/me" || d.Attempt != 1 || d.Sender != n.ID().String() {
		t.Errorf("handled %+v", d)
	}
}

func TestRequestResponse(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		switch string(d.Payload) {
		case "fail":
			return errors.New("no such thing")
		case "silent":
			return nil
		}
		return d.Respond(append([]byte("re: "), d.Payload...))
	}
	ctx := context.Background()
	resp, err := n.Request(ctx, Delivery{To: "rec/x", Payload: []byte("ping")})
	if err != nil || string(resp.Payload) != "re: ping" || resp.Node != n.ID() {
		t.Fatalf("Request = %+v, %v", resp, err)
	}
	resp, err = n.Request(ctx, Delivery{To: "rec/x", Payload: []byte("silent")})
	if err != nil || len(resp.Payload) != 0 {
		t.Fatalf("silent handler: %+v, %v", resp, err)
	}
	_, err = n.Request(ctx, Delivery{To: "rec/x", Payload: []byte("fail")})
	if !errors.Is(err, verdict.ErrHandler) || verdict.Classify(err) != verdict.Failed || verdict.IsTransient(err) || !strings.Contains(err.Error(), "no such thing") {
		t.Fatalf("failing handler: %v", err)
	}
}

// TestRequestAcceptedNoResponse: an accepted request whose response never
// comes fails at ctx's deadline as a timeout and is not re-sent.
func TestRequestAcceptedNoResponse(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	release := make(chan struct{})
	defer close(release)
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		<-release
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	resp, err := n.Request(ctx, Delivery{To: "rec/x"})
	if !errors.Is(err, context.DeadlineExceeded) || verdict.IsResendable(err) || verdict.Classify(err) != verdict.Failed {
		t.Fatalf("Request = %v; want a non-resendable timeout", err)
	}
	if resp.Node != n.ID() || resp.Attempts != 1 {
		t.Errorf("receipt %+v: want accepted on the first attempt", resp.Receipt)
	}
	if got := rec.executions(resp.ID); got != 1 {
		t.Errorf("executions = %d, want 1", got)
	}
}

// TestRequestTimeoutWithoutDeadline: a Request whose ctx has no deadline
// is bounded by the request timeout (WithRequestTimeout) once accepted, as
// a timeout — Failed, not resendable, context.DeadlineExceeded — handled
// once; while a response that comes within it still wins, every time, and
// the timers that bound the wait are recycled without a stale tick (many
// Requests, alternating answered and unanswered).
func TestRequestTimeoutWithoutDeadline(t *testing.T) {
	s := natstest.RunServer(t)
	const timeout = 150 * time.Millisecond
	n, rec := testNode(t, s, "a", WithRequestTimeout(timeout))
	release := make(chan struct{})
	defer close(release)
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if string(d.Payload) == "silent" {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
		return d.Respond(d.Payload)
	}
	ctx := context.Background()
	for i := 0; i < 6; i++ {
		start := time.Now()
		resp, err := n.Request(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/silent-%d", i)), Payload: []byte("silent")})
		if !errors.Is(err, context.DeadlineExceeded) || verdict.IsResendable(err) || verdict.Classify(err) != verdict.Failed {
			t.Fatalf("round %d: Request = %v; want a non-resendable timeout", i, err)
		}
		if waited := time.Since(start); waited < timeout {
			t.Fatalf("round %d: failed after %v, before the request timeout %v", i, waited, timeout)
		}
		if resp.Node != n.ID() || resp.Attempts != 1 {
			t.Errorf("round %d: receipt %+v: want accepted on the first attempt", i, resp.Receipt)
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return rec.executions(resp.ID) == 1 }, "handled once")
		for j := 0; j < 50; j++ { // recycled timers: no stale expiry
			p := []byte(fmt.Sprintf("p%d-%d", i, j))
			resp, err := n.Request(ctx, Delivery{To: "rec/echo", Payload: p})
			if err != nil || string(resp.Payload) != string(p) {
				t.Fatalf("round %d/%d: Request = %q, %v", i, j, resp.Payload, err)
			}
		}
	}
}

func TestInvalidInputFailsBeforeSending(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, natstest.WithMaxPayload(1024))
	n, rec := testNode(t, s, "a")
	ctx := context.Background()
	cases := []struct {
		d    Delivery
		want error
	}{
		{Delivery{To: ""}, verdict.ErrInvalidAddress},
		{Delivery{To: "noslash"}, verdict.ErrInvalidAddress},
		{Delivery{To: "rec/x", Stream: subjects.Stream(strings.Repeat("s", 300))}, verdict.ErrInvalidAddress},
		{Delivery{To: "rec/x", From: "bad"}, verdict.ErrInvalidAddress},
		{Delivery{To: "rec/x", ID: strings.Repeat("i", 200)}, verdict.ErrBadRequest},
		{Delivery{To: "rec/x", Payload: make([]byte, 2048)}, verdict.ErrPayloadTooLarge},
	}
	for _, c := range cases {
		_, err := n.Deliver(ctx, c.d)
		if !errors.Is(err, c.want) || verdict.Classify(err) != verdict.Failed || verdict.IsTransient(err) {
			t.Errorf("Deliver(%.40q) = %v, want %v", c.d.To, err, c.want)
		}
	}
	if _, err := n.Deliver(ctx, Delivery{To: "nokind/x"}); !errors.Is(err, verdict.ErrUnknownKind) {
		t.Errorf("unknown kind: %v", err)
	}
	if rec.total() != 0 {
		t.Errorf("invalid deliveries were handled")
	}
	if n.Stats().Retries != 0 {
		t.Errorf("invalid deliveries were retried")
	}
}

// TestDedupe: the same delivery ID sent twice: one execution, two Accepted.
func TestDedupe(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		r, err := n.Deliver(ctx, Delivery{ID: "same-id", To: "rec/x", Payload: []byte{byte(i)}})
		if err != nil || r.Node != n.ID() {
			t.Fatalf("delivery %d: %+v %v", i, r, err)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() >= 1 }, "handled")
	// One more delivery behind it on the same lane proves the duplicate was
	// not queued: it is handled second.
	if _, err := n.Deliver(ctx, Delivery{ID: "after", To: "rec/x"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.executions("after") == 1 }, "handled after")
	if got := rec.executions("same-id"); got != 1 {
		t.Errorf("executions of same-id = %d, want 1", got)
	}
	if st := n.Host().Stats(); st.DedupeHits != 1 || st.Accepted != 2 {
		t.Errorf("host stats %+v: want 1 dedupe hit, 2 accepted", st)
	}
}

func TestInboxFullIgnored(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Host: hub.Config{InboxSize: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	_ = n.Register("slow", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			started <- struct{}{}
			<-release
			return nil
		}), nil
	})
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := n.Deliver(ctx, Delivery{To: "slow/x"}); err != nil {
		t.Fatal(err)
	}
	<-started // the first is in its turn; the inbox holds 2 more
	for i := 0; i < 2; i++ {
		if _, err := n.Deliver(ctx, Delivery{To: "slow/x"}); err != nil {
			t.Fatalf("queued delivery %d: %v", i, err)
		}
	}
	_, err = n.Deliver(ctx, Delivery{To: "slow/x"})
	if !errors.Is(err, verdict.ErrInboxFull) || verdict.Classify(err) != verdict.Ignored || verdict.IsTransient(err) {
		t.Fatalf("full inbox: %v", err)
	}
	if st := n.Stats(); st.Retries != 0 {
		t.Errorf("an Ignored delivery was retried")
	}
	close(release)
}

func TestClosedClient(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, _ := testNode(t, s, "a")
	n.Client.Close()
	<-n.Client.Closed()
	_, err := n.Deliver(context.Background(), Delivery{To: "rec/x"})
	if !errors.Is(err, verdict.ErrClosing) || verdict.Classify(err) != verdict.ShuttingDown {
		t.Fatalf("closed client: %v", err)
	}
	n.Client.Close() // twice is harmless
}

// TestResponseTooLarge: a handler whose response cannot be sent (over the
// server's max_payload) still gives the requester one answer: Failed
// handler-error, not a timeout.
func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, natstest.WithMaxPayload(4096))
	n, rec := testNode(t, s, "a")
	rec.fn = func(ctx context.Context, d *hub.Delivery) error { return d.Respond(make([]byte, 8192)) }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := n.Request(ctx, Delivery{To: "rec/big"})
	if !errors.Is(err, verdict.ErrHandler) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Request = %v; want a handler-error verdict", err)
	}
}

// TestHandlerVerdicts: a Request's response verdict says what the handler
// said. A terminal verdict of the handler's own keeps its reason and its
// message, said once, bare or wrapped; a plain error, a resendable verdict
// (the handler ran: "nothing held" would be untrue) and a timeout are
// handler-error.
func TestHandlerVerdicts(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	bad := verdict.New(verdict.ReasonBadRequest, "kv takes set, delete or get, not %q", "bogus")
	cases := []struct {
		name     string
		err      error
		sentinel error
		message  string
	}{
		{"bare bad-request", bad, verdict.ErrBadRequest, `kv takes set, delete or get, not "bogus"`},
		{"wrapped bad-request", fmt.Errorf("parse: %w", bad), verdict.ErrBadRequest, `parse: kv takes set, delete or get, not "bogus"`},
		{"unknown kind", verdict.New(verdict.ReasonUnknownKind, "no such thing"), verdict.ErrUnknownKind, "no such thing"},
		{"plain error", errors.New("disk on fire"), verdict.ErrHandler, "disk on fire"},
		{"resendable verdict", verdict.New(verdict.ReasonHubShuttingDown, "later"), verdict.ErrHandler, "ShuttingDown: later"},
		{"timeout", fmt.Errorf("backend: %w", context.DeadlineExceeded), verdict.ErrHandler, "backend: context deadline exceeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec.fn = func(context.Context, *hub.Delivery) error { return tc.err }
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := n.Request(ctx, Delivery{To: "rec/v"})
			if !errors.Is(err, tc.sentinel) || verdict.IsTransient(err) || verdict.Classify(err) != verdict.Failed {
				t.Fatalf("Request = %v; want %v, terminal Failed", err, tc.sentinel)
			}
			var ve *verdict.Error
			if !errors.As(err, &ve) || ve.Message != tc.message {
				t.Fatalf("message = %q; want %q (error %v)", ve.Message, tc.message, err)
			}
			if strings.Count(err.Error(), "Failed:") > 1 {
				t.Fatalf("error says Failed twice: %v", err)
			}
		})
	}
}

// TestDrainBoundedByStuckHandler: a handler that ignores its ctx does not
// hold Drain past its deadline (plus a short grace).
func TestDrainBoundedByStuckHandler(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	block := make(chan struct{})
	defer close(block)
	rec.fn = func(context.Context, *hub.Delivery) error {
		<-block // ignores ctx
		return nil
	}
	if _, err := n.Deliver(context.Background(), Delivery{To: "rec/stuck"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return rec.total() == 1 }, "handler running")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := n.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drain = %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Drain took %v with a stuck handler", took)
	}
}
