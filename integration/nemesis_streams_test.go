package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/internal/nemesis"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
)

// The sync-stream part of the nemesis workload (issue 21: "sync streams
// converge to the owner's state after the faults stop"). On each of
// nemesisStreamAddrs addresses of the nodes' built-in kv hub, one writer
// sets keys, and one subscription from the test's sender node mirrors the
// address's stream through every fault: owner kills and freezes move the
// address, server kills and link faults move connections, the sender's own
// session may rejoin. Once the faults stop, each mirror must reach the
// owner's state, read through the owner's own turns (gets), within
// streamConvergence, and its subscription must still be open
// (nemesis.CheckStreams).
const (
	nemesisStreamAddrs = 2
	nemesisStreamKeys  = 4
	// streamConvergence bounds the wait: a subscription in back-off
	// resubscribes within the back-off's cap (60 s, DESIGN §7); one that
	// is not in back-off is due at once.
	streamConvergence = 70 * time.Second
)

// streamMirror is a subscription's view of a kv hub's map.
type streamMirror struct {
	mu    sync.Mutex
	state map[string]string
}

func (m *streamMirror) apply(f syncstream.Frame) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f.Snapshot {
		m.state = map[string]string{}
		_ = json.Unmarshal(f.Data, &m.state)
		return
	}
	var c hubs.KVChange
	if json.Unmarshal(f.Data, &c) != nil {
		return
	}
	if c.Deleted {
		delete(m.state, c.Key)
	} else {
		m.state[c.Key] = c.Value
	}
}

func (m *streamMirror) snapshot() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.state)
}

// streamLoad is the running stream workload.
type streamLoad struct {
	sender *mesh.Node
	addrs  []subjects.Address
	subs   []*syncstream.Subscription
	mirrs  []*streamMirror
	quit   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	writes []int // accepted sets per address
}

// startStreams subscribes to each stream address from n.sender (retrying
// while the address's first owner is placed) and starts its writer.
func (n *nemesisRun) startStreams(seed uint64) *streamLoad {
	t := n.t
	l := &streamLoad{sender: n.sender, quit: make(chan struct{}), writes: make([]int, nemesisStreamAddrs)}
	for i := range nemesisStreamAddrs {
		addr := subjects.Address(fmt.Sprintf("%s/nst%d", hubs.KVKind, i))
		m := &streamMirror{state: map[string]string{}}
		var sub *syncstream.Subscription
		var err error
		if !natstest.Poll(30*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			sub, err = syncstream.Subscribe(ctx, n.sender, addr, "", m.apply)
			return err == nil
		}) {
			t.Fatalf("subscribe to %s: %v", addr, err)
		}
		t.Cleanup(sub.Stop)
		l.addrs, l.subs, l.mirrs = append(l.addrs, addr), append(l.subs, sub), append(l.mirrs, m)
		l.wg.Add(1)
		go l.writer(i, addr, rand.New(rand.NewPCG(seed, uint64(50_000+i))))
	}
	return l
}

// writer sets a random key of addr (the i-th address) to a fresh value,
// one Request at a time, until the workload stops. It takes addr as an
// argument: startStreams is still appending to l.addrs.
func (l *streamLoad) writer(i int, addr subjects.Address, rng *rand.Rand) {
	defer l.wg.Done()
	for seq := 1; ; seq++ {
		select {
		case <-l.quit:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), nemesisOpTimeout)
		kv := fmt.Sprintf("k%d=%d", rng.IntN(nemesisStreamKeys), seq)
		_, err := l.sender.Request(ctx, mesh.Delivery{To: addr, Type: hubs.KVSet, Payload: []byte(kv)})
		cancel()
		if err == nil {
			l.mu.Lock()
			l.writes[i]++
			l.mu.Unlock()
		}
		think(rng)
		think(rng)
	}
}

// stop stops the writers and waits for them.
func (l *streamLoad) stop() {
	close(l.quit)
	l.wg.Wait()
}

// owner reads addr's map through the owner's turns, key by key.
func (l *streamLoad) owner(addr subjects.Address) (map[string]string, error) {
	out := map[string]string{}
	for k := range nemesisStreamKeys {
		key := fmt.Sprintf("k%d", k)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := l.sender.Request(ctx, mesh.Delivery{To: addr, Type: hubs.KVGet, Payload: []byte(key)})
		cancel()
		if err != nil {
			return nil, err
		}
		if len(r.Payload) > 0 {
			out[key] = string(r.Payload)
		}
	}
	return out, nil
}

// converge records each subscription's outcome in rec: it polls until the
// mirror equals the owner's state or streamConvergence passes, from
// faultsStopped on.
func (l *streamLoad) converge(t *testing.T, rec *nemesis.Recorder, faultsStopped time.Time) {
	var wg sync.WaitGroup
	for i, addr := range l.addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub, m := l.subs[i], l.mirrs[i]
			o := nemesis.StreamOutcome{Address: string(addr)}
			equal := natstest.Poll(time.Until(faultsStopped.Add(streamConvergence)), func() bool {
				select {
				case <-sub.Closed():
					o.Closed = fmt.Sprint(sub.Err())
					return true // ended: nothing more to wait for
				default:
				}
				owner, err := l.owner(addr)
				o.Mirror = m.snapshot()
				if err != nil {
					return false
				}
				o.Owner = owner
				return maps.Equal(o.Mirror, owner)
			})
			o.Converged = equal && o.Closed == ""
			o.Waited = int64(time.Since(faultsStopped))
			o.Frames, o.Stale, o.Resubscribes = sub.Stats()
			l.mu.Lock()
			o.Writes = l.writes[i]
			l.mu.Unlock()
			t.Logf("stream %s: converged %v after %v (frames %d, stale %d, resubscribes %d, writes %d)%s",
				addr, o.Converged, time.Duration(o.Waited).Round(time.Millisecond), o.Frames, o.Stale, o.Resubscribes, o.Writes, closedNote(o.Closed))
			rec.AddStream(o)
		}()
	}
	wg.Wait()
	for _, s := range l.subs {
		s.Stop()
	}
}

func closedNote(closed string) string {
	if closed == "" {
		return ""
	}
	return ", closed: " + closed
}
