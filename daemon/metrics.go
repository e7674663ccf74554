package daemon

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
)

// departureMetrics count membership events and how long departures took to
// detect.
type departureMetrics struct {
	events  *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

func newDepartureMetrics() *departureMetrics {
	return &departureMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "natsmesh_membership_events_total",
			Help: "Membership events seen by this node, by type (joined, left, expired, superseded, disconnected).",
		}, []string{"type"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "natsmesh_departure_detection_seconds",
			Help:    "Time from a node's departure to its detection here, by how it was detected.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10},
		}, []string{"how"}),
	}
}

func (d *departureMetrics) observe(e membership.Event) {
	if e.Member.Subscriber {
		return // meshctl subscribe and the like are not mesh nodes
	}
	d.events.WithLabelValues(e.Type.String()).Inc()
	if e.Type.Departed() {
		d.latency.WithLabelValues(e.Type.String()).Observe(e.Latency.Seconds())
	}
}

// collector reads a node's counters on each scrape: the delivery path pays
// nothing for metrics.
type collector struct {
	node *mesh.Node

	deliveries, retries, legs, peakLegs, lanes, destinations, deepest, episodes *prometheus.Desc
	accepted, dedupe, refused, handled, late, activations, queued, deactivated  *prometheus.Desc
	ingress, breaker                                                            *prometheus.Desc
	forged, invalidEntries, overwritten                                         *prometheus.Desc
	sentAccepted, unmatched, lateReceived                                       *prometheus.Desc
}

func newCollector(n *mesh.Node) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("natsmesh_"+name, help, labels, nil)
	}
	return &collector{
		node:           n,
		deliveries:     d("deliveries_total", "Deliveries and requests sent by this node, each once by its final outcome: a request by its response (Accepted) or failure; verdict=Timeout for a timeout (the callee may hold it), apart from Failed.", "verdict"),
		sentAccepted:   d("deliveries_accepted_total", "Deliveries and requests sent by this node that a hub accepted (acceptance, not the final outcome)."),
		unmatched:      d("unmatched_answers_total", "Responses and late verdicts of requests that matched no pending call (it had ended already): counted and dropped."),
		lateReceived:   d("late_verdicts_received_total", "Late verdicts that replaced the Accepted of a delivery this node sent."),
		retries:        d("retries_total", "Re-sends after a resendable failure."),
		legs:           d("legs_in_flight", "Legs (requests) sent and not yet answered."),
		peakLegs:       d("legs_in_flight_peak", "The most legs in flight at once since start."),
		lanes:          d("lanes", "Sender lanes holding work."),
		destinations:   d("lane_destinations", "Distinct addresses among the lanes."),
		deepest:        d("deepest_lane_depth", "Deliveries in the deepest lane."),
		episodes:       d("saturation_episodes_total", "Saturation episodes opened."),
		accepted:       d("hub_accepted_total", "Deliveries accepted by this node's hubs."),
		dedupe:         d("hub_dedupe_hits_total", "Deliveries answered Accepted again from the dedupe window."),
		refused:        d("hub_refused_total", "Deliveries refused before acceptance."),
		handled:        d("hub_handled_total", "Deliveries whose handler returned."),
		late:           d("hub_late_verdicts_total", "Late verdicts sent after acceptance."),
		activations:    d("activations", "Live activations on this node."),
		queued:         d("hub_queued", "Accepted deliveries not yet handled."),
		deactivated:    d("deactivations_total", "Activations collected or closed."),
		ingress:        d("ingress_total", "Messages taken from the ingress."),
		breaker:        d("hub_breaker_refusals_total", "Deliveries refused Ignored by the storm breaker."),
		invalidEntries: d("kv_invalid_entries_total", "Registry and directory entries ignored because they did not parse or held an invalid generation (this session).", "bucket"),
		overwritten:    d("kv_own_entry_overwritten_total", "Times this node found its own registry entry or claims overwritten by another writer (this session; SECURITY.md).", "bucket"),
		forged:         d("forged_answers_total", "Late verdicts and responses dropped: not from the node generation that accepted the delivery (SECURITY.md)."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.node.Status()
	counter := func(d *prometheus.Desc, v int64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	gauge := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	names := make([]string, 0, len(s.Client.ByVerdict))
	for k := range s.Client.ByVerdict {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		counter(c.deliveries, s.Client.ByVerdict[k], k)
	}
	counter(c.retries, s.Client.Retries)
	counter(c.sentAccepted, s.Client.Accepted)
	counter(c.unmatched, s.Client.Unmatched)
	counter(c.lateReceived, s.Client.LateVerdicts)
	gauge(c.legs, s.Saturation.LegsInFlight)
	gauge(c.peakLegs, s.Saturation.PeakInFlight)
	gauge(c.lanes, s.Saturation.Lanes)
	gauge(c.destinations, s.Saturation.Destinations)
	gauge(c.deepest, s.Saturation.DeepestDepth)
	counter(c.episodes, int64(s.Saturation.Episode))
	counter(c.accepted, s.Host.Accepted)
	counter(c.dedupe, s.Host.DedupeHits)
	counter(c.refused, s.Host.Refused)
	counter(c.handled, s.Host.Handled)
	counter(c.late, s.Host.Late)
	gauge(c.activations, s.Host.Activations)
	gauge(c.queued, s.Host.Queued)
	counter(c.deactivated, s.Host.Deactivated)
	counter(c.ingress, s.Ingress)
	counter(c.breaker, s.Host.BreakerRefusals)
	counter(c.forged, s.Client.ForgedAnswers)
	if m := s.Membership; m != nil {
		counter(c.invalidEntries, m.Registry.InvalidEntries, "registry")
		counter(c.invalidEntries, m.Directory.InvalidEntries, "directory")
		counter(c.overwritten, m.Registry.Overwritten, "registry")
		counter(c.overwritten, m.Directory.Overwritten, "directory")
	}
}
