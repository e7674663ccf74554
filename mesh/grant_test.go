package mesh

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// grantHub speaks the intake's side of windowed lanes on a real server: it
// accepts a leg without HeaderLane or with seq 1 at once (seq 1 with its
// window grant) and holds every other leg unanswered until release, noting
// the most it held at once since the last release.
type grantHub struct {
	nc    *nats.Conn
	grant int

	mu   sync.Mutex
	held []*nats.Msg
	max  int
	open bool // accept everything at once from now on
}

func newGrantHub(t *testing.T, nc *nats.Conn, node subjects.NodeID, grant int) *grantHub {
	g := &grantHub{nc: nc, grant: grant}
	sub, err := nc.Subscribe(subjects.DefaultPrefix.Sub("dlv."+node.Name+"."+strconv.FormatUint(node.Generation, 10)+".>"), g.leg)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return g
}

func (g *grantHub) accept(m *nats.Msg, grant int) {
	r := nats.NewMsg(m.Reply)
	verdict.Encode(r.Header, nil, "fake.1")
	if grant > 0 {
		r.Header.Set(hub.HeaderWindow, strconv.Itoa(grant))
	}
	_ = g.nc.PublishMsg(r)
}

func (g *grantHub) leg(m *nats.Msg) {
	lane := m.Header.Get(hub.HeaderLane)
	if lane == "" {
		g.accept(m, 0)
		return
	}
	if strings.HasSuffix(lane, "/1") {
		g.accept(m, g.grant)
		return
	}
	g.mu.Lock()
	if g.open {
		g.mu.Unlock()
		g.accept(m, 0)
		return
	}
	g.held = append(g.held, m)
	g.max = max(g.max, len(g.held))
	g.mu.Unlock()
}

func (g *grantHub) heldNow() (held, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held), g.max
}

func (g *grantHub) release(open bool) {
	g.mu.Lock()
	g.open = g.open || open
	held := g.held
	g.held, g.max = nil, 0
	g.mu.Unlock()
	for _, m := range held {
		g.accept(m, 0)
	}
}

// TestLaneTakesGrantedWindow: a lane sizes its window from its receiver's
// grant (hub.HeaderWindow on the reply to an epoch's first leg): a grant
// above the starting window raises it, one below lowers it for the legs
// sent after it arrived, and WithWindow caps it. Counted on the wire: the
// legs of the lane the receiver holds unanswered at once.
func TestLaneTakesGrantedWindow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grant int
		opts  []Option
		want  int // window once the grant is known
		first int // legs held at most before the first release (those sent before the grant came)
	}{
		{"raised", 100, nil, 100, 100},
		{"capped", 100, []Option{WithWindow(8)}, 8, 8},
		{"lowered", 4, nil, 4, DefaultWindow - 1}, // seq 2..32 left before the grant came
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t)
			node := subjects.NodeID{Name: "fake", Generation: 1}
			g := newGrantHub(t, natstest.Connect(t, s), node, tc.grant)
			// Legs are held for as long as the test looks: no leg may
			// time out meanwhile, however loaded the machine.
			opts := append([]Option{WithLegTimeout(2 * time.Minute), WithRequestTimeout(4 * time.Minute), WithSaturationThreshold(0)}, tc.opts...)
			c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: node}, opts...)
			const total = 400
			var chans []<-chan Result
			for i := range total {
				chans = append(chans, c.DeliverAsync(context.Background(), Delivery{ID: "g-" + strconv.Itoa(i), To: "k/a"}))
			}
			key := LaneKey{Addr: "k/a"}
			// window is the lane's window, whether it is full (its cursor
			// is past it: the sender may send nothing more now), and how
			// many of its legs are sent and unsettled.
			window := func() (w int, full bool, sent int) {
				c.lanesMu.Lock()
				defer c.lanesMu.Unlock()
				l := c.lanes[key]
				if l == nil {
					return 0, false, 0
				}
				l.mu.Lock()
				defer l.mu.Unlock()
				i := l.cursorLocked()
				for _, t := range l.q[l.head:] {
					if t.state == ticketSent && t.epoch == l.epoch {
						sent++
					}
				}
				return l.window, i < 0 || i-l.head >= l.window, sent
			}
			// settle waits until the sender can send no more (its window
			// is full, everything it sent is held) and returns the count.
			settle := func() int {
				t.Helper()
				var n int
				natstest.Eventually(t, time.Minute, func() bool {
					held, _ := g.heldNow()
					_, full, sent := window()
					n = sent
					return full && sent > 0 && held == sent
				}, "a full window held: %v", lazyString(func() string {
					// What the lane and the receiver show at the end
					// (this failed once in CI, not reproduced in 60 runs
					// under load: say enough to tell why next time).
					held, most := g.heldNow()
					w, full, sent := window()
					c.lanesMu.Lock()
					defer c.lanesMu.Unlock()
					l := c.lanes[key]
					if l == nil {
						return fmt.Sprintf("no lane; held %d (most %d)", held, most)
					}
					l.mu.Lock()
					defer l.mu.Unlock()
					states := map[ticketState]int{}
					stale := 0
					for _, t := range l.q[l.head:] {
						states[t.state]++
						if t.state == ticketSent && t.epoch != l.epoch {
							stale++
						}
					}
					return fmt.Sprintf("window %d, full %v, sent in this epoch %d, held by the receiver %d (most %d); head %d, queued %d, cursor %d, epoch %d seq %d, tickets by state %v, sent in an older epoch %d",
						w, full, sent, held, most, l.head, len(l.q)-l.head, l.cursorLocked(), l.epoch, l.seq, states, stale)
				}))
				return n
			}
			if held := settle(); held > tc.first || held < tc.want {
				t.Fatalf("first window: %d legs held, want %d-%d", held, tc.want, tc.first)
			}
			if w, _, _ := window(); w != tc.want {
				t.Fatalf("lane window %d after the grant, want %d", w, tc.want)
			}
			for done := tc.first + 1; done < total-tc.want; done += tc.want {
				g.release(false)
				if held := settle(); held != tc.want {
					t.Fatalf("after %d: %d legs held, want %d", done, held, tc.want)
				}
				if _, most := g.heldNow(); most > tc.want {
					t.Fatalf("after %d: %d legs held at once, want at most %d", done, most, tc.want)
				}
			}
			g.release(true)
			for _, ch := range chans {
				if r := <-ch; r.Err != nil {
					t.Fatalf("%s: %v", r.ID, r.Err)
				}
			}
		})
	}
}
