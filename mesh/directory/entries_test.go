package directory

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// A claim overwritten by something that does not parse as a claim is
// reported (log and Stats().Overwritten) and re-written by its owner, which
// keeps serving; a claim naming another generation makes it stand down
// (the safe side), reported too when that generation is not live.
func TestClaimOverwrittenByForeignWriter(t *testing.T) {
	t.Parallel()
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
	d, err := Open(ctx, Config{Conn: nc, Members: mb, VerifyInterval: 20 * time.Millisecond, Logger: quiet, OnLost: func(tk hub.ClaimToken) {
		mu.Lock()
		lost = append(lost, tk.Addr)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	addr := subjects.Address("echo/owned")
	if g, err := d.Claim(ctx, addr); err != nil || g.Owner != mb.Self().Node {
		t.Fatalf("claim: %v %v", g, err)
	}
	for i, v := range []string{
		"garbage",
		`{}`,
		`{"owner":"not a node id"}`,
		`{"owner":"a.0"}`,
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
	if d.Stats().InvalidEntries < 4 {
		t.Fatalf("%d unparsable claims counted, want 4", d.Stats().InvalidEntries)
	}
	before := d.Stats().Overwritten
	if _, err := d.kv.Put(ctx, key(addr), []byte(`{"owner":"ghost.7"}`)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lost) == 1 && d.Owned() == 0 && d.Stats().Overwritten > before
	}, "a claim naming a generation that is not live: no stand-down")
}
