package directory

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// tryOutcome is what one TryClaim's done reported.
type tryOutcome struct {
	g  hub.Grant
	ok bool
}

// tryClaimOnce runs d.TryClaim and returns its outcome; it fails the test if
// done is called more than once or not within 10 s.
func tryClaimOnce(t *testing.T, ctx context.Context, d *Directory, addr subjects.Address) tryOutcome {
	t.Helper()
	ch := make(chan tryOutcome, 2)
	d.TryClaim(ctx, addr, func(g hub.Grant, ok bool) { ch <- tryOutcome{g, ok} })
	var o tryOutcome
	select {
	case o = <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("TryClaim %s: done not called", addr)
	}
	select {
	case again := <-ch:
		t.Fatalf("TryClaim %s: done called twice: %+v, then %+v", addr, o, again)
	case <-time.After(50 * time.Millisecond):
	}
	return o
}

// TestTryClaim: the pipelined plain case of a claim, against every state an
// address's key can be in. It grants (with a token that Holds, Release and
// the bucket agree on) exactly when the key has no message at all, and
// otherwise settles ok false with nothing written, after which Claim
// settles the address as before; it settles once, also when its context
// ends first or the directory closes.
func TestTryClaim(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := joinEcho(t, ctx, nc, "a")
	ncb := natstest.Connect(t, s)
	b := joinEcho(t, ctx, ncb, "b")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	db, err := Open(ctx, Config{Conn: ncb, Members: b, VerifyInterval: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	self := a.Self().Node

	t.Run("fresh", func(t *testing.T) {
		addr := subjects.Address("echo/fresh")
		o := tryClaimOnce(t, ctx, d, addr)
		if !o.ok || o.g.Owner != self || o.g.Token.Addr != addr || o.g.Token.IsZero() {
			t.Fatalf("fresh address: %+v", o)
		}
		e, err := d.kv.Get(ctx, key(addr))
		if err != nil || e.Revision() != o.g.Token.Rev {
			t.Fatalf("bucket: %v, revision %d, token %+v", err, e.Revision(), o.g.Token)
		}
		if c := d.parse(addr, e.Revision(), e.Value()); c.Owner != self {
			t.Fatalf("claim written names %v", c.Owner)
		}
		if !d.Holds(o.g.Token) || d.Owned() != 1 {
			t.Fatalf("holds %v, owned %d", d.Holds(o.g.Token), d.Owned())
		}
		if g, err := db.Claim(ctx, addr); err != nil || g.Owner != self {
			t.Fatalf("another node's claim of it: %+v, %v", g, err)
		}
		d.Release(o.g.Token)
		if _, err := d.kv.Get(ctx, key(addr)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("after release: %v", err)
		}
	})

	t.Run("claimed", func(t *testing.T) {
		for _, who := range []string{"self", "other"} {
			addr := subjects.Address("echo/claimed-" + who)
			owner := d
			if who == "other" {
				owner = db
			}
			g, err := owner.Claim(ctx, addr)
			if err != nil {
				t.Fatal(err)
			}
			if o := tryClaimOnce(t, ctx, d, addr); o.ok {
				t.Fatalf("%s: TryClaim of a claimed address granted %+v", who, o)
			}
			if e, err := d.kv.Get(ctx, key(addr)); err != nil || e.Revision() != g.Token.Rev {
				t.Fatalf("%s: a refused TryClaim wrote: %v", who, err)
			}
			g2, err := d.Claim(ctx, addr) // the host's fallback
			if err != nil || g2.Owner != g.Owner {
				t.Fatalf("%s: Claim after TryClaim: %+v %v, owner %v", who, g2, err, g.Owner)
			}
		}
	})

	t.Run("released", func(t *testing.T) {
		// A released claim leaves a purge marker: the key has a message,
		// so the plain create is refused, and Claim creates over it.
		addr := subjects.Address("echo/released")
		g, err := d.Claim(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		d.Release(g.Token)
		if o := tryClaimOnce(t, ctx, d, addr); o.ok {
			t.Fatalf("TryClaim over a release marker granted %+v", o)
		}
		g2, err := d.Claim(ctx, addr)
		if err != nil || g2.Owner != self || g2.Token == g.Token {
			t.Fatalf("Claim after: %+v %v", g2, err)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		ccancel()
		addr := subjects.Address("echo/cancelled")
		if o := tryClaimOnce(t, cctx, d, addr); o.ok {
			t.Fatalf("TryClaim with an ended context granted %+v", o)
		}
		// Whatever the publish did, Claim settles the address as this
		// node's (re-adopting a create that landed unseen).
		g, err := d.Claim(ctx, addr)
		if err != nil || g.Owner != self || !d.Holds(g.Token) {
			t.Fatalf("Claim after a cancelled TryClaim: %+v %v", g, err)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		// Two nodes race TryClaims of the same fresh addresses: exactly
		// one grant per address, and it is the owner in the bucket.
		const n = 200
		var wg sync.WaitGroup
		var grants [n][2]atomic.Bool
		for i := range n {
			addr := subjects.Address(fmt.Sprintf("echo/race-%d", i))
			for j, dir := range []*Directory{d, db} {
				wg.Add(1)
				dir.TryClaim(ctx, addr, func(g hub.Grant, ok bool) {
					defer wg.Done()
					if ok {
						grants[i][j].Store(true)
					}
				})
			}
		}
		wg.Wait()
		for i := range n {
			if grants[i][0].Load() == grants[i][1].Load() {
				t.Fatalf("echo/race-%d: granted to a %v, to b %v", i, grants[i][0].Load(), grants[i][1].Load())
			}
			e, err := d.kv.Get(ctx, key(subjects.Address(fmt.Sprintf("echo/race-%d", i))))
			if err != nil {
				t.Fatal(err)
			}
			want := a.Self().Node
			if grants[i][1].Load() {
				want = b.Self().Node
			}
			if c := d.parse("", e.Revision(), e.Value()); c.Owner != want {
				t.Fatalf("echo/race-%d: bucket names %v, granted to %v", i, c.Owner, want)
			}
		}
	})

	t.Run("closed", func(t *testing.T) {
		dc, err := Open(ctx, Config{Conn: natstest.Connect(t, s), Members: a, VerifyInterval: time.Hour, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		dc.Close()
		if o := tryClaimOnce(t, ctx, dc, "echo/closed"); o.ok {
			t.Fatalf("TryClaim on a closed directory granted %+v", o)
		}
	})
}
