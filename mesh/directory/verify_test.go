package directory

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
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

// TestVerifyBatches: the verifier reads its claims in batches (one batched
// direct get per VerifyBatch claims, in the order they were written) and acts
// on each claim found changed behind its back — deleted: re-created;
// overwritten by another live generation: stand down; overwritten by
// something that is no claim: re-written — whatever its position in its
// batch (first, middle, last; a batch whose claims are all gone; more claims
// than one batch holds), and leaves every other claim alone (same revision,
// no stand-down). The per-key path (a server without batched reads) is held
// to the same outcomes.
func TestVerifyBatches(t *testing.T) {
	t.Parallel()
	const (
		deleted   = "deleted"
		vanished  = "gone without a trace" // as when the bucket was lost: no delete marker either
		stolen    = "overwritten by another live generation"
		scribbled = "overwritten by an unreadable entry"
	)
	cases := []struct {
		name   string
		claims int
		batch  int // 0: the default
		perKey bool
		kind   string
		at     []int // positions (claim order) tampered with
	}{
		// Batches of 4 over 10 claims: [0 1 2 3] [4 5 6 7] [8 9]; 8 and 9
		// both deleted make the last batch's answer "no results".
		{"deleted/batch4", 10, 4, false, deleted, []int{0, 3, 4, 6, 8, 9}},
		{"vanished/batch4", 10, 4, false, vanished, []int{0, 3, 4, 6, 8, 9}},
		{"stolen/batch4", 10, 4, false, stolen, []int{0, 3, 4, 6, 9}},
		{"scribbled/batch4", 10, 4, false, scribbled, []int{0, 3, 4, 6, 9}},
		{"stolen/all-of-one-batch", 10, 4, false, stolen, []int{4, 5, 6, 7}},
		{"stolen/default-batch", 2*DefaultVerifyBatch + 88, 0, false, stolen, []int{0, DefaultVerifyBatch - 1, DefaultVerifyBatch, DefaultVerifyBatch + 100, 2*DefaultVerifyBatch + 87}},
		{"deleted/default-batch", 2*DefaultVerifyBatch + 88, 0, false, deleted, []int{0, DefaultVerifyBatch - 1, DefaultVerifyBatch, 2*DefaultVerifyBatch + 87}},
		{"deleted/per-key", 10, 4, true, deleted, []int{0, 5, 9}},
		{"vanished/per-key", 10, 4, true, vanished, []int{0, 5, 9}},
		{"stolen/per-key", 10, 4, true, stolen, []int{0, 5, 9}},
		{"scribbled/per-key", 10, 4, true, scribbled, []int{0, 5, 9}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t)
			nc := natstest.Connect(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			a, b := joinEcho(t, ctx, nc, "a"), joinEcho(t, ctx, nc, "b")
			natstest.Eventually(t, 5*time.Second, func() bool { return a.Alive(b.Self().Node) }, "b not seen alive")
			var mu sync.Mutex
			var lost []subjects.Address
			// Passes are run by hand (d.verify), so that all tampering is
			// in place before one pass, which must act on all of it.
			d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, VerifyBatch: tc.batch, perKey: tc.perKey, noWatch: true, Logger: quiet,
				OnLost: func(tk hub.ClaimToken) {
					mu.Lock()
					lost = append(lost, tk.Addr)
					mu.Unlock()
				}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			// Claimed concurrently; positions are in the order the claims
			// were written (their revisions), as the verifier batches them.
			var wg sync.WaitGroup
			errs := make(chan error, tc.claims)
			for w := range 16 {
				wg.Go(func() {
					for i := w; i < tc.claims; i += 16 {
						addr := subjects.Address(fmt.Sprintf("echo/v.%d", i)) // a dot: the key is an encoded token
						if g, err := d.Claim(ctx, addr); err != nil || g.Owner != a.Self().Node {
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
			d.mu.Lock()
			var held []ownedClaim
			for addr, h := range d.owned {
				held = append(held, ownedClaim{addr, h.id, h.rev})
			}
			d.mu.Unlock()
			slices.SortFunc(held, func(x, y ownedClaim) int { return cmp.Compare(x.rev, y.rev) })
			addrs := make([]subjects.Address, tc.claims)
			revs := make([]uint64, tc.claims)
			for i, o := range held {
				addrs[i], revs[i] = o.addr, o.rev
			}
			// A full pass over the untouched claims changes nothing.
			d.verify()
			if d.Owned() != tc.claims || len(lostOf(&mu, &lost)) != 0 {
				t.Fatalf("untouched: %d owned, lost %v", d.Owned(), lostOf(&mu, &lost))
			}
			stolenBy, _ := json.Marshal(Claim{Owner: b.Self().Node, Claimed: time.Now().UTC()})
			for _, i := range tc.at {
				var err error
				switch tc.kind {
				case deleted:
					err = d.kv.Delete(ctx, key(addrs[i]))
				case vanished:
					err = purgeSubject(ctx, d, key(addrs[i]))
				case stolen:
					_, err = d.kv.Put(ctx, key(addrs[i]), stolenBy)
				case scribbled:
					_, err = d.kv.Put(ctx, key(addrs[i]), []byte("garbage"))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			tampered := func(i int) bool { return slices.Contains(tc.at, i) }
			settled := func() error {
				all, err := snapshot(ctx, d)
				if err != nil {
					return err
				}
				for i, addr := range addrs {
					e := all[key(addr)]
					rev := e.rev
					var c Claim
					_ = json.Unmarshal(e.value, &c)
					switch {
					case !tampered(i) && (rev != revs[i] || c.Owner != a.Self().Node):
						return fmt.Errorf("claim %d untouched but now %v at revision %d (was %d)", i, c.Owner, rev, revs[i])
					case tampered(i) && tc.kind == stolen && c.Owner != b.Self().Node:
						return fmt.Errorf("claim %d stolen by b but now %v", i, c.Owner)
					case tampered(i) && tc.kind != stolen && (c.Owner != a.Self().Node || rev == revs[i]):
						return fmt.Errorf("claim %d %s: not re-written (owner %v, revision %d)", i, tc.kind, c.Owner, rev)
					}
				}
				want := tc.claims
				var wantLost []subjects.Address
				if tc.kind == stolen {
					want -= len(tc.at)
					for _, i := range tc.at {
						wantLost = append(wantLost, addrs[i])
					}
				}
				wantOver := 0 // reported as overwritten by something that is no live generation's claim
				if tc.kind == scribbled {
					wantOver = len(tc.at)
				}
				if o := d.Stats().Overwritten; o != int64(wantOver) {
					return fmt.Errorf("%d claims reported overwritten, want %d", o, wantOver)
				}
				got := lostOf(&mu, &lost)
				slices.Sort(got)
				slices.Sort(wantLost)
				if d.Owned() != want || !slices.Equal(got, wantLost) {
					return fmt.Errorf("%d owned (want %d), lost %v (want %v)", d.Owned(), want, got, wantLost)
				}
				return nil
			}
			// One pass acts on all of it (DESIGN §6: within one period).
			d.verify()
			if err := settled(); err != nil {
				t.Fatalf("claims %s at %v, after one pass: %v", tc.kind, tc.at, err)
			}
			// And it stays so: nothing more is re-written or lost on later
			// passes.
			d.verify()
			d.verify()
			if err := settled(); err != nil {
				t.Fatalf("after more passes: %v", err)
			}
		})
	}
}

// snapshot reads the whole directory bucket (present keys only).
// joinEcho joins nc's mesh as node name hosting kind echo (heartbeat
// 100 ms, a TTL no test outlasts) and leaves when tb ends.
func joinEcho(tb testing.TB, ctx context.Context, nc *nats.Conn, name string) *membership.Membership {
	tb.Helper()
	mb, err := membership.Join(ctx, membership.Config{Conn: nc, Name: name, Kinds: []string{"echo"}, Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(mb.Close)
	return mb
}

func snapshot(ctx context.Context, d *Directory) (map[string]lastEntry, error) {
	w, err := d.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	out := map[string]lastEntry{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				return out, nil // the initial values are all in
			}
			out[e.Key()] = lastEntry{rev: e.Revision(), value: e.Value(), answered: true}
		}
	}
}

// purgeSubject removes every entry of key from the bucket's stream, leaving
// no delete marker.
func purgeSubject(ctx context.Context, d *Directory, key string) error {
	js, err := jetstream.New(d.cfg.Conn)
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, "KV_"+BucketName(d.cfg.Prefix))
	if err != nil {
		return err
	}
	return st.Purge(ctx, jetstream.WithPurgeSubject(d.bucketSubj+key))
}

func lostOf(mu *sync.Mutex, lost *[]subjects.Address) []subjects.Address {
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(*lost)
}

// TestLastOf reads keys of every kind in one batched direct get: present,
// never written, deleted, purged; and an answer larger than the server's
// max_bytes held back (Nats-Num-Pending) is asked for again.
func TestLastOf(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mb := joinEcho(t, ctx, nc, "a")
	d, err := Open(ctx, Config{Conn: nc, Members: mb, VerifyInterval: time.Hour, noWatch: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	var batch []ownedClaim
	want := map[subjects.Address]uint64{}
	for i := range 40 {
		addr := subjects.Address(fmt.Sprintf("echo/k%d", i))
		batch = append(batch, ownedClaim{addr: addr})
		switch i % 4 {
		case 0: // never written
		case 1:
			rev, err := d.kv.Put(ctx, key(addr), []byte(fmt.Sprintf("v%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			want[addr] = rev
		case 2:
			if _, err := d.kv.Put(ctx, key(addr), []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := d.kv.Delete(ctx, key(addr)); err != nil {
				t.Fatal(err)
			}
		case 3:
			if _, err := d.kv.Put(ctx, key(addr), []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := d.kv.Purge(ctx, key(addr)); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(batch []ownedClaim) {
		t.Helper()
		got, err := d.lastOf(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range batch {
			if got[i].rev != want[o.addr] {
				t.Errorf("%s: revision %d, want %d", o.addr, got[i].rev, want[o.addr])
			}
			if w := want[o.addr]; w != 0 {
				if e, err := d.kv.Get(ctx, key(o.addr)); err != nil || string(got[i].value) != string(e.Value()) {
					t.Errorf("%s: value %q (%v)", o.addr, got[i].value, err)
				}
			}
		}
	}
	check(batch)
	check(batch[:1])                        // one key, never written: no results
	check(batch[1:2])                       // one key, present
	check([]ownedClaim{batch[2], batch[3]}) // only delete and purge markers

	// max_bytes smaller than the answer: the server sends part and says how
	// much it held back; lastOf asks for the rest.
	var big []ownedClaim
	for i := range 30 {
		addr := subjects.Address(fmt.Sprintf("echo/big%d", i))
		rev, err := d.kv.Put(ctx, key(addr), make([]byte, 1000))
		if err != nil {
			t.Fatal(err)
		}
		want[addr] = rev
		big = append(big, ownedClaim{addr: addr})
	}
	d.maxBytes = 4000
	check(big)
	if d.heldBack.Load() == 0 {
		t.Fatal("max_bytes did not hold anything back: the test does not test the re-ask")
	}
	if _, err := d.lastOf(ctx, nil); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestVerifyStaleRead: a read that missed one of this node's claims (a
// replica lagging behind answers direct gets on a replicated bucket) makes
// the verifier re-create it; the create finds the entry, and the verifier
// judges by what it holds: still this node's claim — kept, no stand-down;
// another live generation's — stand down.
func TestVerifyStaleRead(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, b := joinEcho(t, ctx, nc, "a"), joinEcho(t, ctx, nc, "b")
	natstest.Eventually(t, 5*time.Second, func() bool { return a.Alive(b.Self().Node) }, "b not seen alive")
	var mu sync.Mutex
	var lost []subjects.Address
	d, err := Open(ctx, Config{Conn: nc, Members: a, VerifyInterval: time.Hour, noWatch: true, Logger: quiet, OnLost: func(tk hub.ClaimToken) {
		mu.Lock()
		lost = append(lost, tk.Addr)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	mine, theirs := subjects.Address("echo/mine"), subjects.Address("echo/theirs")
	for _, addr := range []subjects.Address{mine, theirs} {
		if g, err := d.Claim(ctx, addr); err != nil || g.Owner != a.Self().Node {
			t.Fatalf("claim %s: %v %v", addr, g, err)
		}
	}
	stolen, _ := json.Marshal(Claim{Owner: b.Self().Node, Claimed: time.Now().UTC()})
	if _, err := d.kv.Put(ctx, key(theirs), stolen); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	held := map[subjects.Address]held{mine: d.owned[mine], theirs: d.owned[theirs]}
	d.mu.Unlock()
	for _, addr := range []subjects.Address{mine, theirs} {
		d.check(ctx, ownedClaim{addr, held[addr].id, held[addr].rev}, Claim{}, 0) // what a stale read reports
	}
	d.mu.Lock()
	h, kept := d.owned[mine]
	rev := h.rev
	_, still := d.owned[theirs]
	d.mu.Unlock()
	if !kept || rev != held[mine].rev {
		t.Fatalf("own claim after a stale read: kept %v at revision %d (was %d)", kept, rev, held[mine].rev)
	}
	if still || !slices.Equal(lostOf(&mu, &lost), []subjects.Address{theirs}) {
		t.Fatalf("a claim another live generation holds: still owned %v, lost %v", still, lostOf(&mu, &lost))
	}
	// A read older than the claim (a lagging replica, or one just back
	// from a partition, still holding the previous owner's claim —
	// alive or not): kept, no stand-down.
	later := subjects.Address("echo/later")
	if g, err := d.Claim(ctx, later); err != nil || g.Owner != a.Self().Node {
		t.Fatalf("claim %s: %v %v", later, g, err)
	}
	d.mu.Lock()
	hl := d.owned[later]
	d.mu.Unlock()
	for _, prev := range []subjects.NodeID{b.Self().Node, {Name: "gone", Generation: 1}} {
		d.check(ctx, ownedClaim{later, hl.id, hl.rev}, Claim{Owner: prev}, hl.rev-1)
	}
	d.mu.Lock()
	_, kept = d.owned[later]
	d.mu.Unlock()
	if !kept || len(lostOf(&mu, &lost)) != 1 || d.staleReads.Load() != 2 {
		t.Fatalf("own claim after reads older than it: kept %v, lost %v, stale reads %d", kept, lostOf(&mu, &lost), d.staleReads.Load())
	}
}
