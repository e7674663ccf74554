package directory

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// A claim overwritten by something that is not a live generation's claim
// (garbage, a departed or made-up owner) is reported (log and
// Stats().Overwritten) and re-written by its owner, which keeps serving;
// only a claim naming another live generation makes it stand down.
func TestClaimOverwrittenByForeignWriter(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mb, err := membership.Join(ctx, membership.Config{Conn: nc, Name: "a", Kinds: []string{"echo"}, Heartbeat: 100 * time.Millisecond, TTL: 400 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mb.Close)
	var mu sync.Mutex
	var lost []subjects.Address
	d, err := Open(ctx, Config{Conn: nc, Members: mb, VerifyInterval: 20 * time.Millisecond, Logger: quiet, OnLost: func(a subjects.Address) {
		mu.Lock()
		lost = append(lost, a)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	addr := subjects.Address("echo/owned")
	if owner, err := d.Claim(ctx, addr); err != nil || owner != mb.Self().Node {
		t.Fatalf("claim: %v %v", owner, err)
	}
	for i, v := range []string{
		"garbage",
		`{"owner":{"name":"ghost","generation":7},"claimed":"2026-01-01T00:00:00Z"}`,
		`{"owner":{"name":"a","generation":1},"claimed":"2026-01-01T00:00:00Z"}`,
	} {
		before := d.Stats().Overwritten
		if _, err := d.kv.Put(ctx, key(addr), []byte(v)); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool {
			c, _, err := d.read(ctx, addr)
			return d.Stats().Overwritten > before && err == nil && c.Owner == mb.Self().Node
		}, "overwrite %d: not reported and re-written", i)
		mu.Lock()
		n := len(lost)
		mu.Unlock()
		if n != 0 || d.Owned() != 1 {
			t.Fatalf("overwrite %d: stood down (%d lost, %d owned)", i, n, d.Owned())
		}
	}
	if d.Stats().InvalidEntries < 1 {
		t.Fatal("the unparsable claim was not counted")
	}
}
