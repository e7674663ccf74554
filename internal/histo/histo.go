// Package histo is a fixed-bucket, lock-free duration histogram: the delivery
// path records into atomic counters and a metrics scrape reads a snapshot
// (package daemon turns it into a Prometheus histogram). It allocates
// nothing on Observe.
package histo

import (
	"sync/atomic"
	"time"
)

// Bounds are the upper bounds of the buckets, in seconds, shared by every
// histogram of this package: 250 µs to 30 s.
var Bounds = []float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// bounds are Bounds in nanoseconds.
var bounds = func() [len16]int64 {
	var b [len16]int64
	for i, s := range Bounds {
		b[i] = int64(s * 1e9)
	}
	return b
}()

const len16 = 16

// H is a histogram of durations. The zero value is ready; it must not be
// copied after first use. Safe for concurrent use.
type H struct {
	counts [len16 + 1]atomic.Uint64 // per bucket, the last one +Inf
	sum    atomic.Int64             // nanoseconds
}

// Observe records d (a negative d counts as 0).
func (h *H) Observe(d time.Duration) {
	ns := max(int64(d), 0)
	i := 0
	for i < len16 && ns > bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(ns)
}

// Snapshot is a histogram's state at one moment, in the shape of a
// Prometheus histogram.
type Snapshot struct {
	Count   uint64
	Sum     float64            // seconds
	Buckets map[float64]uint64 // cumulative count by upper bound (seconds)
}

// Snapshot reads h. Concurrent observations may be partly included.
func (h *H) Snapshot() Snapshot {
	s := Snapshot{Buckets: make(map[float64]uint64, len16)}
	var cum uint64
	for i := range h.counts {
		cum += h.counts[i].Load()
		if i < len16 {
			s.Buckets[Bounds[i]] = cum
		}
	}
	s.Count = cum
	s.Sum = float64(h.sum.Load()) / 1e9
	return s
}
