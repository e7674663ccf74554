package directory

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// BenchmarkVerify: one verification pass over 10 000 claims, batched (one
// batched direct get per DefaultVerifyBatch claims) and per key (one KV get
// each, as on a server without batched reads); ns/claim is the pass's wall
// time per claim, cpu-ns/claim the process's CPU time (client and embedded
// server) per claim.
func BenchmarkVerify(b *testing.B) {
	for _, perKey := range []bool{false, true} {
		b.Run(map[bool]string{false: "batched", true: "per-key"}[perKey], func(b *testing.B) {
			s := natstest.RunServer(b)
			nc := natstest.Connect(b, s)
			ctx := context.Background()
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			mb := joinEcho(b, ctx, nc, "a")
			d, err := Open(ctx, Config{Conn: nc, Members: mb, VerifyInterval: time.Hour, perKey: perKey, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			const claims = 10000
			claimMany(b, ctx, d, claims, mb.Self().Node)
			b.ResetTimer()
			cpu := natstest.ProcessCPU()
			for range b.N {
				d.verify()
			}
			b.StopTimer()
			cpu = natstest.ProcessCPU() - cpu
			if d.Owned() != claims {
				b.Fatalf("%d claims held after the passes, want %d", d.Owned(), claims)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*claims), "ns/claim")
			if cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*claims), "cpu-ns/claim")
			}
		})
	}
}

// BenchmarkUpkeep: the verifier's steady-state work per interval (one look
// at the stream and one rotating sweep batch; changes arrive through the
// watch) with 1 000 and 20 000 claims held: cpu-µs/interval must not grow
// with the claims, as the per-claim passes of BenchmarkVerify do.
func BenchmarkUpkeep(b *testing.B) {
	for _, claims := range []int{1000, 20000, 300000} {
		b.Run(fmt.Sprintf("claims=%d", claims), func(b *testing.B) {
			s := natstest.RunServer(b)
			nc := natstest.Connect(b, s)
			ctx := context.Background()
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			mb := joinEcho(b, ctx, nc, "a")
			d, err := Open(ctx, Config{Conn: nc, Members: mb, VerifyInterval: time.Hour, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			claimMany(b, ctx, d, claims, mb.Self().Node)
			b.ResetTimer()
			cpu := natstest.ProcessCPU()
			for range b.N {
				if d.streamChanged() {
					b.Fatal("stream reported changed")
				}
				d.sweep()
			}
			b.StopTimer()
			cpu = natstest.ProcessCPU() - cpu
			if cpu > 0 {
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/interval")
			}
		})
	}
}
