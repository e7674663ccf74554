package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// BenchmarkColdActivation: deliveries to addresses never seen before (each
// one claimed in the directory, with membership, and built): new addresses
// per second on one node, against the same with a one-node mesh (no claim).
func BenchmarkColdActivation(b *testing.B) {
	for _, mode := range []string{"standalone", "membership"} {
		b.Run(mode, func(b *testing.B) {
			s := natstest.RunServer(b)
			nc := natstest.Connect(b, s)
			cfg := NodeConfig{Conn: nc, Name: "cold", DisableIngress: true, DisableControl: true, Logger: discardLogger}
			if mode == "membership" {
				mc := fastMembership
				cfg.Membership = &mc
			}
			n, err := NewNode(cfg, WithSaturationThreshold(0))
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			_ = n.Register("rec", newRecorder().factory)
			if err := n.Start(); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := n.Deliver(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/%d", i))}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "activations/s")
		})
	}
}

// BenchmarkResolveWarm: resolving an address whose owner is cached and alive
// (the cost a delivery pays per attempt with membership).
func BenchmarkResolveWarm(b *testing.B) {
	s := natstest.RunServer(b)
	nc := natstest.Connect(b, s)
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "r", DisableIngress: true, DisableControl: true, Membership: &mc, Logger: discardLogger})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	_ = n.Register("rec", newRecorder().factory)
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := n.Deliver(ctx, Delivery{To: "rec/warm"}); err != nil {
		b.Fatal(err)
	}
	d := n.Directory()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := d.Resolve(ctx, "rec/warm"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSequentialMembership: BenchmarkSequential's mesh case with
// membership on (claims, resolve through the directory cache, fencing).
func BenchmarkSequentialMembership(b *testing.B) {
	s := natstest.RunServer(b)
	nc := natstest.Connect(b, s)
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "seqm", DisableIngress: true, DisableControl: true, Membership: &mc, Logger: discardLogger}, WithSaturationThreshold(0))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	_ = n.Register("bench", newRecorder().factory)
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	d := Delivery{To: "bench/seq", Payload: payload128}
	if _, err := n.Deliver(ctx, d); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d.ID = ""
		if _, err := n.Deliver(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
}

var discardLogger = slog.New(slog.DiscardHandler)

// BenchmarkWarmUnderColdActivations: the latency of deliveries to an active
// address on a node with membership, alone and while another sender
// activates 10 000 cold addresses on the same node (each one a directory
// claim, pipelined off the subscription goroutine), in the same run. Warm
// deliveries must not wait behind other addresses' claims. Run with
// -benchtime=1x: each iteration is the whole scenario.
func BenchmarkWarmUnderColdActivations(b *testing.B) {
	const cold, warm = 10000, 2000
	for i := 0; i < b.N; i++ {
		s := natstest.RunServer(b)
		mc := fastMembership
		mc.Heartbeat, mc.TTL = time.Second, 8*time.Second
		start := func(name string, kinds bool) *Node {
			n, err := NewNode(NodeConfig{Conn: natstest.Connect(b, s), Name: name, DisableIngress: true, DisableControl: true, Membership: &mc, Logger: discardLogger}, WithSaturationThreshold(0))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { n.Close() })
			if kinds {
				_ = n.Register("rec", newRecorder().factory)
			}
			if err := n.Start(); err != nil {
				b.Fatal(err)
			}
			return n
		}
		owner := start("owner", true)
		loader := start("loader", false)
		ctx := context.Background()
		natstest.Eventually(b, 10*time.Second, func() bool { return len(loader.Members().Hosting("rec")) == 1 }, "loader sees the owner")
		measure := func() []time.Duration {
			lat := make([]time.Duration, 0, warm)
			for j := range warm {
				t0 := time.Now()
				if _, err := owner.Deliver(ctx, Delivery{To: "rec/warm", Payload: []byte(fmt.Sprint(j))}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			return lat
		}
		measure() // activates rec/warm
		b.ResetTimer()
		idle := measure()
		var wg sync.WaitGroup
		var failed atomic.Int64
		coldStart := time.Now()
		for j := range cold {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := loader.Deliver(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/cold-%d", j))}); err != nil {
					failed.Add(1)
				}
			}()
		}
		natstest.Eventually(b, 30*time.Second, func() bool { return owner.Host().Stats().Claiming > 0 }, "cold claims in flight")
		loaded := measure()
		coldDuringWarm := owner.Host().Stats().Activations
		wg.Wait()
		coldTook := time.Since(coldStart)
		b.StopTimer()
		pct := func(lat []time.Duration, p float64) time.Duration {
			slices.Sort(lat)
			return lat[int(p*float64(len(lat)-1))]
		}
		b.ReportMetric(float64(pct(idle, 0.50).Microseconds()), "warm-idle-p50-µs")
		b.ReportMetric(float64(pct(idle, 0.99).Microseconds()), "warm-idle-p99-µs")
		b.ReportMetric(float64(pct(loaded, 0.50).Microseconds()), "warm-cold-p50-µs")
		b.ReportMetric(float64(pct(loaded, 0.99).Microseconds()), "warm-cold-p99-µs")
		b.ReportMetric(float64(cold)/coldTook.Seconds(), "cold-activations/s")
		b.Logf("warm p50/p99: idle %v/%v, under %d cold activations %v/%v (%d activations when the warm run ended; cold failed %d; cold took %v)",
			pct(idle, 0.5), pct(idle, 0.99), cold, pct(loaded, 0.5), pct(loaded, 0.99), coldDuringWarm, failed.Load(), coldTook)
	}
}
