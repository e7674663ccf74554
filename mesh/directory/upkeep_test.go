package directory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// openOne starts a server, joins one member "a" and opens a directory on it
// with cfg (Conn, Members and a quiet Logger filled in).
func openOne(t *testing.T, cfg Config) (context.Context, *nats.Conn, *membership.Membership, *Directory) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	a := joinEcho(t, ctx, nc, "a")
	cfg.Conn, cfg.Members, cfg.Logger = nc, a, slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return ctx, nc, a, d
}

func claimMany(t testing.TB, ctx context.Context, d *Directory, n int, self subjects.NodeID) []subjects.Address {
	t.Helper()
	addrs := make([]subjects.Address, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				addrs[i] = subjects.Address(fmt.Sprintf("echo/u%d", i))
				if g, err := d.Claim(ctx, addrs[i]); err != nil || g.Owner != self {
					errs <- fmt.Errorf("claim %d: %v %v", i, g, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return addrs
}

// TestUpkeepWatchesChanges (DESIGN §5: upkeep does not grow with the
// claims): with no verification pass due (an interval of an hour), a claim
// overwritten by another live generation stands down, and a claim deleted
// behind the owner's back is re-created — both seen through the watch of
// changes, at whatever position among 2 000 claims, with no full pass.
func TestUpkeepWatchesChanges(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, b := joinEcho(t, ctx, nc, "a"), joinEcho(t, ctx, nc, "b")
	natstest.Eventually(t, 5*time.Second, func() bool { return a.Alive(b.Self().Node) }, "b not seen alive")
	var mu sync.Mutex
	lost := map[subjects.Address]hub.ClaimToken{}
	d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, Logger: quiet, OnLost: func(tk hub.ClaimToken) {
		mu.Lock()
		lost[tk.Addr] = tk
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	addrs := claimMany(t, ctx, d, 2000, a.Self().Node)
	stolen, _ := json.Marshal(Claim{Owner: b.Self().Node, Claimed: time.Now().UTC()})
	for _, i := range []int{0, 999, 1999} {
		if _, err := d.kv.Put(ctx, key(addrs[i]), stolen); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := lost[addrs[i]]
			return ok
		}, "claim %d overwritten by a live generation: no stand-down", i)
	}
	for _, i := range []int{1, 1000, 1998} {
		if err := d.kv.Delete(ctx, key(addrs[i])); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool {
			e, err := d.kv.Get(ctx, key(addrs[i]))
			if err != nil {
				return false
			}
			var c Claim
			return json.Unmarshal(e.Value(), &c) == nil && c.Owner == a.Self().Node
		}, "claim %d deleted behind its owner: not re-created", i)
	}
	if n := d.Owned(); n != 2000-3 {
		t.Fatalf("%d claims held, want %d", n, 2000-3)
	}
	if f := d.fullPasses.Load(); f != 0 {
		t.Fatalf("%d full passes: the watch alone should have seen each change", f)
	}
}

// TestUpkeepStreamLost: the directory's stream deleted and created anew
// (soft state lost, as when every server of a memory-stored bucket
// restarts) makes the next pass a full one, which re-creates every claim.
func TestUpkeepStreamLost(t *testing.T) {
	t.Parallel()
	ctx, nc, a, d := openOne(t, Config{VerifyInterval: 50 * time.Millisecond})
	addrs := claimMany(t, ctx, d, 500, a.Self().Node)
	natstest.Eventually(t, 5*time.Second, func() bool { d.mu.Lock(); defer d.mu.Unlock(); return !d.streamCreated.IsZero() }, "the stream looked at")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, BucketName(subjects.DefaultPrefix)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketName(subjects.DefaultPrefix), Storage: jetstream.MemoryStorage, History: 1}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool {
		st, err := d.kv.Status(ctx)
		return err == nil && st.Values() == uint64(len(addrs))
	}, "claims not re-created after the stream was lost")
	for _, addr := range []subjects.Address{addrs[0], addrs[250], addrs[499]} {
		if _, err := d.kv.Get(ctx, key(addr)); err != nil {
			t.Fatalf("%s after the stream was lost: %v", addr, err)
		}
	}
}

// TestUpkeepSweepBounded: without changes, each interval re-reads at most
// VerifyBatch claims (a constant cost per interval, however many claims the
// node holds), and the rotation reaches every claim: one deleted with no
// watch to see it is re-created within ceil(claims/VerifyBatch) intervals.
func TestUpkeepSweepBounded(t *testing.T) {
	t.Parallel()
	const claims, batch = 1200, 100
	ctx, _, a, d := openOne(t, Config{VerifyInterval: 20 * time.Millisecond, VerifyBatch: batch, noWatch: true})
	addrs := claimMany(t, ctx, d, claims, a.Self().Node)
	for _, i := range []int{0, claims / 2, claims - 1} {
		if err := d.kv.Delete(ctx, key(addrs[i])); err != nil {
			t.Fatal(err)
		}
		start := d.sweeps.Load()
		natstest.Eventually(t, 20*time.Second, func() bool { _, err := d.kv.Get(ctx, key(addrs[i])); return err == nil }, "claim %d not re-created by the sweep", i)
		if n := d.sweeps.Load() - start; n > claims/batch+2 {
			t.Errorf("claim %d re-created after %d sweeps, want at most %d", i, n, claims/batch+2)
		}
	}
	if sw, n := d.swept.Load(), d.sweeps.Load(); sw > n*batch {
		t.Fatalf("%d claims re-read in %d sweeps: more than %d a sweep", sw, n, batch)
	}
	if f := d.fullPasses.Load(); f != 0 {
		t.Fatalf("%d full passes with the stream intact", f)
	}
}

// TestReleasedMarkersExpire (issue 22, exhaustion): a burst of claims made
// and released leaves nothing lasting in the directory — their markers
// expire after MarkerTTL — and on a bucket made without marker TTLs (an
// older deployment) releases still work, as plain deletes.
func TestReleasedMarkersExpire(t *testing.T) {
	t.Parallel()
	for _, ttl := range []bool{true, false} {
		t.Run(fmt.Sprintf("ttl=%v", ttl), func(t *testing.T) {
			s := natstest.RunServer(t)
			nc := natstest.Connect(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			a := joinEcho(t, ctx, nc, "a")
			if !ttl {
				js, _ := jetstream.New(nc)
				if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketName(subjects.DefaultPrefix), Storage: jetstream.MemoryStorage, History: 1}); err != nil {
					t.Fatal(err)
				}
			}
			d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, MarkerTTL: time.Second, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			const n = 300
			var tokens []hub.ClaimToken
			for i := range n {
				g, err := d.Claim(ctx, subjects.Address(fmt.Sprintf("echo/burst%d", i)))
				if err != nil {
					t.Fatal(err)
				}
				tokens = append(tokens, g.Token)
			}
			for _, tk := range tokens {
				d.Release(tk)
			}
			if d.Owned() != 0 {
				t.Fatalf("%d claims held after releasing all", d.Owned())
			}
			for _, tk := range tokens[:3] {
				if _, err := d.kv.Get(ctx, key(tk.Addr)); !errors.Is(err, jetstream.ErrKeyNotFound) {
					t.Fatalf("%s after release: %v", tk.Addr, err)
				}
			}
			st, err := d.kv.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !ttl {
				if st.Values() != n {
					t.Fatalf("%d entries on a bucket without marker TTLs, want the %d delete markers", st.Values(), n)
				}
				return
			}
			natstest.Eventually(t, 20*time.Second, func() bool {
				st, err := d.kv.Status(ctx)
				return err == nil && st.Values() == 0
			}, "markers of released claims still in the directory after their TTL")
			// The addresses can be claimed again.
			if g, err := d.Claim(ctx, tokens[0].Addr); err != nil || g.Owner != a.Self().Node {
				t.Fatalf("claim after the marker expired: %v %v", g, err)
			}
		})
	}
}
