package daemon

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/natsmesh/natsmesh/internal/buildinfo"
	"github.com/natsmesh/natsmesh/internal/histo"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
)

// departureMetrics count membership events and how long departures took to
// detect.
type departureMetrics struct {
	events  *prometheus.CounterVec
	latency *prometheus.HistogramVec
	// advisories is the disconnect-advisory self-check's result
	// (probeAdvisories): 1 they arrive, 0 they do not (departures take
	// the TTL), -1 not known (not checked yet, standalone, or the probe
	// could not run).
	advisories prometheus.Gauge
}

func newDepartureMetrics() *departureMetrics {
	d := &departureMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "natsmesh_membership_events_total",
			Help: "Membership events seen by this node, by type (joined, left, expired, superseded, disconnected).",
		}, []string{"type"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "natsmesh_departure_detection_seconds",
			Help:    "Time from a node's departure to its detection here, by how it was detected.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10},
		}, []string{"how"}),
		advisories: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "natsmesh_disconnect_advisories",
			Help: "Whether the server's client-disconnect advisories reach this node (1), do not (0: a departed node is detected by the registry TTL, docs/operations.md §1), or not known yet (-1); checked once at start with a probe connection.",
		}),
	}
	d.advisories.Set(-1)
	// Every series exists from the start (at zero), so that rates and
	// dashboards see a departure kind before its first occurrence.
	for t := membership.Joined; t <= membership.Moved; t++ {
		d.events.WithLabelValues(t.String())
		if t.Departed() {
			d.latency.WithLabelValues(t.String())
		}
	}
	return d
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
	node  *mesh.Node
	nc    *nats.Conn
	build buildinfo.Info

	latency, turns, refusals, lateAnswers, selfEvents *prometheus.Desc
	buildInfo, nodeInfo, reconnects, natsConnected    *prometheus.Desc
	natsServer                                        *prometheus.Desc

	deliveries, retries, legs, peakLegs, lanes, destinations, deepest, episodes *prometheus.Desc
	accepted, dedupe, refused, handled, late, activations, queued, deactivated  *prometheus.Desc
	ingress, breaker                                                            *prometheus.Desc
	forged, invalidEntries, overwritten, badReplies                             *prometheus.Desc
	sentAccepted, unmatched, lateReceived                                       *prometheus.Desc
	inboxRefused, shareRefused, placementRefused, rateLimited                   *prometheus.Desc
	ingressHeld, ingressCallers, placementHeld, callerDeliveries                *prometheus.Desc
	reminderFires, remindersInFlight                                            *prometheus.Desc
}

func newCollector(n *mesh.Node, nc *nats.Conn) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("natsmesh_"+name, help, labels, nil)
	}
	return &collector{
		node:              n,
		nc:                nc,
		build:             buildinfo.Read(),
		latency:           d("delivery_duration_seconds", "Time from a Deliver, DeliverAsync or Request call to its final outcome, by that outcome (as natsmesh_deliveries_total; a request ends with its response).", "verdict"),
		turns:             d("hub_turn_duration_seconds", "Duration of handler turns on this node's hubs (one delivery each)."),
		refusals:          d("hub_refusals_total", "Deliveries refused before acceptance, by verdict reason.", "reason"),
		lateAnswers:       d("hub_late_answers_total", "Late verdicts sent after acceptance, by verdict reason.", "reason"),
		selfEvents:        d("node_events_total", "This node's own membership events: fenced (its generation declared gone), rejoined (under a fresh generation), superseded (a newer generation of its name took over).", "event"),
		buildInfo:         d("build_info", "Constant 1, labelled with the build: natsmesh release, module version and revision, Go, nats.go and nats-server versions.", "release", "version", "revision", "goversion", "nats_go", "nats_server"),
		nodeInfo:          d("node_info", "Constant 1, labelled with this node's identity: name, current generation, subject prefix and hosted kinds.", "name", "generation", "node", "prefix", "kinds"),
		reconnects:        d("nats_reconnects_total", "Reconnections of this node's NATS connection."),
		natsConnected:     d("nats_connected", "1 while this node's NATS connection is connected, else 0."),
		natsServer:        d("nats_server_info", "Constant 1, labelled with the NATS server this node is connected to (absent while disconnected).", "url", "server_id", "server_name"),
		deliveries:        d("deliveries_total", "Deliveries and requests sent by this node, each once by its final outcome: a request by its response (Accepted) or failure; verdict=Timeout for a timeout (the callee may hold it), apart from Failed.", "verdict"),
		sentAccepted:      d("deliveries_accepted_total", "Deliveries and requests sent by this node that a hub accepted (acceptance, not the final outcome)."),
		unmatched:         d("unmatched_answers_total", "Responses and late verdicts of requests that matched no pending call (it had ended already): counted and dropped."),
		lateReceived:      d("late_verdicts_received_total", "Late verdicts that replaced the Accepted of a delivery this node sent."),
		retries:           d("retries_total", "Re-sends after a resendable failure."),
		legs:              d("legs_in_flight", "Legs (requests) sent and not yet answered."),
		peakLegs:          d("legs_in_flight_peak", "The most legs in flight at once since start."),
		lanes:             d("lanes", "Sender lanes holding work."),
		destinations:      d("lane_destinations", "Distinct addresses among the lanes."),
		deepest:           d("deepest_lane_depth", "Deliveries in the deepest lane."),
		episodes:          d("saturation_episodes_total", "Saturation episodes opened."),
		accepted:          d("hub_accepted_total", "Deliveries accepted by this node's hubs."),
		dedupe:            d("hub_dedupe_hits_total", "Deliveries answered Accepted again from the dedupe window."),
		refused:           d("hub_refused_total", "Deliveries refused before acceptance."),
		handled:           d("hub_handled_total", "Deliveries whose handler returned."),
		late:              d("hub_late_verdicts_total", "Late verdicts sent after acceptance."),
		activations:       d("activations", "Live activations on this node."),
		queued:            d("hub_queued", "Accepted deliveries not yet handled."),
		deactivated:       d("deactivations_total", "Activations collected or closed."),
		ingress:           d("ingress_total", "Messages taken from the ingress."),
		breaker:           d("hub_breaker_refusals_total", "Deliveries refused Ignored by the storm breaker."),
		invalidEntries:    d("kv_invalid_entries_total", "Registry and directory entries ignored because they did not parse or held an invalid generation (this session).", "bucket"),
		overwritten:       d("kv_own_entry_overwritten_total", "Times this node found its own registry entry or claims overwritten by another writer (this session; SECURITY.md).", "bucket"),
		badReplies:        d("ingress_refused_total", "Ingress and control requests dropped unanswered for a reply subject under $ or the prefix (SECURITY.md)."),
		inboxRefused:      d("ingress_inbox_refused_total", "Ingress requests dropped unanswered for a reply under the nodes' inbox or another client user's (SECURITY.md, reply rules)."),
		shareRefused:      d("ingress_share_refused_total", "Ingress deliveries answered Ignored because the ingress slots or the caller's fair share of them were full."),
		placementRefused:  d("ingress_placement_refused_total", "Ingress deliveries failed no-placement at once: their caller had no placement wait left."),
		rateLimited:       d("ingress_rate_limited_total", "Ingress deliveries answered Ignored for being over their caller's rate (--ingress-caller-rate)."),
		ingressHeld:       d("ingress_slots_held", "Ingress slots held now (deliveries being forwarded)."),
		ingressCallers:    d("ingress_callers", "Callers holding ingress slots now."),
		placementHeld:     d("ingress_placement_waits_held", "Ingress deliveries waiting now for a node hosting their kind."),
		callerDeliveries:  d("ingress_caller_deliveries_total", "Ingress deliveries of the busiest callers (at most 16 named, the rest summed as caller=\"other\"), by outcome: taken (given a slot), share_full, rate_limited.", "caller", "outcome"),
		reminderFires:     d("reminder_fires_total", "Reminder fires this node's runner took, by outcome: delivered (the handler ran), retried (handed back with back-off), dropped (cancelled or replaced before delivery), failed (recorded, not retried).", "outcome"),
		remindersInFlight: d("reminder_fires_in_flight", "Reminder fires this node's runner is delivering now."),
		forged:            d("forged_answers_total", "Late verdicts and responses dropped: not from the node generation that accepted the delivery (SECURITY.md)."),
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
	counter(c.badReplies, s.IngressRefused)
	counter(c.inboxRefused, s.IngressInboxRefused)
	counter(c.reminderFires, s.Reminders.Delivered, "delivered")
	counter(c.reminderFires, s.Reminders.Retried, "retried")
	counter(c.reminderFires, s.Reminders.Dropped, "dropped")
	counter(c.reminderFires, s.Reminders.Failed, "failed")
	gauge(c.remindersInFlight, int(s.Reminders.InFlight))
	{
		sh := s.IngressShares
		counter(c.shareRefused, sh.ShareRefused)
		counter(c.placementRefused, sh.PlacementRefused)
		counter(c.rateLimited, sh.RateLimited)
		gauge(c.ingressHeld, sh.Held)
		gauge(c.ingressCallers, sh.Callers)
		gauge(c.placementHeld, sh.PlacementHeld)
		for _, b := range sh.Busiest {
			counter(c.callerDeliveries, b.Taken, b.Caller, "taken")
			counter(c.callerDeliveries, b.ShareFull, b.Caller, "share_full")
			counter(c.callerDeliveries, b.RateLimited, b.Caller, "rate_limited")
		}
	}
	lat := c.node.Client.Latencies()
	for _, k := range keys(lat) {
		histogram(ch, c.latency, lat[k], k)
	}
	if h := c.node.Host(); h != nil {
		histogram(ch, c.turns, h.TurnDurations())
	}
	for _, r := range keys(s.Host.RefusedByReason) {
		counter(c.refusals, s.Host.RefusedByReason[r], r)
	}
	for _, r := range keys(s.Host.LateByReason) {
		counter(c.lateAnswers, s.Host.LateByReason[r], r)
	}
	if m := s.Membership; m != nil {
		counter(c.selfEvents, m.Fenced, "fenced")
		counter(c.selfEvents, m.Rejoins, "rejoined")
		counter(c.selfEvents, m.Superseded, "superseded")
	}
	ch <- prometheus.MustNewConstMetric(c.buildInfo, prometheus.GaugeValue, 1,
		c.build.Release, c.build.Version, c.build.Revision, c.build.GoVersion, nats.Version, server.VERSION)
	id := c.node.ID()
	ch <- prometheus.MustNewConstMetric(c.nodeInfo, prometheus.GaugeValue, 1,
		id.Name, strconv.FormatUint(id.Generation, 10), id.String(), s.Prefix, strings.Join(s.Kinds, ","))
	if nc := c.nc; nc != nil {
		counter(c.reconnects, int64(nc.Stats().Reconnects))
		connected := nc.IsConnected()
		v := 0.0
		if connected {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.natsConnected, prometheus.GaugeValue, v)
		if connected {
			ch <- prometheus.MustNewConstMetric(c.natsServer, prometheus.GaugeValue, 1,
				nc.ConnectedUrlRedacted(), nc.ConnectedServerId(), nc.ConnectedServerName())
		}
	}
	if m := s.Membership; m != nil {
		counter(c.invalidEntries, m.Registry.InvalidEntries, "registry")
		counter(c.invalidEntries, m.Directory.InvalidEntries, "directory")
		counter(c.overwritten, m.Registry.Overwritten, "registry")
		counter(c.overwritten, m.Directory.Overwritten, "directory")
	}
}

// histogram sends a snapshot as a constant Prometheus histogram.
func histogram(ch chan<- prometheus.Metric, d *prometheus.Desc, s histo.Snapshot, labels ...string) {
	ch <- prometheus.MustNewConstHistogram(d, s.Count, s.Sum, s.Buckets, labels...)
}

// AdvisoryProbeWait bounds the disconnect-advisory self-check: on a healthy
// server the advisory follows a probe's close within milliseconds (2–6 ms
// across a cluster, docs/operations.md §1).
const AdvisoryProbeWait = 5 * time.Second

// probeAdvisories checks once that the server's client-disconnect
// advisories reach the node on cfg.AdvisorySubject (membership.
// ProbeAdvisories, with a probe connection made with the node's own
// credentials), logs the result and sets the gauge: a missing import
// is otherwise silent — the subscription is allowed and never delivers —
// and prompt failure quietly falls back to the registry TTL.
func probeAdvisories(ctx context.Context, cfg Config, url string, nc *nats.Conn, ttl time.Duration, met *departureMetrics) {
	log := cfg.Logger
	pctx, cancel := context.WithTimeout(ctx, AdvisoryProbeWait)
	defer cancel()
	probe := cfg
	probe.Name = cfg.Name + "-advisory-probe"
	start := time.Now()
	err := membership.ProbeAdvisories(pctx, nc, cfg.AdvisorySubject, func() (*nats.Conn, error) {
		return connect(probe, url, nats.NoReconnect(), nats.NoCallbacksAfterClientClose())
	})
	switch {
	case err == nil:
		met.advisories.Set(1)
		log.Info("disconnect advisories verified: a probe connection's disconnect was reported (a crashed node is detected within milliseconds)",
			"subject", cfg.AdvisorySubject, "took", time.Since(start).String())
	case ctx.Err() != nil:
		// Stopped before the answer: not known.
	case errors.Is(err, membership.ErrAdvisoriesSilent):
		met.advisories.Set(0)
		log.Warn("disconnect advisories do not arrive: a probe connection's disconnect was not reported within the wait; the account does not import them from the system account (or the server has none, or this user may not subscribe): a crashed node is detected by the registry TTL and the fencing delay, not within milliseconds (docs/operations.md §1)",
			"subject", cfg.AdvisorySubject, "ttl", ttl.String(), "wait", AdvisoryProbeWait.String())
	default:
		log.Warn("disconnect advisories: the self-check could not run", "subject", cfg.AdvisorySubject, "err", err)
	}
}
