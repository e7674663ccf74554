package mesh

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// BenchmarkTracing: the cost of tracing, in one run (BENCHMARKS.md): off
// (no tracer provider, as today), on with every trace sampled (the SDK's
// batch processor, spans exported to a discarding exporter), and on with
// nothing sampled. Sequential Deliver (p50, allocations) and 256 lanes in
// flight (throughput). Run with
//
//	go test -run '^$' -bench Tracing -benchmem -benchtime 3s ./mesh/
func BenchmarkTracing(b *testing.B) {
	s := natstest.RunServer(b)
	providers := []struct {
		name string
		tp   func(b *testing.B) trace.TracerProvider
	}{
		{"off", func(*testing.B) trace.TracerProvider { return nil }},
		{"on", func(b *testing.B) trace.TracerProvider {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			return tp
		}},
		{"unsampled", func(b *testing.B) trace.TracerProvider {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			return tp
		}},
	}
	for _, p := range providers {
		b.Run("sequential/"+p.name, func(b *testing.B) {
			n := tracedBenchNode(b, s, p.tp(b))
			ctx := context.Background()
			d := Delivery{To: "bench/seq", Payload: payload128}
			if _, err := n.Deliver(ctx, d); err != nil {
				b.Fatal(err)
			}
			runSequential(b, func() error {
				d.ID = ""
				_, err := n.Deliver(ctx, d)
				return err
			})
		})
	}
	for _, p := range providers {
		b.Run("concurrent256/"+p.name, func(b *testing.B) {
			n := tracedBenchNode(b, s, p.tp(b))
			ctx := context.Background()
			streams := make([]subjects.Stream, 256)
			for i := range streams {
				streams[i] = subjects.Stream(fmt.Sprint(i))
			}
			b.ReportAllocs()
			runWorkers(b, len(streams), func(w int) error {
				_, err := n.Deliver(ctx, Delivery{To: "bench/conc", Stream: streams[w], Payload: payload128})
				return err
			})
		})
	}
}

func tracedBenchNode(b *testing.B, s *server.Server, tp trace.TracerProvider) *Node {
	nc := natstest.Connect(b, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: "bench", TracerProvider: tp}, WithSaturationThreshold(0))
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
