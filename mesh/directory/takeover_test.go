package directory

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestClaimFencingWaitNotChargedToKV (issue 24): a claim of an address
// whose owner just departed waits out the fencing delay before it takes
// the address over. A wait that would leave the claim too little of its
// context for the KV round trips after it is refused at once as the
// departure it is (resendable) — it used to run the context out in those
// round trips and report the healthy directory unavailable ("claim
// kv/settings: context deadline exceeded", 10.1 s after an owner's
// SIGKILL). A claim with time for both waits, then succeeds.
func TestClaimFencingWaitNotChargedToKV(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const fencing = 2 * time.Second
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := membership.Join(ctx, membership.Config{Conn: natstest.Connect(t, s), Name: "a", Kinds: []string{"echo"}, Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second,
		FencingDelay: fencing, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	b, err := membership.Join(ctx, membership.Config{Conn: natstest.Connect(t, s), Name: "b", Kinds: []string{"echo"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(ctx, Config{Conn: natstest.Connect(t, s), Members: a, VerifyInterval: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	natstest.Eventually(t, 5*time.Second, func() bool { return a.Alive(b.Self().Node) }, "a sees b")
	addr := subjects.Address("echo/taken")
	c, _ := json.Marshal(Claim{Owner: b.Self().Node, Claimed: time.Now().UTC()})
	if _, err := d.kv.Create(ctx, key(addr), c); err != nil {
		t.Fatal(err)
	}
	if err := b.Leave(ctx); err != nil { // b departs; a learns it at once
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return !a.Alive(b.Self().Node) }, "a sees b depart")

	// The intake's old budget (2 s), all of it the fencing delay.
	start := time.Now()
	short, cancelShort := context.WithTimeout(ctx, fencing)
	_, refused := d.Claim(short, addr)
	cancelShort()
	took := time.Since(start)
	if !errors.Is(refused, verdict.ErrDeparted) || !verdict.IsResendable(refused) || errors.Is(refused, verdict.ErrDirectoryUnavailable) {
		t.Fatalf("claim within the fencing delay on a short budget: %v; want the resendable departed verdict", refused)
	}
	if took > fencing/2 {
		t.Errorf("refused after %v; want at once", took)
	}
	// Time for the wait and the KV work: taken over once the delay passed.
	got, err := d.Claim(ctx, addr)
	if err != nil || got.Owner != a.Self().Node {
		t.Fatalf("claim after the fencing delay: %v %v", got, err)
	}
	t.Logf("refused at once (%v: %v); taken over %v after the departure (fencing delay %v)", took, refused, time.Since(start), fencing)
}
