package mesh

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/counterhub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/subjects"
)

// Durable hub state benchmarks (DESIGN §7a; BENCHMARKS.md, "Durable hub
// state"). Each runs against file storage on an in-process server, with the
// server's default sync (sync_interval 2 min) and with sync_interval:
// always, beside the raw JetStream KV operation it is built on. Run with
//
//	go test -run '^$' -bench 'State' -benchtime 2s ./mesh/

var syncModes = []struct {
	name string
	opt  natstest.Option
}{
	{"default-sync", func(*server.Options) {}},
	{"sync-always", func(o *server.Options) { o.SyncAlways = true }},
}

// stateBenchNode starts a one-server mesh node with the durable counter
// ("ctr"), a no-op hub ("nop") and a hub ("st") that hands its *hub.State
// to states.
func stateBenchNode(b *testing.B, s *server.Server, states chan<- *hub.State) *Node {
	nc := natstest.Connect(b, s)
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "bench", Membership: &mc, DisableControl: true}, WithSaturationThreshold(0))
	if err != nil {
		b.Fatal(err)
	}
	_ = n.Register("ctr", counterhub.Factory(counterhub.Options{}))
	_ = n.Register("bctr", counterhub.Factory(counterhub.Options{Batch: true}))
	_ = n.Register("nop", func(context.Context, subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(context.Context, *hub.Delivery) error { return nil }), nil
	})
	_ = n.Register("st", func(ctx context.Context, _ subjects.Address) (hub.Hub, error) {
		st, err := hub.LoadState(ctx)
		if err != nil {
			return nil, err
		}
		states <- st
		return hub.HandlerFunc(func(context.Context, *hub.Delivery) error { return nil }), nil
	})
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	return n
}

func stateKV(b *testing.B, s *server.Server) jetstream.KeyValue {
	js, err := jetstream.New(natstest.Connect(b, s))
	if err != nil {
		b.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), hubstate.BucketName(subjects.DefaultPrefix))
	if err != nil {
		b.Fatal(err)
	}
	return kv
}

// BenchmarkStateSave: hub.State.Save of 128 bytes (compare-and-set on the
// last revision, acknowledged by the bucket) against a raw
// jetstream.KeyValue.Update of 128 bytes on the same bucket.
func BenchmarkStateSave(b *testing.B) {
	for _, mode := range syncModes {
		b.Run(mode.name, func(b *testing.B) {
			s := natstest.RunServer(b, mode.opt)
			states := make(chan *hub.State, 1)
			n := stateBenchNode(b, s, states)
			if _, err := n.Host().Activate(context.Background(), "st/save"); err != nil {
				b.Fatal(err)
			}
			st := <-states
			kv := stateKV(b, s)
			ctx := context.Background()
			b.Run("state-save", func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				for b.Loop() {
					t0 := time.Now()
					if err := st.Save(ctx, payload128); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				reportPercentiles(b, lat)
			})
			b.Run("raw-kv-update", func(b *testing.B) {
				rev, err := kv.Put(ctx, "raw-baseline", payload128)
				if err != nil {
					b.Fatal(err)
				}
				lat := make([]time.Duration, 0, b.N)
				for b.Loop() {
					t0 := time.Now()
					if rev, err = kv.Update(ctx, "raw-baseline", payload128, rev); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				reportPercentiles(b, lat)
			})
		})
	}
}

// BenchmarkStateActivation: the first request to a fresh address (claim,
// build, respond) for the durable counter — whose build takes the state
// over (a KV get and a compare-and-set write) and whose turn saves — against
// the same for a stateless hub, and a raw KV get + create + update (what
// the counter's load and first save cost in KV operations).
func BenchmarkStateActivation(b *testing.B) {
	for _, mode := range syncModes {
		b.Run(mode.name, func(b *testing.B) {
			s := natstest.RunServer(b, mode.opt)
			n := stateBenchNode(b, s, make(chan *hub.State, 1))
			kv := stateKV(b, s)
			ctx := context.Background()
			var seq atomic.Int64
			cold := func(b *testing.B, kind, typ string) {
				lat := make([]time.Duration, 0, b.N)
				for b.Loop() {
					addr := subjects.Address(fmt.Sprintf("%s/cold-%d", kind, seq.Add(1)))
					t0 := time.Now()
					if _, err := n.Request(ctx, Delivery{To: addr, Type: typ}); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				reportPercentiles(b, lat)
			}
			b.Run("stateful-cold-request", func(b *testing.B) { cold(b, "ctr", counterhub.Inc) })
			b.Run("stateless-cold-request", func(b *testing.B) { cold(b, "nop", "") })
			b.Run("raw-kv-get-create-update", func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				for b.Loop() {
					key := fmt.Sprintf("raw-cold-%d", seq.Add(1))
					t0 := time.Now()
					if _, err := kv.Get(ctx, key); err == nil {
						b.Fatal("key exists")
					}
					rev, err := kv.Create(ctx, key, payload128[:16])
					if err != nil {
						b.Fatal(err)
					}
					if _, err := kv.Update(ctx, key, payload128[:16], rev); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				reportPercentiles(b, lat)
			})
		})
	}
}

// BenchmarkStateHotAddress: 64 concurrent callers incrementing one durable
// counter (each increment saved before its response) against 64 callers
// requesting one stateless address. A hub's turns run one at a time, so the
// stateful rate is bounded by one save round trip per delivery — unless
// the hub is a hub.Batcher that saves the increments queued together at
// once ("stateful-batched").
func BenchmarkStateHotAddress(b *testing.B) {
	for _, mode := range syncModes {
		b.Run(mode.name, func(b *testing.B) {
			s := natstest.RunServer(b, mode.opt)
			n := stateBenchNode(b, s, make(chan *hub.State, 1))
			ctx := context.Background()
			hot := func(b *testing.B, addr subjects.Address, typ string) {
				if _, err := n.Request(ctx, Delivery{To: addr, Type: typ}); err != nil { // warm
					b.Fatal(err)
				}
				runWorkers(b, 64, func(w int) error {
					_, err := n.Request(ctx, Delivery{To: addr, Stream: subjects.Stream(fmt.Sprint(w)), Type: typ})
					return err
				})
			}
			b.Run("stateful", func(b *testing.B) { hot(b, "ctr/hot", counterhub.Inc) })
			b.Run("stateful-batched", func(b *testing.B) { hot(b, "bctr/hot", counterhub.Inc) })
			b.Run("stateless", func(b *testing.B) { hot(b, "nop/hot", "") })
		})
	}
}
