package mesh

import (
	"log/slog"
	"sync/atomic"

	"github.com/natsmesh/natsmesh/subjects"
)

// DefaultMaxInFlight is the node-wide cap on legs in flight (DESIGN §4).
const DefaultMaxInFlight = 256

// DefaultSaturationThreshold is the legs-in-flight count that opens a
// saturation episode (DESIGN §4).
const DefaultSaturationThreshold = 64

// Saturation is a gauge of the sender, not a limiter. Every field carries
// information: together they tell breadth (many destinations, shallow lanes)
// from head-of-line blocking (one deep lane).
type Saturation struct {
	LegsInFlight int     `json:"legs_in_flight"` // legs sent and not yet answered
	PeakInFlight int     `json:"peak_in_flight"` // the most legs in flight at once since the client started
	MaxInFlight  int     `json:"max_in_flight"`  // the cap on LegsInFlight
	Lanes        int     `json:"lanes"`          // lanes holding work (in flight or waiting)
	Destinations int     `json:"destinations"`   // distinct addresses among those lanes
	Deepest      LaneKey `json:"deepest"`        // the lane with the most deliveries (in flight + waiting)
	DeepestDepth int     `json:"deepest_depth"`  // its depth
	Episode      uint64  `json:"episode"`        // saturation episodes opened so far
	Saturated    bool    `json:"saturated"`      // an episode is open now
	Threshold    int     `json:"threshold"`      // legs in flight that open an episode
}

// saturation latches episodes: one log line when legs in flight cross the
// threshold, none until they fall back to half of it (hysteresis: traffic
// hovering around the threshold is one episode, not a log line per
// crossing). Lock-free on the hot path.
type saturation struct {
	open    atomic.Bool
	episode atomic.Uint64
}

// Saturation returns the current report. It scans the lanes: O(lanes).
func (c *Client) Saturation() Saturation {
	s := Saturation{MaxInFlight: c.opts.maxInFlight, Threshold: c.opts.saturationThreshold}
	s.LegsInFlight = int(c.inFlight.Load())
	s.PeakInFlight = int(c.peakInFlight.Load())
	c.lanesMu.Lock()
	s.Lanes = len(c.lanes)
	dests := make(map[subjects.Address]struct{}, len(c.lanes))
	for k, l := range c.lanes {
		dests[k.Addr] = struct{}{}
		if l.depth() > s.DeepestDepth {
			s.DeepestDepth, s.Deepest = l.depth(), k
		}
	}
	c.lanesMu.Unlock()
	s.Destinations = len(dests)
	s.Episode, s.Saturated = c.sat.episode.Load(), c.sat.open.Load()
	return s
}

// observeInFlight is called with the new legs-in-flight count after each
// change; it opens or closes an episode on a threshold crossing. The calls
// of concurrent changes may come in any order, so an episode closes only
// if the count is still down when it is observed: a goroutine preempted
// between its change and this call (a loaded machine) once closed an
// episode with a count long gone, and the next leg opened a second
// episode within the same burst (TestSaturationEpisodes, a cold run).
func (c *Client) observeInFlight(n int64) {
	th := int64(c.opts.saturationThreshold)
	if th <= 0 {
		return
	}
	if n < th {
		if n <= th/2 && c.sat.open.Load() && c.inFlight.Load() <= th/2 {
			c.sat.open.Store(false)
		}
		return
	}
	if c.inFlight.Load() < th {
		return // a report that came late: the count is down again
	}
	if !c.sat.open.CompareAndSwap(false, true) {
		return
	}
	c.sat.episode.Add(1)
	r := c.Saturation()
	c.log.Warn("mesh sender saturated",
		slog.Uint64("episode", r.Episode),
		slog.Int64("threshold", th), // WithSaturationThreshold: legs in flight that open an episode
		slog.Int("legs_in_flight", r.LegsInFlight),
		slog.Int("max_in_flight", r.MaxInFlight),
		slog.Int("lanes", r.Lanes),
		slog.Int("destinations", r.Destinations),
		slog.Int("deepest_lane_depth", r.DeepestDepth),
		slog.String("deepest_lane_address", string(r.Deepest.Addr)),
		slog.String("deepest_lane_stream", string(r.Deepest.Stream)))
}
