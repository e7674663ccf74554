package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

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
