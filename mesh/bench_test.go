package mesh

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/latency"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Benchmarks run the mesh and raw NATS request/reply side by side on the
// same in-process server; BENCHMARKS.md reports their ratios. Run with
//
//	go test -run '^$' -bench . -benchtime 3s ./mesh/

var payload128 = make([]byte, 128)

// rawResponder answers every request on subject at once with an Accepted
// verdict header: what a hub's intake does, minus the mesh.
func rawResponder(b testing.TB, s *server.Server, subject string) {
	nc := natstest.Connect(b, s)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set(verdict.HeaderVerdict, "Accepted")
		_ = m.RespondMsg(r)
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = nc.Flush()
}

func benchNode(b *testing.B, s *server.Server) *Node {
	nc := natstest.Connect(b, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: "bench"}, WithSaturationThreshold(0))
	if err != nil {
		b.Fatal(err)
	}
	_ = n.Register("bench", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(context.Context, *hub.Delivery) error { return nil }), nil
	})
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	return n
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkSequential: one caller, one delivery at a time, 128-byte payload.
func BenchmarkSequential(b *testing.B) {
	s := natstest.RunServer(b)
	b.Run("mesh", func(b *testing.B) {
		n := benchNode(b, s)
		ctx := context.Background()
		d := Delivery{To: "bench/seq", Payload: payload128}
		if _, err := n.Deliver(ctx, d); err != nil { // warm: activation built
			b.Fatal(err)
		}
		runSequential(b, func() error {
			d.ID = ""
			_, err := n.Deliver(ctx, d)
			return err
		})
	})
	b.Run("raw", func(b *testing.B) {
		rawResponder(b, s, "raw.seq")
		nc := natstest.Connect(b, s)
		runSequential(b, func() error {
			_, err := nc.Request("raw.seq", payload128, 5*time.Second)
			return err
		})
	})
}

// BenchmarkConcurrent256: 256 lanes (distinct streams of one address) in
// flight at once vs raw requests with 256 in flight.
func BenchmarkConcurrent256(b *testing.B) {
	s := natstest.RunServer(b)
	const lanes = 256
	run := func(b *testing.B, do func(worker int) error) { runWorkers(b, lanes, do) }
	b.Run("mesh", func(b *testing.B) {
		n := benchNode(b, s)
		ctx := context.Background()
		streams := make([]subjects.Stream, lanes)
		for i := range streams {
			streams[i] = subjects.Stream(fmt.Sprint(i))
		}
		b.ReportAllocs()
		run(b, func(w int) error {
			_, err := n.Deliver(ctx, Delivery{To: "bench/conc", Stream: streams[w], Payload: payload128})
			return err
		})
	})
	b.Run("raw", func(b *testing.B) {
		rawResponder(b, s, "raw.conc")
		nc := natstest.Connect(b, s)
		b.ReportAllocs()
		run(b, func(int) error {
			_, err := nc.Request("raw.conc", payload128, 5*time.Second)
			return err
		})
	})
}

// BenchmarkDistantStreams: a destination about 2 ms away (1 ms each way
// through a delaying proxy): 64 streams vs 1 stream, each stream sending
// its deliveries one after another.
func BenchmarkDistantStreams(b *testing.B) {
	s := natstest.RunServer(b)
	n := benchNode(b, s)
	p, err := latency.Start(s.Addr().String(), time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	c, err := NewClient(Config{Conn: natstest.ConnectURL(b, p.URL()), Resolver: StaticResolver{Node: n.ID()}}, WithSaturationThreshold(0))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	rawResponder(b, s, "raw.far")
	rawConn := natstest.ConnectURL(b, p.URL())
	for _, streams := range []int{1, 64} {
		b.Run(fmt.Sprintf("raw/requesters=%d", streams), func(b *testing.B) {
			runWorkers(b, streams, func(int) error {
				_, err := rawConn.Request("raw.far", payload128, 5*time.Second)
				return err
			})
		})
	}
	for _, streams := range []int{1, 64} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			runWorkers(b, streams, func(w int) error {
				_, err := c.Deliver(context.Background(), Delivery{To: "bench/far", Stream: subjects.Stream(fmt.Sprint(w)), Payload: payload128})
				return err
			})
		})
	}
}

// BenchmarkIdleActivations: memory and goroutines per idle activation, with
// 100 000 activations on one node.
func BenchmarkIdleActivations(b *testing.B) {
	const count = 100_000
	s := natstest.RunServer(b)
	for i := 0; i < b.N; i++ {
		nc := natstest.Connect(b, s)
		h, err := hub.New(hub.Config{Conn: nc, Node: subjects.NodeID{Name: "idle", Generation: uint64(i + 1)}, IdleTimeout: -1})
		if err != nil {
			b.Fatal(err)
		}
		_ = h.Register("idle", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
			return hub.HandlerFunc(func(context.Context, *hub.Delivery) error { return nil }), nil
		})
		addrs := make([]subjects.Address, count)
		for j := range addrs {
			addrs[j] = subjects.Address(fmt.Sprintf("idle/%08d", j))
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()
		for _, a := range addrs {
			release, err := h.Activate(context.Background(), a)
			if err != nil {
				b.Fatal(err)
			}
			release()
		}
		// Builds finish on their own goroutines; wait until all are idle.
		for runtime.NumGoroutine() > g0 {
			runtime.Gosched()
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if st := h.Stats(); st.Activations != count {
			b.Fatalf("activations = %d", st.Activations)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/count, "B/activation")
		b.ReportMetric(float64(runtime.NumGoroutine()-g0), "goroutines")
		h.Close()
	}
}

// runWorkers runs b.N calls of do spread over workers goroutines (each
// calling one after another with its own index) and reports deliveries/s.
func runWorkers(b *testing.B, workers int, do func(worker int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := do(w); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
}

// runSequential runs op b.N times one after another, timing each call, and
// reports allocations and the latency percentiles (reportPercentiles); a
// failing op stops the benchmark.
func runSequential(b *testing.B, op func() error) {
	b.Helper()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkPaired: sequential Deliver and Request against raw NATS
// request/reply, interleaved call by call on one server (mesh, raw, raw,
// mesh, ...), so that both see the same load at the same moments: on a
// shared machine the load drifts between two sub-benchmarks by more than
// the difference measured. Reports each side's p50 and p99 in µs and the
// p50 ratio mesh/raw.
func BenchmarkPaired(b *testing.B) {
	s := natstest.RunServer(b)
	rawResponder(b, s, "raw.paired")
	nc := natstest.Connect(b, s)
	n := benchNode(b, s)
	ctx := context.Background()
	raw := func() error {
		_, err := nc.Request("raw.paired", payload128, 5*time.Second)
		return err
	}
	for _, c := range []struct {
		name string
		mesh func() error
	}{
		{"Deliver", func() error {
			_, err := n.Deliver(ctx, Delivery{To: "bench/paired", Payload: payload128})
			return err
		}},
		{"Request", func() error {
			_, err := n.Request(ctx, Delivery{To: "bench/paired-req", Payload: payload128})
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			if err := c.mesh(); err != nil { // warm: activation built
				b.Fatal(err)
			}
			runPaired(b, c.mesh, raw)
		})
	}
}

// runPaired runs mesh and raw b.N times each, alternating which goes first,
// timing every call, and reports both sides' percentiles and the ratio of
// their medians.
func runPaired(b *testing.B, mesh, raw func() error) {
	b.Helper()
	lm := make([]time.Duration, 0, b.N)
	lr := make([]time.Duration, 0, b.N)
	timed := func(op func() error, lat *[]time.Duration) {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		*lat = append(*lat, time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			timed(mesh, &lm)
			timed(raw, &lr)
		} else {
			timed(raw, &lr)
			timed(mesh, &lm)
		}
	}
	b.StopTimer()
	slices.Sort(lm)
	slices.Sort(lr)
	pct := func(lat []time.Duration, p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(lm, 0.5), "mesh-p50-µs")
	b.ReportMetric(pct(lr, 0.5), "raw-p50-µs")
	b.ReportMetric(pct(lm, 0.99), "mesh-p99-µs")
	b.ReportMetric(pct(lr, 0.99), "raw-p99-µs")
	b.ReportMetric(pct(lm, 0.5)/pct(lr, 0.5), "p50-ratio")
}
