package nemesis

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/verdict"
)

func TestOutcomeOf(t *testing.T) {
	for _, c := range []struct {
		err        error
		v          Verdict
		reason     string
		resendable bool
		timeout    bool
	}{
		{nil, Accepted, "", false, false},
		{fmt.Errorf("leg: %w", verdict.ErrNotOwner), ShuttingDown, "not-owner", true, false},
		{verdict.ErrOutcomeUnknown, Failed, "outcome-unknown", false, false},
		{verdict.ErrInboxFull, Ignored, "inbox-full", false, false},
		{verdict.ErrNoPlacement, Unavailable, "no-placement", true, false},
		{verdict.ErrDeadlineUnsent, Unavailable, "deadline-unsent", true, false}, // not a timeout
		{fmt.Errorf("no response: %w", context.DeadlineExceeded), Failed, "timeout", false, true},
		{errors.Join(verdict.ErrNotOwner, nats.ErrTimeout), Failed, "not-owner", false, true},
		{errors.New("mystery"), Failed, "other", false, false},
	} {
		o := OutcomeOf(c.err)
		if o.Verdict != c.v || o.Reason != c.reason || o.Resendable != c.resendable || o.Timeout != c.timeout {
			t.Errorf("OutcomeOf(%v) = %+v, want %v %q resendable=%v timeout=%v", c.err, o, c.v, c.reason, c.resendable, c.timeout)
		}
	}
}

func TestParseTurnLog(t *testing.T) {
	var log strings.Builder
	log.WriteString("meshd: node n1.4 serving on NATS at nats://x\n")
	log.Write(TurnEvent{Event: TurnStart, N: 1, Node: "n1", Generation: 4, Activation: 2, Address: "k/1", Stream: "s", ID: "a", Attempt: 1, At: 10}.Line())
	log.Write(TurnEvent{Event: TurnStart, N: 2, Node: "n1", Generation: 4, Activation: 3, Address: "k/2", ID: "b", Attempt: 2, At: 11}.Line())
	log.Write(TurnEvent{Event: TurnEnd, N: 1, NoEffect: true, At: 12}.Line())
	turns, err := ParseTurnLog("n1#0", strings.NewReader(log.String()))
	if err != nil {
		t.Fatal(err)
	}
	want := []Turn{
		{Process: "n1#0", Node: "n1", Generation: 4, Activation: 2, Address: "k/1", Stream: "s", ID: "a", Attempt: 1, Start: 10, End: 12, NoEffect: true},
		{Process: "n1#0", Node: "n1", Generation: 4, Activation: 3, Address: "k/2", ID: "b", Attempt: 2, Start: 11}, // died mid-turn
	}
	if !reflect.DeepEqual(turns, want) {
		t.Fatalf("turns\n%+v\nwant\n%+v", turns, want)
	}
	for _, bad := range []string{
		string(TurnEvent{Event: TurnEnd, N: 1, At: 12}.Line()),
		string(TurnEvent{Event: TurnStart, N: 1}.Line()) + string(TurnEvent{Event: TurnStart, N: 1}.Line()),
		`{"turn":"start","n":` + "\n",
		`{"turn":"middle","n":1}` + "\n",
	} {
		if _, err := ParseTurnLog("p", strings.NewReader(bad)); err == nil {
			t.Errorf("ParseTurnLog(%q): no error", bad)
		}
	}
}

func TestHistoryJSON(t *testing.T) {
	r := NewRecorder(7, 100)
	i := r.Invoke(Op{ID: "a", Kind: KVSet, Address: "k/1", Value: "v", Invoke: 101})
	r.Complete(i, 105, Outcome{Verdict: ShuttingDown, Resendable: true, Reason: "not-owner"})
	r.AddLate(Late{ID: "a", At: 106, Outcome: Outcome{Verdict: Failed}})
	r.AddFault(FaultRecord{Fault: Fault{Kind: NodeKill, Target: 1, Hold: time.Second}, Start: 102, End: 103})
	r.Exit("n1#0", 104)
	h := r.Finish(200, []Turn{{Process: "n1#0", ID: "a", Start: 102}})
	path := filepath.Join(t.TempDir(), "h.json")
	if err := h.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h, back) {
		t.Fatalf("round trip\n%+v\nwant\n%+v", back, h)
	}
}

func TestGenerate(t *testing.T) {
	cfg := ScheduleConfig{Seed: 42, Duration: 2 * time.Minute, Nodes: 3, Servers: 3, FreezePast: 5 * time.Second}
	a, err := Generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("one seed, two schedules:\n%v\n%v", a, b)
	}
	cfg.Seed = 43
	c, _ := Generate(cfg)
	if reflect.DeepEqual(a.Faults, c.Faults) {
		t.Fatalf("seeds 42 and 43 gave the same schedule:\n%v", a)
	}
	t.Logf("%v", a)
	if len(a.Faults) < len(AllFaultKinds) {
		t.Fatalf("%d faults in 2 minutes", len(a.Faults))
	}
	seen := map[FaultKind]bool{}
	for i, f := range a.Faults {
		if i < len(AllFaultKinds) {
			seen[f.Kind] = true
		}
		if f.At >= cfg.Duration || i > 0 && f.At < a.Faults[i-1].At+a.Faults[i-1].Hold {
			t.Errorf("fault %d at %v (previous %v)", i, f.At, a.Faults[max(i-1, 0)])
		}
		n := cfg.Servers
		if f.Kind.OnNode() {
			n = cfg.Nodes
		}
		if f.Target < 0 || f.Target >= n {
			t.Errorf("fault %v: target out of range", f)
		}
		if f.Kind == NodeFreeze && f.Hold < cfg.FreezePast {
			t.Errorf("fault %v: frozen for less than %v", f, cfg.FreezePast)
		}
	}
	if len(seen) != len(AllFaultKinds) {
		t.Errorf("the first %d faults cover %v, want every kind", len(AllFaultKinds), seen)
	}
	only, _ := Generate(ScheduleConfig{Seed: 1, Duration: time.Minute, Nodes: 2, Servers: 3, Kinds: []FaultKind{LinkCut}})
	for _, f := range only.Faults {
		if f.Kind != LinkCut {
			t.Errorf("kinds [link-cut] gave %v", f)
		}
	}
	if _, err := Generate(ScheduleConfig{Seed: 1, Duration: time.Minute, Nodes: 2, Servers: 3, Kinds: []FaultKind{"meteor"}}); err == nil {
		t.Error("an unknown kind: no error")
	}
	if _, err := Generate(ScheduleConfig{Seed: 1, Duration: time.Minute, Servers: 3}); err == nil {
		t.Error("no nodes: no error")
	}
	if ks, err := ParseFaultKinds("node-kill, link-cut"); err != nil || !reflect.DeepEqual(ks, []FaultKind{NodeKill, LinkCut}) {
		t.Errorf("ParseFaultKinds = %v, %v", ks, err)
	}
	if _, err := ParseFaultKinds("node-kill,meteor"); err == nil {
		t.Error("ParseFaultKinds(meteor): no error")
	}
}
