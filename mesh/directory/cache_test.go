package directory

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// cached returns how many owners d caches, and how many of them are
// generation node's.
func cached(d *Directory, node subjects.NodeID) (all, of int) {
	d.cache.Range(func(_, v any) bool {
		all++
		if v.(subjects.NodeID) == node {
			of++
		}
		return true
	})
	return all, of
}

// TestCacheBounded: a sender's cache of owners stays within its size
// however many addresses it resolves — here many times its size, owned by
// generation after generation of another node — and once a generation
// departs, its entries go (not only when an address of it is resolved
// again). Checked after every resolve, across the lifecycles of five owner
// generations (joined, claiming, resolved by the sender, departed).
func TestCacheBounded(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 64
	sender := joinEcho(t, ctx, nc, "sender")
	d, err := Open(ctx, Config{Conn: nc, Members: sender, CacheSize: size, VerifyInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	const gens, each = 5, 3 * size
	for g := range gens {
		mb, err := membership.Join(ctx, membership.Config{Conn: natstest.Connect(t, s), Name: "owner", Kinds: []string{"echo"}, Replace: true,
			Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		owner := mb.Self().Node
		od, err := Open(ctx, Config{Conn: nc, Members: mb})
		if err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return sender.Alive(owner) }, "the sender sees %s", owner)
		for i := range each {
			addr := subjects.Address(fmt.Sprintf("echo/%d-%d", g, i))
			if gr, err := od.Claim(ctx, addr); err != nil || gr.Owner != owner {
				t.Fatalf("claim %s: %+v %v", addr, gr, err)
			}
			if n, err := d.Resolve(ctx, addr); err != nil || n != owner {
				t.Fatalf("resolve %s: %v %v", addr, n, err)
			}
			if all, _ := cached(d, owner); all > size {
				t.Fatalf("generation %d, address %d: %d owners cached, the cache holds %d", g, i, all, size)
			}
		}
		od.Close()
		if err := mb.Leave(ctx); err != nil {
			t.Fatal(err)
		}
		mb.Close()
		natstest.Eventually(t, 5*time.Second, func() bool { _, of := cached(d, owner); return of == 0 }, "generation %d (%s) departed: its cache entries dropped", g, owner)
	}
}
