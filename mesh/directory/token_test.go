package directory

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestReleaseOfAnOlderActivation (issue 20, race 1): an idle activation is
// collected, a new delivery's activation claims the address again while the
// old claim is still held (the directory finds its own claim and adopts
// it), and then the old activation's deactivation releases. The release
// names the old activation's token, so the new activation's claim stays:
// in the bucket and among this node's claims.
func TestReleaseOfAnOlderActivation(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := joinEcho(t, ctx, nc, "a")
	d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	addr := subjects.Address("echo/idle")
	for round := range 3 {
		old, err := d.Claim(ctx, addr)
		if err != nil || old.Owner != a.Self().Node {
			t.Fatalf("round %d: first claim: %v %v", round, old, err)
		}
		nw, err := d.Claim(ctx, addr) // the new activation, before the old one released
		if err != nil || nw.Owner != a.Self().Node {
			t.Fatalf("round %d: second claim: %v %v", round, nw, err)
		}
		if nw.Token == old.Token {
			t.Fatalf("round %d: a re-adopted claim kept the older activation's token %v", round, old.Token)
		}
		d.Release(old.Token) // the old activation's deactivation
		e, err := d.kv.Get(ctx, key(addr))
		if err != nil {
			t.Fatalf("round %d: the new activation's claim is gone after the old one's release: %v", round, err)
		}
		if n := d.Owned(); n != 1 {
			t.Fatalf("round %d: %d claims held after the old activation's release, want 1", round, n)
		}
		if !d.Holds(nw.Token) || d.Holds(old.Token) {
			t.Fatalf("round %d: holds new %v, old %v", round, d.Holds(nw.Token), d.Holds(old.Token))
		}
		if e.Revision() != nw.Token.Rev {
			t.Fatalf("round %d: bucket at revision %d, the new claim wrote %d", round, e.Revision(), nw.Token.Rev)
		}
		d.Release(nw.Token)
		if _, err := d.kv.Get(ctx, key(addr)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("round %d: after the new activation's release: %v", round, err)
		}
	}
}

// TestUnseenGenerationNotTakenOver (issue 20, race 2): a claim naming a
// generation this node has never seen alive (a node that joined, claimed,
// and is not in this node's view yet) is not taken over at once: only after
// the fencing delay from this node's first read of it, once its registry
// view has caught up past that read. A claim of a generation that joins
// meanwhile redirects to it.
func TestUnseenGenerationNotTakenOver(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const fencing = 400 * time.Millisecond
	a, err := membership.Join(ctx, membership.Config{Conn: nc, Name: "a", Kinds: []string{"echo"}, Heartbeat: 50 * time.Millisecond, TTL: 30 * time.Second,
		FencingDelay: fencing, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	// Past a's own join delay: only the unseen generation's rule holds it back.
	natstest.Eventually(t, 5*time.Second, func() bool { return a.TakeoverAt(subjects.NodeID{Name: "nobody", Generation: 1}).IsZero() }, "join delay")
	for i, unseen := range []subjects.NodeID{{Name: "joiner", Generation: 7}, {Name: "a", Generation: a.Self().Node.Generation + 1000}} {
		addr := subjects.Address("echo/unseen" + string(rune('0'+i)))
		b, _ := json.Marshal(Claim{Owner: unseen, Claimed: time.Now().UTC()})
		if _, err := d.kv.Create(ctx, key(addr), b); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		short, cancelShort := context.WithTimeout(ctx, fencing/2)
		got, err := d.Claim(short, addr)
		cancelShort()
		if err == nil {
			t.Fatalf("%v: a claim of a generation never seen alive was taken over after %v (%v)", unseen, time.Since(start), got)
		}
		got, err = d.Claim(ctx, addr)
		if err != nil || got.Owner != a.Self().Node {
			t.Fatalf("%v: takeover after the delay: %v %v", unseen, got, err)
		}
		if el := time.Since(start); el < fencing {
			t.Fatalf("%v: taken over %v after the first read, before the fencing delay %v", unseen, el, fencing)
		}
	}
}
