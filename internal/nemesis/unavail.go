package nemesis

import (
	"sort"
	"time"
)

// UnavailabilityWindow is how long after a fault is healed its effect on
// availability is still counted (Unavailability): recovery (a takeover
// after the TTL and the fencing delay, a JetStream leader election) comes
// after the heal.
const UnavailabilityWindow = 15 * time.Second

// Unavailability returns, per fault kind, the worst unavailability a fault
// of that kind caused: for each fault, the longest stretch of time inside
// [its start, its end + UnavailabilityWindow] in which no operation of the
// workload completed Accepted, starting at the fault's start (or the last
// completion before it). It is a measure, not a check: a workload that
// pauses (the end of the run) shows as a gap too, so faults whose window
// reaches past the last completion are measured only up to it.
func Unavailability(h *History) map[FaultKind]time.Duration {
	var done []int64
	for _, op := range h.Ops {
		if op.Complete != 0 && op.Verdict == Accepted {
			done = append(done, op.Complete)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i] < done[j] })
	out := map[FaultKind]time.Duration{}
	if len(done) == 0 {
		return out
	}
	last := done[len(done)-1]
	for _, f := range h.Faults {
		from, to := f.Start, f.End+int64(UnavailabilityWindow)
		to = min(to, last)
		if from >= to {
			continue
		}
		// The last completion at or before from starts the first gap.
		i := sort.Search(len(done), func(i int) bool { return done[i] > from })
		prev := from
		if i > 0 {
			prev = done[i-1]
		}
		var worst int64
		for ; i < len(done) && done[i] <= to; i++ {
			worst = max(worst, done[i]-max(prev, from))
			prev = done[i]
		}
		worst = max(worst, to-max(prev, from)) // nothing completed from prev to the window's end
		if g := time.Duration(worst); g > out[f.Kind] {
			out[f.Kind] = g
		}
	}
	return out
}
