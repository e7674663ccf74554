package syncstream

import (
	"context"
	"testing"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestPublishQueuesWithoutAllocating: while a subscriber's window is full,
// Publish appends the frame to the next delivery's buffer: no allocation
// per frame (only one buffer per delivery, amortized over its frames).
func TestPublishQueuesWithoutAllocating(t *testing.T) {
	o := &Owner{streams: map[subjects.Stream]*streamState{}, limit: MaxFramesBytes}
	ob := &outbox{sub: "_sub/n/x", flight: FrameWindow}
	o.streams[""] = &streamState{subs: []*outbox{ob}}
	data := make([]byte, 128)
	allocs := testing.AllocsPerRun(5000, func() { o.Publish("", data) })
	if allocs > 0.05 {
		t.Errorf("%.3f allocations per Publish, want about 0", allocs)
	}
	frames := 0
	for _, p := range ob.pending {
		if len(p) > MaxFramesBytes {
			t.Errorf("a payload of %d bytes (bound %d)", len(p), MaxFramesBytes)
		}
		fs, err := DecodeFrames(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			frames++
			if f.Version != uint64(frames) || len(f.Data) != 128 {
				t.Fatalf("frame %d: %+v", frames, f)
			}
		}
	}
	if frames != 5001 { // AllocsPerRun runs it once more
		t.Errorf("%d frames queued, want 5001", frames)
	}
}

// TestApplyWithoutAllocating: applying the frames of a delivery allocates
// nothing per frame (the handler gets each by value).
func TestApplyWithoutAllocating(t *testing.T) {
	var n int
	s := &Subscription{handler: func(Frame) { n++ }, epoch: 9, started: true, adopted: true}
	var p []byte
	for v := uint64(1); v <= 100; v++ {
		p = AppendFrames(p, Frame{Epoch: 9, Version: v, Data: []byte("0123456789")})
	}
	d := &hub.Delivery{Type: TypeFrames, Payload: p}
	if err := s.Handle(context.Background(), d); err != nil || n != 100 {
		t.Fatalf("applied %d, %v", n, err)
	}
	allocs := testing.AllocsPerRun(100, func() { _ = s.Handle(context.Background(), d) }) // stale now: dropped
	if allocs > 0 {
		t.Errorf("%.1f allocations per delivery of 100 frames, want 0", allocs)
	}
	if applied, stale, _ := s.Stats(); applied != 100 || stale != 101*100 {
		t.Errorf("applied %d, stale %d", applied, stale)
	}
}
