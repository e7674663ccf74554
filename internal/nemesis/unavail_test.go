package nemesis

import (
	"testing"
	"time"
)

func TestUnavailability(t *testing.T) {
	ms := int64(time.Millisecond)
	h := &History{}
	at := []int64{100, 200, 300} // then a gap of 1 s, then one every 100 ms
	for a := int64(1300); a <= 20000; a += 100 {
		at = append(at, a)
	}
	for _, a := range at {
		h.Ops = append(h.Ops, Op{Complete: a * ms, Outcome: Outcome{Verdict: Accepted}})
	}
	h.Ops = append(h.Ops, Op{Complete: 900 * ms, Outcome: Outcome{Verdict: Failed}}) // not a success
	h.Faults = []FaultRecord{
		{Fault: Fault{Kind: NodeKill}, Start: 250 * ms, End: 400 * ms},
		{Fault: Fault{Kind: LinkCut}, Start: 5000 * ms, End: 5010 * ms},
		{Fault: Fault{Kind: LinkCut}, Start: 19990 * ms, End: 19995 * ms}, // its window passes the last completion
	}
	got := Unavailability(h)
	if got[NodeKill] != time.Second || got[LinkCut] != 100*time.Millisecond {
		t.Fatalf("unavailability %v", got)
	}
}
