package hubstate_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/subjects"
)

func open(t *testing.T, cfg hubstate.Config) *hubstate.Store {
	t.Helper()
	st, err := hubstate.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var (
	nodeA = subjects.NodeID{Name: "a", Generation: 1}
	nodeB = subjects.NodeID{Name: "b", Generation: 7}
)

// TestTakeAndSave: each take bumps the epoch and names its owner, keeping
// the data; a save compares on the taker's revision; a save on any older
// revision — the predecessor's, after a successor's take — fails with
// hub.ErrStateFenced and writes nothing. Across several addresses,
// including ones that need escaping.
func TestTakeAndSave(t *testing.T) {
	s := natstest.RunServer(t)
	st := open(t, hubstate.Config{Conn: natstest.Connect(t, s)})
	ctx := context.Background()
	for _, addr := range []subjects.Address{"ctr/x", "kv/a.b c", "ctr/ünï/cödé", "k/=3D"} {
		a, err := st.Take(ctx, addr, nodeA)
		if err != nil || a.Epoch != 1 || a.Owner != nodeA || a.Data != nil || a.Revision == 0 {
			t.Fatalf("%s: first take %+v, %v", addr, a, err)
		}
		a2, err := st.Save(ctx, addr, a, []byte("one"))
		if err != nil || a2.Revision <= a.Revision || a2.Epoch != 1 {
			t.Fatalf("%s: save %+v, %v", addr, a2, err)
		}
		b, err := st.Take(ctx, addr, nodeB)
		if err != nil || b.Epoch != 2 || b.Owner != nodeB || string(b.Data) != "one" {
			t.Fatalf("%s: successor's take %+v, %v", addr, b, err)
		}
		// The predecessor saves on its last revision: fenced.
		if _, err := st.Save(ctx, addr, a2, []byte("stale")); !errors.Is(err, hub.ErrStateFenced) {
			t.Fatalf("%s: stale save: %v", addr, err)
		}
		got, err := st.Get(ctx, addr)
		if err != nil || got.Revision != b.Revision || string(got.Data) != "one" || got.Owner != nodeB || got.Updated.IsZero() {
			t.Fatalf("%s: stored %+v, %v", addr, got, err)
		}
		if _, err := st.Save(ctx, addr, b, []byte("two")); err != nil {
			t.Fatalf("%s: successor's save: %v", addr, err)
		}
	}
	if _, err := st.Get(ctx, "ctr/never"); !errors.Is(err, hubstate.ErrNotFound) {
		t.Fatalf("absent: %v", err)
	}
}

// TestConcurrentTakes: of many takers racing for one address, each take
// gets its own epoch (1..n, each once), and only the last taker's saves
// succeed.
func TestConcurrentTakes(t *testing.T) {
	s := natstest.RunServer(t)
	st := open(t, hubstate.Config{Conn: natstest.Connect(t, s)})
	ctx := context.Background()
	const n = 16
	recs := make([]hub.StateRecord, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := st.Take(ctx, "ctr/race", subjects.NodeID{Name: fmt.Sprintf("n%d", i), Generation: 1})
			if err != nil {
				t.Error(err)
			}
			recs[i] = r
		}()
	}
	wg.Wait()
	epochs := map[uint64]bool{}
	var last hub.StateRecord
	for _, r := range recs {
		epochs[r.Epoch] = true
		if r.Revision > last.Revision {
			last = r
		}
	}
	if len(epochs) != n || !epochs[1] || !epochs[n] {
		t.Fatalf("epochs %v", epochs)
	}
	for _, r := range recs {
		// Each taker saves its own data: a fenced save whose data the
		// record holds anyway reads outcome unknown (Save's read-back).
		_, err := st.Save(ctx, "ctr/race", r, fmt.Appendf(nil, "x%d", r.Epoch))
		if r.Revision == last.Revision {
			if err != nil {
				t.Fatalf("the last taker's save: %v", err)
			}
		} else if !errors.Is(err, hub.ErrStateFenced) {
			t.Fatalf("an earlier taker's save (epoch %d): %v", r.Epoch, err)
		}
	}
}

// TestMaxValueSize: the limit is the configured size, lowered to what fits
// the server's max_payload; a save over it fails with hub.ErrStateTooLarge
// before anything is written, one at it succeeds.
func TestMaxValueSize(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithMaxPayload(64<<10))
	nc := natstest.Connect(t, s)
	st := open(t, hubstate.Config{Conn: nc, Prefix: "big.v1"})
	if got := st.MaxValueSize(); got <= 60<<10 || got >= 64<<10 {
		t.Fatalf("default limit under a 64 KiB max_payload: %d", got)
	}
	small := open(t, hubstate.Config{Conn: nc, Prefix: "small.v1", MaxValueSize: 100})
	if small.MaxValueSize() != 100 {
		t.Fatalf("limit %d", small.MaxValueSize())
	}
	ctx := context.Background()
	for _, tc := range []struct {
		st   *hubstate.Store
		addr subjects.Address
	}{{st, "ctr/big"}, {small, "ctr/small"}} {
		r, err := tc.st.Take(ctx, tc.addr, nodeA)
		if err != nil {
			t.Fatal(err)
		}
		max := tc.st.MaxValueSize()
		if _, err := tc.st.Save(ctx, tc.addr, r, make([]byte, max+1)); !errors.Is(err, hub.ErrStateTooLarge) {
			t.Fatalf("%s: over the limit: %v", tc.addr, err)
		}
		if got, _ := tc.st.Get(ctx, tc.addr); got.Revision != r.Revision {
			t.Fatalf("%s: an oversized save wrote", tc.addr)
		}
		if _, err := tc.st.Save(ctx, tc.addr, r, make([]byte, max)); err != nil {
			t.Fatalf("%s: at the limit (%d bytes): %v", tc.addr, max, err)
		}
	}
	// A bucket created with a smaller limit keeps it for later openers.
	again := open(t, hubstate.Config{Conn: nc, Prefix: "small.v1"})
	if again.MaxValueSize() != 100 {
		t.Fatalf("reopened limit %d", again.MaxValueSize())
	}
	if _, err := hubstate.Open(ctx, hubstate.Config{}); !errors.Is(err, hubstate.ErrInvalidConfig) {
		t.Fatalf("no Conn: %v", err)
	}
}

// TestCorruptRecord: a value that is not a record fails Get and Take with
// hubstate.ErrCorrupt rather than being taken over.
func TestCorruptRecord(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	st := open(t, hubstate.Config{Conn: nc})
	js, _ := nc.JetStream()
	kv, err := js.KeyValue(hubstate.BucketName(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(hubstate.Key("ctr/bad"), []byte("not a record")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := st.Get(ctx, "ctr/bad"); !errors.Is(err, hubstate.ErrCorrupt) {
		t.Fatalf("Get: %v", err)
	}
	if _, err := st.Take(ctx, "ctr/bad", nodeA); !errors.Is(err, hubstate.ErrCorrupt) {
		t.Fatalf("Take: %v", err)
	}
}

// FuzzDecode: Decode never panics, fails only with ErrCorrupt, and
// whatever it accepts encodes back to a record with the same owner, epoch
// and data.
func FuzzDecode(f *testing.F) {
	f.Add(hubstate.Encode(hub.StateRecord{Owner: nodeA, Epoch: 3, Data: []byte("x")}))
	f.Add(hubstate.Encode(hub.StateRecord{}))
	f.Add([]byte{1, 0, 0})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 3, 'a', '.', '1'})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := hubstate.Decode(b)
		if err != nil {
			if !errors.Is(err, hubstate.ErrCorrupt) {
				t.Fatalf("error %v does not match ErrCorrupt", err)
			}
			return
		}
		back, err := hubstate.Decode(hubstate.Encode(r))
		if err != nil || back.Owner != r.Owner || back.Epoch != r.Epoch || !bytes.Equal(back.Data, r.Data) {
			t.Fatalf("round trip of %+v: %+v, %v", r, back, err)
		}
	})
}

// TestExistingReplicasKept: a store opened with another replica count than
// the existing bucket's binds it unchanged, reports the bucket's count, and
// logs a warning naming both and the command that would change it.
func TestExistingReplicasKept(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	if st := open(t, hubstate.Config{Conn: nc, Replicas: 1}); st.Replicas() != 1 {
		t.Fatalf("created with %d replicas", st.Replicas())
	}
	var logs bytes.Buffer
	st := open(t, hubstate.Config{Conn: nc, Replicas: 3, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if st.Replicas() != 1 {
		t.Errorf("Replicas() = %d, want the bucket's 1", st.Replicas())
	}
	out := logs.String()
	for _, want := range []string{"level=WARN", "bucket_replicas=1", "configured_replicas=3", "--replicas 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	logs.Reset()
	open(t, hubstate.Config{Conn: nc, Replicas: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if logs.Len() != 0 {
		t.Errorf("a matching replica count logged:\n%s", logs.String())
	}
}

// TestDelete: a delete compares on the deleter's revision like a save: from
// the current owner it removes the record (readers find none), the owner
// may save again on the deletion's revision, and the next take starts from
// no data with an epoch above every earlier one; from a predecessor, after
// a successor's take, it fails hub.ErrStateFenced and deletes nothing.
// Across several addresses and repeated deletions.
func TestDelete(t *testing.T) {
	s := natstest.RunServer(t)
	st := open(t, hubstate.Config{Conn: natstest.Connect(t, s)})
	ctx := context.Background()
	for _, addr := range []subjects.Address{"ctr/x", "kv/a.b c", "ctr/ünï/cödé"} {
		var epoch uint64
		for round := range 3 {
			a, err := st.Take(ctx, addr, nodeA)
			if err != nil || a.Epoch <= epoch || a.Data != nil {
				t.Fatalf("%s round %d: take %+v after epoch %d (deleted), %v", addr, round, a, epoch, err)
			}
			epoch = a.Epoch
			a, err = st.Save(ctx, addr, a, []byte("one"))
			if err != nil {
				t.Fatal(err)
			}
			d, err := st.Delete(ctx, addr, a)
			if err != nil || d.Revision <= a.Revision || d.Epoch != a.Epoch || d.Owner != nodeA || d.Data != nil {
				t.Fatalf("%s: delete %+v, %v", addr, d, err)
			}
			if _, err := st.Get(ctx, addr); !errors.Is(err, hubstate.ErrNotFound) {
				t.Fatalf("%s: after delete: %v", addr, err)
			}
			// The owner goes on: it saves on the deletion's revision.
			a, err = st.Save(ctx, addr, d, []byte("two"))
			if err != nil || a.Epoch != epoch {
				t.Fatalf("%s: save after delete %+v, %v", addr, a, err)
			}
			// A successor takes it over; the predecessor's delete is fenced.
			b, err := st.Take(ctx, addr, nodeB)
			if err != nil || b.Epoch != epoch+1 || string(b.Data) != "two" {
				t.Fatalf("%s: successor's take %+v, %v", addr, b, err)
			}
			epoch = b.Epoch
			if _, err := st.Delete(ctx, addr, a); !errors.Is(err, hub.ErrStateFenced) {
				t.Fatalf("%s: stale delete: %v", addr, err)
			}
			if got, err := st.Get(ctx, addr); err != nil || string(got.Data) != "two" || got.Owner != nodeB {
				t.Fatalf("%s: after the stale delete: %+v, %v", addr, got, err)
			}
			if _, err := st.Delete(ctx, addr, b); err != nil {
				t.Fatalf("%s: successor's delete: %v", addr, err)
			}
			// Its deletion's twin on the old revision deletes nothing more,
			// but cannot be told from a repeat of a publish that landed
			// (the marker it finds may be its own): outcome unknown.
			if _, err := st.Delete(ctx, addr, b); !errors.Is(err, hub.ErrStateUnknown) || errors.Is(err, hub.ErrStateFenced) {
				t.Fatalf("%s: repeated delete on the old revision: %v", addr, err)
			}
		}
	}
}
