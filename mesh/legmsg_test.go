package mesh

import (
	"maps"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestLegMsgReuse: a pooled leg message carries exactly the headers set for
// its current leg, whatever earlier legs set (and trace context added).
func TestLegMsgReuse(t *testing.T) {
	lm := &legMsg{msg: nats.Msg{Header: nats.Header{}}}
	use := func(foreign bool, set map[int]string) {
		t.Helper()
		for i, v := range set {
			lm.set(i, v)
		}
		if foreign {
			lm.header()["traceparent"] = []string{"tp"}
		}
		got := map[string]string{}
		for k, v := range lm.ready().Header {
			if len(v) != 1 {
				t.Fatalf("header %s has %d values", k, len(v))
			}
			got[k] = v[0]
		}
		want := map[string]string{}
		for i, v := range set {
			want[legHeaderNames[i]] = v
		}
		if foreign {
			want["traceparent"] = "tp"
		}
		if !maps.Equal(got, want) {
			t.Fatalf("headers %v, want %v", got, want)
		}
		h := lm.msg.Header
		putLegMsg(lm)
		lm.msg.Header = h // the same one back, as the pool would
	}
	use(false, map[int]string{hdrID: "a", hdrAttempt: "2", hdrAnswerTo: "x", hdrLane: "e/1"})
	use(false, map[int]string{hdrID: "b", hdrAnswerTo: "x"})
	use(true, map[int]string{hdrID: "c", hdrType: "t"})
	use(false, map[int]string{hdrID: "d", hdrLane: "e/2", hdrFrom: "k/f"})
	use(false, map[int]string{hdrID: "e"})
}
