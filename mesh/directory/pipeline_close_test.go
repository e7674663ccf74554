package directory

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// plainClaims hides the directory's TryClaim: the host claims the old way
// (a goroutine per claim, Claims.Claim).
type plainClaims struct{ hub.Claims }

// TestHostCloseLeavesNoClaim: a host closed while cold addresses' claims
// are queued for its claim slots leaves no claim naming this node in the
// bucket (DESIGN §5: host Close leaves no claim held). Every queued claim
// is refused resendable; none may be written after the host closed. Found
// by a review of the pipelined claims: the queued claims were each handed
// a slot after Close cancelled the host's context, and Directory.TryClaim
// published their KV creates regardless of the ended context, which then
// landed naming this node, held by nobody, never released. Now a queued
// claim of a closing host is not started (hub releaseClaimSlot), and
// TryClaim writes nothing for an ended context.
func TestHostCloseLeavesNoClaim(t *testing.T) {
	t.Parallel()
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelined=%v", pipelined), func(t *testing.T) {
			t.Parallel()
			testHostCloseLeavesNoClaim(t, pipelined)
		})
	}
}

func testHostCloseLeavesNoClaim(t *testing.T, pipelined bool) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := joinEcho(t, ctx, nc, "a")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	self := a.Self().Node
	var claims hub.Claims = d
	if !pipelined {
		claims = plainClaims{d}
	}
	h, err := hub.New(hub.Config{Conn: nc, Node: self, Claims: claims, ClaimConcurrency: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Register("echo", func(context.Context, subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(context.Context, *hub.Delivery) error { return nil }), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)

	snc := natstest.Connect(t, s)
	const n = 400
	inbox := snc.NewInbox()
	verdicts := make(chan *nats.Msg, n)
	sub, err := snc.ChanSubscribe(inbox+".*", verdicts)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for i := range n {
		m := nats.NewMsg(subjects.DefaultPrefix.Delivery(self, subjects.Address(fmt.Sprintf("echo/cold-%d", i)), ""))
		m.Header.Set(hub.HeaderID, fmt.Sprint(i))
		m.Reply = fmt.Sprintf("%s.%d", inbox, i)
		if err := snc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	// Close with most of the claims still queued for the one slot.
	natstest.Eventually(t, 10*time.Second, func() bool {
		st := h.Stats()
		return st.Activations >= 3 && st.Claiming > n/4
	}, "claims under way")
	h.Close()
	refused := 0
	for range n {
		select {
		case r := <-verdicts:
			if _, err := verdict.Decode(r.Header); err != nil {
				if !verdict.IsResendable(err) {
					t.Fatalf("delivery %s: %v", r.Subject, err)
				}
				refused++
			}
		case <-time.After(10 * time.Second):
			t.Fatal("not every delivery was answered")
		}
	}
	// Everything this node published to the stream before now is stored
	// once a later write on the same connection is acknowledged.
	if _, err := d.kv.Put(ctx, "sentinel", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var left []string
	ok := natstest.Poll(5*time.Second, func() bool {
		snap, err := snapshot(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for k, e := range snap {
			if k == "sentinel" {
				continue
			}
			if c := d.parse("", e.rev, e.value); c.Owner == self {
				left = append(left, k)
			}
		}
		// At most the one claim in flight when the host's context ended
		// (ClaimConcurrency 1) may have landed unseen: its create was on
		// the wire before Close (the plain path has that window too).
		return len(left) <= 1
	})
	if !ok {
		t.Fatalf("after Close (%d deliveries refused): %d claims naming this node are left in the bucket, none held (held: %d), e.g. %v",
			refused, len(left), d.Owned(), left[:min(5, len(left))])
	}
}
