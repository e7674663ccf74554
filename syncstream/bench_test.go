package syncstream_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
)

// BenchmarkStreamFrames: frames per second through one stream, owner and
// subscriber on two nodes of one in-process server, 128-byte payloads; the
// clock stops when the subscriber has applied every frame.
//
//	go test -run '^$' -bench StreamFrames -benchtime 20000x ./syncstream/
func BenchmarkStreamFrames(b *testing.B) {
	s := natstest.RunServer(b)
	owner, _ := startNode(b, s, "owner", false)
	var side atomic.Pointer[syncstream.Owner]
	_ = owner.Register("pub", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		o := syncstream.NewOwner(owner.Client, addr, func(subjects.Stream) []byte { return nil }, quiet)
		side.Store(o)
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			_, err := o.Handle(d)
			return err
		}), nil
	})
	sub, _ := startNode(b, s, "sub", false)
	var applied atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := syncstream.Subscribe(ctx, sub, "pub/x", "", func(syncstream.Frame) { applied.Add(1) })
	if err != nil {
		b.Fatal(err)
	}
	defer ss.Stop()
	for applied.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	o := side.Load()
	payload := make([]byte, 128)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o.Publish("", payload)
	}
	for applied.Load() < int64(b.N)+1 {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
}

// BenchmarkStreamFrameOneByOne: one frame at a time through one stream —
// published, then waited for until the subscriber applied it — so every
// frame travels alone (no batching): ns/op is the owner → subscriber
// latency of a frame, its encoding and apply path included.
//
//	go test -run '^$' -bench StreamFrameOneByOne -benchtime 5000x ./syncstream/
func BenchmarkStreamFrameOneByOne(b *testing.B) {
	s := natstest.RunServer(b)
	owner, _ := startNode(b, s, "owner", false)
	var side atomic.Pointer[syncstream.Owner]
	_ = owner.Register("pub", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		o := syncstream.NewOwner(owner.Client, addr, func(subjects.Stream) []byte { return nil }, quiet)
		side.Store(o)
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			_, err := o.Handle(d)
			return err
		}), nil
	})
	sub, _ := startNode(b, s, "sub", false)
	applied := make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := syncstream.Subscribe(ctx, sub, "pub/x", "", func(syncstream.Frame) { applied <- struct{}{} })
	if err != nil {
		b.Fatal(err)
	}
	defer ss.Stop()
	<-applied // the snapshot
	o := side.Load()
	payload := make([]byte, 128)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o.Publish("", payload)
		<-applied
	}
}
