package syncstream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// heldOwners is a hub kind whose activations are bare stream owners with an
// epoch the test picks (Owner.Resume, as a durable hub's or a skewed
// clock's), and whose subscribe handling the test can hold: each held
// subscribe's attempt is sent on held and waits for release.
type heldOwners struct {
	mu      sync.Mutex
	epoch   map[subjects.Address]uint64 // the epoch of an address's next activation
	owner   map[subjects.Address]*syncstream.Owner
	held    chan string
	release chan struct{}
}

func newHeldOwners(t testing.TB, n *mesh.Node, kind string) *heldOwners {
	g := &heldOwners{epoch: map[subjects.Address]uint64{}, owner: map[subjects.Address]*syncstream.Owner{}}
	if err := n.Register(kind, func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		o := syncstream.NewOwner(n.Client, addr, func(subjects.Stream) []byte { return []byte("genuine") }, quiet)
		g.mu.Lock()
		if e := g.epoch[addr]; e != 0 {
			o.Resume(e, nil)
		}
		g.owner[addr] = o
		g.mu.Unlock()
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			if d.Type == syncstream.TypeSubscribe {
				g.mu.Lock()
				held, release := g.held, g.release
				g.mu.Unlock()
				if held != nil {
					var req struct {
						Attempt string `json:"attempt"`
					}
					_ = json.Unmarshal(d.Payload, &req)
					held <- req.Attempt
					<-release
				}
			}
			_, err := o.Handle(d)
			return err
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *heldOwners) ownerOf(t testing.TB, addr subjects.Address) *syncstream.Owner {
	t.Helper()
	var o *syncstream.Owner
	natstest.Eventually(t, 20*time.Second, func() bool { // a resubscribe backs off (1 s base) after its grace failures
		g.mu.Lock()
		defer g.mu.Unlock()
		o = g.owner[addr]
		return o != nil
	}, "owner of %s activated", addr)
	return o
}

// hold makes the next subscribes wait; the returned function lets them go.
func (g *heldOwners) hold() (held <-chan string, release func()) {
	h, r := make(chan string, 16), make(chan struct{})
	g.mu.Lock()
	g.held, g.release = h, r
	g.mu.Unlock()
	var once sync.Once
	return h, func() {
		once.Do(func() {
			g.mu.Lock()
			g.held, g.release = nil, nil
			g.mu.Unlock()
			close(r)
		})
	}
}

// TestSnapshotGuardOfLatestAttempt: a snapshot naming the subscriber's
// latest subscribe attempt passes the (epoch, version) guard like any
// frame (DESIGN §7): one of an older epoch, or of the mirror's epoch and an
// older version, is dropped and never applied — it is not the
// answer the attempt got (that one names the epoch in its response) — and
// the subscriber converges on the activation whose response answered the
// attempt, whichever snapshot came first: a newer epoch's snapshot arriving
// ahead of the responder's does not wedge it. And a newer activation whose
// epoch is below the mirror's (a clock behind) is still followed: its
// response names its epoch. Each case runs several times, the foreign
// snapshot arriving while the responder's subscribe is held.
func TestSnapshotGuardOfLatestAttempt(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	g := newHeldOwners(t, owner, "held")
	sub, _ := startNode(t, s, "sub", false)
	frames := capture(t, s, sub.ID())
	raw := natstest.Connect(t, s)
	const base = 1 << 40
	type pair struct{ epoch, version int64 } // relative to the mirror's (E, 3)
	cases := []struct {
		name    string
		foreign pair
		applied bool // the guard lets it through (it is newer)
	}{
		{"older-epoch", pair{-1, 9}, false},
		{"much-older-epoch", pair{-base / 2, 0}, false},
		{"same-epoch-older-version", pair{0, -2}, false},
		{"newer-epoch", pair{+1, -3}, true},
		{"newer-epoch-newer-version", pair{+1, +5}, true},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for rep := range 3 {
				addr := subjects.Address(fmt.Sprintf("held/%d-%d", ci, rep))
				epoch := uint64(base + ci*1000 + rep*10)
				g.mu.Lock()
				g.epoch[addr] = epoch
				g.mu.Unlock()
				var mu sync.Mutex
				var got []syncstream.Frame
				ss, err := syncstream.Subscribe(context.Background(), sub, addr, "", func(f syncstream.Frame) {
					mu.Lock()
					got = append(got, f)
					mu.Unlock()
				})
				if err != nil {
					t.Fatal(err)
				}
				o := g.ownerOf(t, addr)
				for i := range 3 {
					o.Publish("", []byte(fmt.Sprint("delta", i)))
				}
				natstest.Eventually(t, 5*time.Second, func() bool { e, v := ss.Position(); return e == epoch && v == 3 }, "mirror at (E, 3)")
				var subj string // the subscriber address's delivery subject
				natstest.Eventually(t, 5*time.Second, func() bool {
					for _, m := range frames() {
						if m.Header.Get("Mesh-From") == string(addr) {
							subj = m.Subject
						}
					}
					return subj != ""
				}, "a frame delivery of %s captured", addr)
				held, release := g.hold()
				t.Cleanup(release) // a failure below lets the held subscribe go
				o.Close()          // the stream ends: the subscriber subscribes again, to this activation
				var attempt string
				select {
				case attempt = <-held:
				case <-time.After(10 * time.Second):
					t.Fatal("no resubscribe")
				}
				applied0, stale0, _ := ss.Stats()
				fe := uint64(int64(epoch) + c.foreign.epoch)
				fv := uint64(int64(3) + c.foreign.version)
				m := nats.NewMsg(subj)
				m.Header.Set("Mesh-Id", fmt.Sprintf("foreign-%d-%d", ci, rep))
				m.Header.Set("Mesh-Type", syncstream.TypeFrames)
				m.Data = syncstream.AppendFrames(nil, syncstream.Frame{Snapshot: true, Epoch: fe, Version: fv, Attempt: attempt, Data: []byte("foreign")})
				r, err := raw.RequestMsg(m, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := verdict.Decode(r.Header); err != nil {
					t.Fatalf("foreign snapshot refused: %v", err)
				}
				natstest.Eventually(t, 5*time.Second, func() bool { a, st, _ := ss.Stats(); return a+st > applied0+stale0 }, "the foreign snapshot handled")
				if e, v := ss.Position(); !c.applied && (e != epoch || v != 3) {
					t.Fatalf("rep %d: a snapshot (%d, %d) of the latest attempt moved the mirror from (%d, 3) to (%d, %d)", rep, fe, fv, epoch, e, v)
				}
				release()
				o.Publish("", []byte("after"))
				natstest.Eventually(t, 10*time.Second, func() bool { e, v := ss.Position(); return e == epoch && v == 4 }, "rep %d: converged on the responder's (E, 4): %v", rep, lazy(func() string {
					e, v := ss.Position()
					a, st, rs := ss.Stats()
					return fmt.Sprintf("at (%d, %d), applied %d, stale %d, resubscribes %d", e, v, a, st, rs)
				}))
				mu.Lock()
				for _, f := range got {
					if string(f.Data) == "foreign" && !c.applied {
						t.Errorf("rep %d: the foreign snapshot (%d, %d) was applied", rep, f.Epoch, f.Version)
					}
				}
				mu.Unlock()
				ss.Stop()
			}
		})
	}
	// A newer activation whose epoch is below the mirror's: followed.
	t.Run("newer-activation-lower-epoch", func(t *testing.T) {
		for rep := range 3 {
			addr := subjects.Address(fmt.Sprintf("held/skew-%d", rep))
			epoch := uint64(base + 500_000 + rep*10)
			g.mu.Lock()
			g.epoch[addr] = epoch
			g.mu.Unlock()
			ss, err := syncstream.Subscribe(context.Background(), sub, addr, "", func(syncstream.Frame) {})
			if err != nil {
				t.Fatal(err)
			}
			o := g.ownerOf(t, addr)
			o.Publish("", []byte("x"))
			natstest.Eventually(t, 5*time.Second, func() bool { e, v := ss.Position(); return e == epoch && v == 1 }, "first activation")
			g.mu.Lock()
			g.epoch[addr] = epoch - 100 // the next activation's clock is behind
			delete(g.owner, addr)
			g.mu.Unlock()
			o.Close() // the stream ends with this activation
			owner.Host().Deactivate(addr)
			o2 := g.ownerOf(t, addr)
			o2.Publish("", []byte("y"))
			natstest.Eventually(t, 10*time.Second, func() bool { e, v := ss.Position(); return e == epoch-100 && v == 1 }, "rep %d: followed the next activation", rep)
			ss.Stop()
		}
	})
}
