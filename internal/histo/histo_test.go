package histo

import (
	"sync"
	"testing"
	"time"
)

func TestBucketsAreCumulativeAndBoundsInclusive(t *testing.T) {
	var h H
	for _, d := range []time.Duration{-time.Second, 0, 250 * time.Microsecond, 251 * time.Microsecond, time.Second, time.Minute} {
		h.Observe(d)
	}
	s := h.Snapshot()
	if s.Count != 6 {
		t.Fatalf("count = %d", s.Count)
	}
	want := map[float64]uint64{.00025: 3, .0005: 4, 1: 5, 30: 5}
	for b, n := range want {
		if s.Buckets[b] != n {
			t.Errorf("bucket %v = %d, want %d", b, s.Buckets[b], n)
		}
	}
	if got, want := s.Sum, 61.000501; got < want-1e-6 || got > want+1e-6 {
		t.Errorf("sum = %v, want %v", got, want)
	}
	if len(s.Buckets) != len(Bounds) {
		t.Errorf("%d buckets, want %d", len(s.Buckets), len(Bounds))
	}
}

func TestConcurrentObserve(t *testing.T) {
	var h H
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				h.Observe(time.Duration(g*i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	if s := h.Snapshot(); s.Count != 8000 {
		t.Fatalf("count = %d", s.Count)
	}
}

func TestObserveAllocatesNothing(t *testing.T) {
	var h H
	if n := testing.AllocsPerRun(100, func() { h.Observe(3 * time.Millisecond) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
