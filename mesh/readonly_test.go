package mesh

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// register is a hub whose "get" deliveries are read-only: it checks that
// no read runs beside a write and no two writes overlap, and logs the
// writes in the order they ran.
type register struct {
	readers, writers  atomic.Int64
	maxReaders        atomic.Int64
	violations        atomic.Int64
	mu                sync.Mutex
	writes            []string
	readWork, setWork time.Duration
}

func (r *register) ReadOnlyTypes() []string { return []string{"get"} }

func (r *register) Handle(_ context.Context, d *hub.Delivery) error {
	if d.Type == "get" {
		n := r.readers.Add(1)
		defer r.readers.Add(-1)
		for m := r.maxReaders.Load(); n > m && !r.maxReaders.CompareAndSwap(m, n); m = r.maxReaders.Load() {
		}
		if r.writers.Load() != 0 {
			r.violations.Add(1)
		}
		time.Sleep(r.readWork)
		return d.Respond(nil)
	}
	if r.writers.Add(1) != 1 || r.readers.Load() != 0 {
		r.violations.Add(1)
	}
	defer r.writers.Add(-1)
	r.mu.Lock()
	r.writes = append(r.writes, string(d.Stream)+":"+string(d.Payload))
	r.mu.Unlock()
	time.Sleep(r.setWork)
	if r.readers.Load() != 0 {
		r.violations.Add(1)
	}
	return nil
}

func registerNode(tb testing.TB, s *server.Server, r *register) *Node {
	tb.Helper()
	n, err := NewNode(NodeConfig{Conn: natstest.Connect(tb, s), Name: "ro"})
	if err != nil {
		tb.Fatal(err)
	}
	if err := n.Register("reg", func(context.Context, subjects.Address) (hub.Hub, error) { return r, nil }); err != nil {
		tb.Fatal(err)
	}
	if err := n.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { n.Close() })
	return n
}

// Read-only turns of one activation run side by side, never beside an
// exclusive turn; each stream's exclusive deliveries keep their order.
func TestReadOnlyTurnsRunSideBySide(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	r := &register{readWork: 5 * time.Millisecond, setWork: time.Millisecond}
	n := registerNode(t, s, r)
	ctx := context.Background()
	const writes, streams, readers = 50, 3, 16
	var wg sync.WaitGroup
	errs := make(chan error, streams*writes+readers*writes)
	for st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range writes {
				_, err := n.Deliver(ctx, Delivery{To: "reg/x", Stream: subjects.Stream(fmt.Sprint(st)), Type: "set", Payload: []byte(strconv.Itoa(i))})
				errs <- err
			}
		}()
	}
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range writes {
				_, err := n.Request(ctx, Delivery{To: "reg/x", Type: "get"})
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.writes) == streams*writes
	}, "not every write ran")
	if v := r.violations.Load(); v != 0 {
		t.Fatalf("%d turns overlapped an exclusive turn", v)
	}
	if m := r.maxReaders.Load(); m < 2 {
		t.Fatalf("at most %d read-only turns ran at once", m)
	}
	next := map[string]int{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.writes {
		var st string
		var i int
		fmt.Sscanf(w, "%1s:%d", &st, &i)
		if i != next[st] {
			t.Fatalf("stream %s: write %d ran after %d (order %v)", st, i, next[st]-1, r.writes)
		}
		next[st]++
	}
	t.Logf("up to %d read-only turns at once", r.maxReaders.Load())
}

// BenchmarkReadOnlyTurns: requests to one hot address whose handler takes
// 200 µs, as read-only turns and as exclusive ones.
func BenchmarkReadOnlyTurns(b *testing.B) {
	for _, typ := range []string{"get", "set"} {
		b.Run(map[string]string{"get": "read-only", "set": "exclusive"}[typ], func(b *testing.B) {
			s := natstest.RunServer(b)
			r := &register{readWork: 200 * time.Microsecond, setWork: 200 * time.Microsecond}
			n := registerNode(b, s, r)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := n.Request(context.Background(), Delivery{To: "reg/hot", Type: typ}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
		})
	}
}
