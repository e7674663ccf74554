package daemon

import (
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestMetricsLeaveSubscribersOut: a subscriber's joins and departures (each
// meshctl subscribe) do not count as membership events.
func TestMetricsLeaveSubscribersOut(t *testing.T) {
	t.Parallel()
	m := newDepartureMetrics()
	node := membership.Member{Node: subjects.NodeID{Name: "n1", Generation: 1}}
	sub := membership.Member{Node: subjects.NodeID{Name: "meshctl-1", Generation: 2}, Subscriber: true}
	for _, e := range []membership.Event{
		{Type: membership.Joined, Member: node}, {Type: membership.Joined, Member: sub},
		{Type: membership.Left, Member: sub}, {Type: membership.Left, Member: node},
	} {
		m.observe(e)
	}
	for _, typ := range []string{"joined", "left"} {
		var v dto.Metric
		if err := m.events.WithLabelValues(typ).Write(&v); err != nil {
			t.Fatal(err)
		}
		if got := v.GetCounter().GetValue(); got != 1 {
			t.Errorf("%s = %v, want 1", typ, got)
		}
	}
}
