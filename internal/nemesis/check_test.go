package nemesis

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ms is a time in the hand-made histories: milliseconds after the start.
func ms(n int64) int64 { return n * 1e6 }

func accepted() Outcome { return Outcome{Verdict: Accepted, Attempts: 1} }

// lane returns a sequenced delivery on lane (a, s), completed at invoke+5.
func lane(id, a, s string, seq uint64, at int64, o Outcome) Op {
	return Op{ID: id, Kind: Deliver, Address: a, Stream: s, Seq: seq, Invoke: ms(at), Complete: ms(at + 5), Outcome: o}
}

func turn(id, addr, node string, gen uint64, start, end int64) Turn {
	return Turn{Process: node + "#0", Node: node, Generation: gen, Activation: gen, Address: addr, ID: id, Attempt: 1, Start: ms(start), End: ms(end)}
}

// expect runs check on h and fails unless it found exactly want
// violations, each mentioning its substring.
func expect(t *testing.T, check CheckFunc, h *History, want ...string) {
	t.Helper()
	if h.End == 0 {
		h.End = ms(10_000)
	}
	got := check(h).Violations
	if len(got) != len(want) {
		t.Fatalf("got %d violations, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		if !strings.Contains(got[i].String(), w) {
			t.Errorf("violation %d = %q, want it to mention %q", i, got[i], w)
		}
	}
}

func TestSingleActivation(t *testing.T) {
	t.Run("good: turns one after the other across a move", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 10),
			turn("b", "k/1", "n1", 1, 10, 20), // touching is not overlapping
			turn("c", "k/1", "n2", 2, 30, 40),
			turn("x", "k/2", "n3", 3, 5, 35), // another address
		}})
	})
	t.Run("bad: two nodes' turns overlap", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 10),
			turn("b", "k/1", "n2", 2, 5, 15),
		}}, "turns of two activations overlap: a on n1.1")
	})
	t.Run("bad: two turns of one activation overlap", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 10),
			turn("b", "k/1", "n1", 1, 9, 12),
		}}, "two turns of one activation overlap")
	})
	t.Run("bad: a turn never ended and a successor ran", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 0),
			turn("b", "k/1", "n2", 2, 500, 510),
		}}, "no end logged")
	})
	freeze := FaultRecord{Fault: Fault{Kind: NodeFreeze}, Process: "n1#0", Start: ms(5), End: ms(400)}
	t.Run("good: a turn frozen mid-way while a successor ran", func(t *testing.T) {
		h := &History{Faults: []FaultRecord{freeze}, Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 401),
			turn("b", "k/1", "n2", 2, 300, 310),
			turn("c", "k/1", "n2", 2, 400, 410),
		}}
		expect(t, CheckSingleActivation, h)
		if p := CheckSingleActivation(h).Excused; len(p) != 2 || !strings.Contains(p[0].Detail, "frozen or cut off mid-way") {
			t.Fatalf("excused %v, want the two overlaps", p)
		}
	})
	t.Run("good: a turn started as the stop was landing, frozen mid-way", func(t *testing.T) {
		// The freeze's start is recorded just before SIGSTOP is sent: a
		// turn logged a moment later was running when the stop landed.
		h := &History{Faults: []FaultRecord{freeze}, Turns: []Turn{
			{ID: "a", Address: "k/1", Node: "n1", Generation: 1, Activation: 1, Attempt: 1, Process: "n1#0", Start: ms(5) + 100_000, End: ms(401)},
			turn("b", "k/1", "n2", 2, 300, 310),
		}}
		expect(t, CheckSingleActivation, h)
		if p := CheckSingleActivation(h).Excused; len(p) != 1 {
			t.Fatalf("excused %v, want the one overlap", p)
		}
	})
	t.Run("bad: a turn of the frozen process logged past the grace", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Faults: []FaultRecord{freeze}, Turns: []Turn{
			turn("a", "k/1", "n1", 1, 5+FreezeGrace.Milliseconds()+1, 401),
			turn("b", "k/1", "n2", 2, 300, 310),
		}}, "turns of two activations overlap: a on n1.1")
	})
	t.Run("bad: a frozen node starts a turn after it woke", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Faults: []FaultRecord{freeze}, Turns: []Turn{
			turn("b", "k/1", "n2", 2, 300, 500),
			turn("a", "k/1", "n1", 1, 450, 451),
		}}, "turns of two activations overlap: b on n2.2")
	})
	t.Run("bad: a turn on another node overlaps one that froze later", func(t *testing.T) {
		// n2's turn was running when n1 froze; n1's frozen turn started
		// later: the freeze does not excuse n2's.
		expect(t, CheckSingleActivation, &History{Faults: []FaultRecord{freeze}, Turns: []Turn{
			turn("b", "k/1", "n2", 2, 0, 100),
			turn("a", "k/1", "n1", 1, 4, 401),
		}}, "turns of two activations overlap: b on n2.2")
	})
	cut := FaultRecord{Fault: Fault{Kind: LinkCut}, Process: "n1#0", Start: ms(5), End: ms(400)}
	t.Run("good: a turn cut off mid-way while a successor ran", func(t *testing.T) {
		h := &History{Faults: []FaultRecord{cut}, Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 401),
			turn("b", "k/1", "n2", 2, 300, 310),
		}}
		expect(t, CheckSingleActivation, h)
		if p := CheckSingleActivation(h).Excused; len(p) != 1 || !strings.Contains(p[0].Detail, "cut off mid-way") {
			t.Fatalf("excused %v, want the overlap", p)
		}
	})
	t.Run("bad: a turn on another node overlaps one whose links were cut later", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Faults: []FaultRecord{cut}, Turns: []Turn{
			turn("b", "k/1", "n2", 2, 0, 100),
			turn("a", "k/1", "n1", 1, 4, 401),
		}}, "turns of two activations overlap: b on n2.2")
	})
	t.Run("bad: a cut-off node starts a turn after the cut", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Faults: []FaultRecord{cut}, Turns: []Turn{
			turn("b", "k/1", "n2", 2, 300, 500),
			turn("a", "k/1", "n1", 1, 450, 0),
		}}, "turns of two activations overlap: b on n2.2")
	})
	// A route cut isolates the server n1 was on: n1's link holds, yet
	// it is cut off as a link cut would; n3, on another server, is not.
	route := FaultRecord{Fault: Fault{Kind: RouteCut, Target: 1}, Isolated: []string{"n1#0"}, Start: ms(5), End: ms(400)}
	t.Run("good: a turn on an isolated server's node overlapped mid-way by a successor", func(t *testing.T) {
		h := &History{Faults: []FaultRecord{route}, Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 401),
			turn("b", "k/1", "n2", 2, 300, 310),
		}}
		expect(t, CheckSingleActivation, h)
		if p := CheckSingleActivation(h).Excused; len(p) != 1 {
			t.Fatalf("excused %v, want the overlap", p)
		}
	})
	t.Run("bad: a route cut excuses only the nodes on the isolated server", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Faults: []FaultRecord{route}, Turns: []Turn{
			turn("a", "k/1", "n3", 1, 0, 401),
			turn("b", "k/1", "n2", 2, 300, 310),
		}}, "turns of two activations overlap: a on n3.1")
	})
	t.Run("bad: an isolated node starts a turn after the cut, overlapping", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Faults: []FaultRecord{route}, Turns: []Turn{
			turn("b", "k/1", "n2", 2, 300, 500),
			turn("a", "k/1", "n1", 1, 450, 0),
		}}, "turns of two activations overlap: b on n2.2")
	})
	t.Run("good: a turn cut short by its process's death", func(t *testing.T) {
		expect(t, CheckSingleActivation, &History{Exits: map[string]int64{"n1#0": ms(100)}, Turns: []Turn{
			turn("a", "k/1", "n1", 1, 0, 0),
			turn("b", "k/1", "n2", 2, 500, 510),
		}})
	})
}

func TestLaneOrder(t *testing.T) {
	shut := Outcome{Verdict: ShuttingDown, Resendable: true, Reason: "shutting-down"}
	timeout := Outcome{Verdict: Failed, Timeout: true, Reason: "timeout", Attempts: 1}
	t.Run("good: in order, across a move, a timeout and a late failure aside", func(t *testing.T) {
		expect(t, CheckLaneOrder, &History{
			Ops: []Op{
				lane("1", "k/1", "s", 1, 0, accepted()),
				lane("2", "k/1", "s", 2, 1, timeout),
				lane("3", "k/1", "s", 3, 2, accepted()),
				lane("4", "k/1", "s", 4, 3, accepted()),
				lane("5", "k/1", "s", 5, 4, accepted()),
				lane("1b", "k/1", "other", 1, 0, accepted()),
			},
			Late: []Late{{ID: "4", Outcome: shut}},
			Turns: []Turn{
				turn("1", "k/1", "n1", 1, 10, 11),
				turn("3", "k/1", "n1", 1, 12, 13),
				turn("2", "k/1", "n1", 1, 14, 15), // timed out: may run late (protocol.md §3.4)
				turn("1b", "k/1", "n1", 1, 16, 17),
				turn("5", "k/1", "n2", 2, 30, 31),
				turn("4", "k/1", "n2", 2, 32, 33), // failed late: judged by at-most-once
				turn("3", "k/1", "n2", 2, 34, 35), // a duplicate: the first turn counts
			},
		})
	})
	t.Run("bad: an accepted delivery ran after a later one", func(t *testing.T) {
		expect(t, CheckLaneOrder, &History{
			Ops: []Op{
				lane("1", "k/1", "s", 1, 0, accepted()),
				lane("2", "k/1", "s", 2, 1, accepted()),
				lane("3", "k/1", "s", 3, 2, accepted()),
			},
			Turns: []Turn{
				turn("1", "k/1", "n1", 1, 10, 11),
				turn("3", "k/1", "n1", 1, 12, 13),
				turn("2", "k/1", "n2", 2, 14, 15),
			},
		}, "seq 2 (2) ran at 14ms, after seq 3 (3)")
	})
}

func TestAtMostOnce(t *testing.T) {
	unknown := Outcome{Verdict: Failed, Reason: "outcome-unknown"}
	notOwner := Outcome{Verdict: ShuttingDown, Resendable: true, Reason: "not-owner"}
	t.Run("good: once each; an idempotent or unknown-outcome one twice", func(t *testing.T) {
		idem := lane("i", "k/1", "", 0, 0, accepted())
		idem.Idempotent = true
		expect(t, CheckAtMostOnce, &History{
			Ops: []Op{lane("a", "k/1", "", 0, 0, accepted()), idem, lane("u", "k/1", "", 0, 0, unknown), lane("r", "k/1", "", 0, 0, notOwner)},
			Turns: []Turn{
				turn("a", "k/1", "n1", 1, 10, 11),
				turn("i", "k/1", "n1", 1, 12, 13), turn("i", "k/1", "n2", 2, 14, 15),
				turn("u", "k/1", "n1", 1, 16, 17), turn("u", "k/1", "n2", 2, 18, 19),
			},
		})
	})
	t.Run("good: a resendable verdict the handler gave, having persisted nothing", func(t *testing.T) {
		tr := turn("r", "k/1", "n1", 1, 10, 11)
		tr.NoEffect = true
		expect(t, CheckAtMostOnce, &History{Ops: []Op{lane("r", "k/1", "", 0, 0, notOwner)}, Turns: []Turn{tr}})
	})
	t.Run("bad: accepted, ran twice", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{
			Ops:   []Op{lane("a", "k/1", "", 0, 0, accepted())},
			Turns: []Turn{turn("a", "k/1", "n1", 1, 10, 11), turn("a", "k/1", "n2", 2, 20, 21)},
		}, "accepted once, ran 2 times")
	})
	cut := FaultRecord{Fault: Fault{Kind: LinkCut}, Process: "n1#0", Start: ms(500), End: ms(700)}
	acceptedBy := func(node string) Outcome { o := accepted(); o.Node = node; return o }
	t.Run("good: the extra run was on a node cut off, another generation answered", func(t *testing.T) {
		h := &History{
			Faults: []FaultRecord{cut},
			Ops:    []Op{lane("a", "k/1", "", 0, 0, acceptedBy("n2.2")), lane("r", "k/1", "", 0, 0, notOwner)},
			Turns: []Turn{
				turn("a", "k/1", "n1", 1, 400, 401), // within PartitionGrace before the cut
				turn("a", "k/1", "n2", 2, 800, 801),
				turn("r", "k/1", "n1", 1, 600, 601),
			},
		}
		expect(t, CheckAtMostOnce, h)
		if e := CheckAtMostOnce(h).Excused; len(e) != 2 {
			t.Fatalf("excused %v, want both", e)
		}
	})
	t.Run("good: the extra run was on a node whose server was isolated", func(t *testing.T) {
		route := FaultRecord{Fault: Fault{Kind: RouteCut}, Isolated: []string{"n1#0"}, Start: ms(500), End: ms(700)}
		h := &History{
			Faults: []FaultRecord{route},
			Ops:    []Op{lane("a", "k/1", "", 0, 0, acceptedBy("n2.2"))},
			Turns:  []Turn{turn("a", "k/1", "n1", 1, 600, 601), turn("a", "k/1", "n2", 2, 800, 801)},
		}
		expect(t, CheckAtMostOnce, h)
		h.Faults[0].Isolated = []string{"n3#0"}
		expect(t, CheckAtMostOnce, h, "accepted once, ran 2 times")
	})
	t.Run("crash: the extra run started as its node was killed", func(t *testing.T) {
		kill := FaultRecord{Fault: Fault{Kind: NodeKill}, Process: "n1#0", Start: ms(500), End: ms(700)}
		for _, tc := range []struct {
			start int64
			node  string // the generation whose acceptance the sender took
			bad   bool
		}{
			{400, "n2.2", false}, // within PartitionGrace before the kill
			{500, "n2.2", false}, // as the signal landed
			{500 + FreezeGrace.Milliseconds() + 10, "n2.2", true}, // after the process was dead: no excuse
			{100, "n2.2", true}, // long before the kill: its reply had left
			{480, "n1.1", true}, // the killed generation's own acceptance
		} {
			h := &History{
				Faults: []FaultRecord{kill},
				Ops:    []Op{lane("a", "k/1", "", 0, 0, acceptedBy(tc.node))},
				Turns:  []Turn{turn("a", "k/1", "n1", 1, tc.start, tc.start+1), turn("a", "k/1", "n2", 2, 800, 801)},
			}
			if tc.node == "n1.1" {
				h.Turns[1] = turn("a", "k/1", "n1", 1, 600, 601)
			}
			if tc.bad {
				expect(t, CheckAtMostOnce, h, "accepted once, ran 2 times")
			} else {
				expect(t, CheckAtMostOnce, h)
			}
		}
	})
	t.Run("bad: the generation that answered ran it twice, one run during a cut", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{
			Faults: []FaultRecord{cut},
			Ops:    []Op{lane("a", "k/1", "", 0, 0, acceptedBy("n1.1"))},
			Turns:  []Turn{turn("a", "k/1", "n1", 1, 550, 551), turn("a", "k/1", "n1", 1, 800, 801)},
		}, "accepted once, ran 2 times")
	})
	t.Run("bad: the extra run was outside the cut's window", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{
			Faults: []FaultRecord{cut},
			Ops:    []Op{lane("a", "k/1", "", 0, 0, acceptedBy("n2.2"))},
			Turns:  []Turn{turn("a", "k/1", "n1", 1, 10, 11), turn("a", "k/1", "n2", 2, 800, 801)},
		}, "accepted once, ran 2 times")
	})
	// The caller's own re-send (Op.Resent) after its Accepted from n1.1:
	// a run of it on n2 is the documented bound of dedupe only when n1's
	// process was hit by a fault that can end its generation in between.
	resent := func(at int64) Op { o := lane("q", "k/1", "", 0, 0, acceptedBy("n1.1")); o.Resent = ms(at); return o }
	kill := FaultRecord{Fault: Fault{Kind: NodeKill}, Process: "n1#0", Start: ms(30), End: ms(300)}
	t.Run("good: re-sent by the caller after its owner was killed, ran on the successor", func(t *testing.T) {
		h := &History{Faults: []FaultRecord{kill}, Ops: []Op{resent(20)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n2", 2, 400, 401)}}
		expect(t, CheckAtMostOnce, h)
		if e := CheckAtMostOnce(h).Excused; len(e) != 1 {
			t.Fatalf("excused %v, want the re-send's run", e)
		}
	})
	t.Run("good: re-sent by the caller, its owner exited before the successor ran it", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{Ops: []Op{resent(20)}, Exits: map[string]int64{"n1#0": ms(100)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n2", 2, 400, 401)}})
	})
	t.Run("bad: re-sent by the caller, its owner untouched, ran on another node", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{Ops: []Op{resent(20)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n2", 2, 400, 401)}}, "accepted once, ran 2 times")
	})
	senderCut := func(from, to int64) FaultRecord {
		return FaultRecord{Fault: Fault{Kind: RouteCut}, Isolated: []string{"n3#0"}, SenderCut: true, Start: ms(from), End: ms(to)}
	}
	t.Run("good: re-sent by the caller while it was cut off from its owner, ran on another node", func(t *testing.T) {
		h := &History{Faults: []FaultRecord{senderCut(15, 300)}, Ops: []Op{resent(20)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n2", 2, 400, 401)}}
		expect(t, CheckAtMostOnce, h)
		if e := CheckAtMostOnce(h).Excused; len(e) != 1 {
			t.Fatalf("excused %v, want the re-send's run", e)
		}
	})
	t.Run("bad: the sender was cut off only before the caller re-sent", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{Faults: []FaultRecord{senderCut(5, 15)}, Ops: []Op{resent(20)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n2", 2, 400, 401)}}, "accepted once, ran 2 times")
	})
	mesh := lane("q", "k/1", "", 0, 0, acceptedBy("n3.1")) // accepted on the sender's side of the cut
	t.Run("good: run beyond a route cut that isolated the sender, just before it; the re-send ran on the sender's side", func(t *testing.T) {
		h := &History{Faults: []FaultRecord{senderCut(15, 300)}, Ops: []Op{mesh},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 14, 15), turn("q", "k/1", "n3", 1, 400, 401)}}
		expect(t, CheckAtMostOnce, h)
		if e := CheckAtMostOnce(h).Excused; len(e) != 1 {
			t.Fatalf("excused %v, want the run beyond the cut", e)
		}
	})
	t.Run("bad: run beyond the cut long before it", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{Faults: []FaultRecord{senderCut(1000, 1300)}, Ops: []Op{mesh},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 14, 15), turn("q", "k/1", "n3", 1, 1400, 1401)}}, "accepted once, ran 2 times")
	})
	t.Run("bad: both runs beyond the cut on the sender's side, one the accepting generation", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{Faults: []FaultRecord{senderCut(15, 300)}, Ops: []Op{mesh},
			Turns: []Turn{turn("q", "k/1", "n3", 1, 14, 15), turn("q", "k/1", "n3", 1, 400, 401)}}, "accepted once, ran 2 times")
	})
	t.Run("bad: a route cut that left the sender connected", func(t *testing.T) {
		cut := senderCut(15, 300)
		cut.SenderCut = false
		expect(t, CheckAtMostOnce, &History{Faults: []FaultRecord{cut}, Ops: []Op{resent(20)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n2", 2, 400, 401)}}, "accepted once, ran 2 times")
	})
	t.Run("bad: re-sent by the caller, ran again on the owner that had accepted it", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{Faults: []FaultRecord{kill}, Ops: []Op{resent(20)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n1", 1, 25, 26)}}, "accepted once, ran 2 times")
	})
	t.Run("bad: a run on the successor before the caller re-sent", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{Faults: []FaultRecord{kill}, Ops: []Op{resent(500)},
			Turns: []Turn{turn("q", "k/1", "n1", 1, 1, 2), turn("q", "k/1", "n2", 2, 400, 401)}}, "accepted once, ran 2 times")
	})
	t.Run("bad: a resendable verdict for a delivery that ran", func(t *testing.T) {
		noEffect := turn("r", "k/1", "n1", 1, 10, 11)
		noEffect.NoEffect = true
		expect(t, CheckAtMostOnce, &History{
			Ops:   []Op{lane("r", "k/1", "", 0, 0, notOwner)},
			Turns: []Turn{noEffect, turn("r", "k/1", "n2", 2, 20, 21)},
		}, "resendable verdict ShuttingDown (not-owner) for a delivery whose handler ran")
	})
	t.Run("bad: accepted, then a resendable late verdict, but it ran", func(t *testing.T) {
		expect(t, CheckAtMostOnce, &History{
			Ops:   []Op{lane("l", "k/1", "", 0, 0, accepted())},
			Late:  []Late{{ID: "l", Outcome: Outcome{Verdict: ShuttingDown, Resendable: true, Reason: "shutting-down"}}},
			Turns: []Turn{turn("l", "k/1", "n1", 1, 10, 11)},
		}, "resendable verdict ShuttingDown (shutting-down)")
	})
}

func TestTimeoutNotResent(t *testing.T) {
	timeout := func(attempts int) Outcome {
		return Outcome{Verdict: Failed, Timeout: true, Reason: "timeout", Attempts: attempts}
	}
	at := func(tr Turn, attempt int) Turn { tr.Attempt = attempt; return tr }
	t.Run("good: the timed-out attempt ran (late) once", func(t *testing.T) {
		expect(t, CheckTimeoutNotResent, &History{
			Ops:   []Op{lane("t", "k/1", "", 0, 0, timeout(2)), lane("u", "k/1", "", 0, 0, timeout(1))},
			Turns: []Turn{at(turn("t", "k/1", "n1", 1, 10, 11), 2)},
		})
	})
	t.Run("bad: a later attempt was accepted", func(t *testing.T) {
		expect(t, CheckTimeoutNotResent, &History{
			Ops:   []Op{lane("t", "k/1", "", 0, 0, timeout(1))},
			Turns: []Turn{at(turn("t", "k/1", "n2", 2, 10, 11), 2)},
		}, "timed out at attempt 1, then attempt 2 was accepted")
	})
	t.Run("bad: it ran twice", func(t *testing.T) {
		expect(t, CheckTimeoutNotResent, &History{
			Ops:   []Op{lane("t", "k/1", "", 0, 0, timeout(1))},
			Turns: []Turn{turn("t", "k/1", "n1", 1, 10, 11), turn("t", "k/1", "n2", 2, 20, 21)},
		}, "ran 2 times")
	})
	// The sender's legs: a leg timed out, whatever the final verdict.
	leg := func(id string, attempt int, v, reason string) Leg {
		return Leg{ID: id, Attempt: attempt, Node: "n1.1", Verdict: v, Reason: reason}
	}
	t.Run("good: a refused leg, then an accepted one; a timed-out last leg", func(t *testing.T) {
		h := &History{
			Ops: []Op{lane("r", "k/1", "", 0, 0, accepted()), lane("t", "k/1", "", 0, 0, timeout(1))},
			Legs: []Leg{leg("r", 1, "ShuttingDown", "not-owner"), leg("r", 2, "Accepted", ""),
				leg("t", 1, "Failed", "timeout")},
			Turns: []Turn{at(turn("r", "k/1", "n2", 2, 10, 11), 2)},
		}
		expect(t, CheckTimeoutNotResent, h)
		if n := CheckTimeoutNotResent(h).Checked; n != 1 {
			t.Fatalf("judged %d, want 1 (t)", n)
		}
	})
	t.Run("bad: a leg timed out and the sender sent the next attempt", func(t *testing.T) {
		expect(t, CheckTimeoutNotResent, &History{
			Ops:   []Op{lane("a", "k/1", "", 0, 0, accepted())},
			Legs:  []Leg{leg("a", 1, "Failed", "timeout"), leg("a", 2, "Accepted", "")},
			Turns: []Turn{at(turn("a", "k/1", "n2", 2, 10, 11), 2)},
		}, "its leg timed out at attempt 1, and the sender sent attempt 2 (verdict Accepted)")
	})
	t.Run("bad: a leg timed out and a later attempt ran, its leg unreported", func(t *testing.T) {
		expect(t, CheckTimeoutNotResent, &History{
			Ops:   []Op{lane("a", "k/1", "", 0, 0, accepted())},
			Legs:  []Leg{leg("a", 1, "Failed", "timeout")},
			Turns: []Turn{at(turn("a", "k/1", "n2", 2, 10, 11), 3)},
		}, "its leg timed out at attempt 1, and attempt 3 ran")
	})
}

func TestOneVerdict(t *testing.T) {
	shut := Outcome{Verdict: ShuttingDown, Resendable: true, Reason: "shutting-down"}
	req := lane("q", "k/1", "", 0, 0, accepted())
	req.Kind = Request
	t.Run("good: one verdict each, one late failure of an accepted Deliver", func(t *testing.T) {
		expect(t, CheckOneVerdict, &History{
			Ops:  []Op{lane("a", "k/1", "", 0, 0, accepted()), lane("b", "k/1", "", 0, 0, accepted()), lane("c", "k/1", "", 0, 0, shut), req},
			Late: []Late{{ID: "b", Outcome: shut}},
		})
	})
	never := lane("n", "k/1", "", 0, 0, Outcome{})
	never.Complete = 0
	for _, c := range []struct {
		name string
		h    History
		want string
	}{
		{"bad: a call never returned", History{Ops: []Op{never}}, "no verdict"},
		{"bad: two late verdicts", History{Ops: []Op{lane("a", "k/1", "", 0, 0, accepted())}, Late: []Late{{ID: "a", Outcome: shut}, {ID: "a", Outcome: shut}}}, "2 late verdicts"},
		{"bad: a late verdict for a Request", History{Ops: []Op{req}, Late: []Late{{ID: "q", Outcome: shut}}}, "late verdict for a request"},
		{"bad: a late verdict after a failure", History{Ops: []Op{lane("c", "k/1", "", 0, 0, shut)}, Late: []Late{{ID: "c", Outcome: shut}}}, "two final verdicts"},
		{"bad: a late verdict saying Accepted", History{Ops: []Op{lane("a", "k/1", "", 0, 0, accepted())}, Late: []Late{{ID: "a", Outcome: accepted()}}}, "late verdict saying Accepted"},
		{"bad: a late verdict for nothing sent", History{Late: []Late{{ID: "z", Outcome: shut}}}, "never sent"},
	} {
		t.Run(c.name, func(t *testing.T) { expect(t, CheckOneVerdict, &c.h, c.want) })
	}
}

// kvOp is a kv operation on address k/1 by client c over [from, to] ms.
func kvOp(id string, c int, kind OpKind, value, expect string, from, to int64, o Outcome) Op {
	return Op{ID: id, Kind: kind, Client: c, Address: "k/1", Value: value, Expect: expect, Invoke: ms(from), Complete: ms(to), Outcome: o}
}

func answered(out string) Outcome { return Outcome{Verdict: Accepted, Output: out} }

func TestKV(t *testing.T) {
	unknown := Outcome{Verdict: Failed, Reason: "outcome-unknown"}
	timeout := Outcome{Verdict: Failed, Timeout: true, Reason: "timeout"}
	resendable := Outcome{Verdict: ShuttingDown, Resendable: true, Reason: "not-owner"}
	check := func(dir string) CheckFunc {
		return func(h *History) Finding { return CheckKV(h, Options{OutDir: dir}) }
	}
	t.Run("good", func(t *testing.T) {
		expect(t, check(""), &History{Ops: []Op{
			kvOp("g0", 0, KVGet, "", "", 0, 1, answered("")),
			kvOp("s1", 0, KVSet, "a", "", 2, 4, answered(KVOK)),
			kvOp("g1", 1, KVGet, "", "", 3, 5, answered("")), // concurrent with the set: either
			kvOp("g2", 1, KVGet, "", "", 6, 7, answered("a")),
			kvOp("c1", 0, KVCas, "b", "a", 8, 9, answered(KVOK)),
			kvOp("c2", 1, KVCas, "c", "a", 10, 11, answered(KVFail)),
			kvOp("s2", 0, KVSet, "d", "", 12, 13, unknown), // took effect, or not:
			kvOp("g3", 1, KVGet, "", "", 14, 15, answered("b")),
			kvOp("s3", 0, KVSet, "e", "", 16, 17, timeout),
			kvOp("g4", 1, KVGet, "", "", 18, 19, answered("e")),
			kvOp("g5", 1, KVGet, "", "", 20, 21, answered("d")), // s2 ran late
			kvOp("s4", 0, KVSet, "f", "", 22, 23, resendable),
			kvOp("g6", 1, KVGet, "", "", 24, 25, unknown),
			kvOp("g7", 1, KVGet, "", "", 26, 27, answered("d")),
		}})
	})
	for _, c := range []struct {
		name string
		ops  []Op
	}{
		{"bad: a stale read after an accepted set", []Op{
			kvOp("s1", 0, KVSet, "a", "", 0, 1, answered(KVOK)),
			kvOp("s2", 0, KVSet, "b", "", 2, 3, answered(KVOK)),
			kvOp("g1", 1, KVGet, "", "", 4, 5, answered("a")),
		}},
		{"bad: an accepted set that never took effect", []Op{
			kvOp("s1", 0, KVSet, "a", "", 0, 1, answered(KVOK)),
			kvOp("g1", 1, KVGet, "", "", 4, 5, answered("")),
		}},
		{"bad: a resendable set that took effect", []Op{
			kvOp("s1", 0, KVSet, "a", "", 0, 1, resendable),
			kvOp("g1", 1, KVGet, "", "", 4, 5, answered("a")),
		}},
		{"bad: a cas that succeeded on the wrong value", []Op{
			kvOp("s1", 0, KVSet, "a", "", 0, 1, answered(KVOK)),
			kvOp("c1", 1, KVCas, "c", "b", 2, 3, answered(KVOK)),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			expect(t, check(dir), &History{Ops: c.ops}, "not linearizable; visualization: "+filepath.Join(dir, "kv-k_1.html"))
			b, err := os.ReadFile(filepath.Join(dir, "kv-k_1.html"))
			if err != nil || !strings.Contains(string(b), "<html") {
				t.Fatalf("visualization: %v (%d bytes)", err, len(b))
			}
		})
	}
}

func TestClaims(t *testing.T) {
	claimed := func(tr Turn, rev uint64) Turn { tr.Claim = rev; return tr }
	t.Run("good: each activation under its own claim, newer claims later", func(t *testing.T) {
		expect(t, CheckClaims, &History{Turns: []Turn{
			claimed(turn("a", "k/1", "n1", 1, 0, 10), 5),
			claimed(turn("b", "k/1", "n1", 1, 10, 20), 5),
			claimed(turn("c", "k/1", "n2", 2, 30, 40), 9),
			claimed(turn("x", "k/2", "n3", 3, 5, 35), 2), // another address: its own revisions
		}})
	})
	t.Run("good: a history without claims is not judged", func(t *testing.T) {
		h := &History{Turns: []Turn{turn("a", "k/1", "n1", 1, 0, 10)}}
		expect(t, CheckClaims, h)
		if c := CheckClaims(h).Checked; c != 0 {
			t.Fatalf("judged %d", c)
		}
	})
	t.Run("bad: a turn under no claim", func(t *testing.T) {
		expect(t, CheckClaims, &History{Turns: []Turn{
			claimed(turn("a", "k/1", "n1", 1, 0, 10), 5),
			turn("b", "k/1", "n1", 1, 10, 20),
		}}, "ran under no claim: b on n1.1")
	})
	t.Run("bad: two activations under one claim", func(t *testing.T) {
		expect(t, CheckClaims, &History{Turns: []Turn{
			claimed(turn("a", "k/1", "n1", 1, 0, 10), 5),
			claimed(turn("b", "k/1", "n2", 2, 20, 30), 5),
		}}, "two activations ran under claim revision 5")
	})
	t.Run("bad: the superseded activation runs again", func(t *testing.T) {
		expect(t, CheckClaims, &History{Turns: []Turn{
			claimed(turn("a", "k/1", "n1", 1, 0, 10), 5),
			claimed(turn("b", "k/1", "n2", 2, 20, 30), 9),
			claimed(turn("c", "k/1", "n1", 1, 40, 50), 5),
		}}, "started under claim revision 5 after another activation ran under the newer 9: c on n1.1")
	})
	t.Run("bad: a turn under a claim its node no longer held (released by address under it)", func(t *testing.T) {
		gone := claimed(turn("b", "k/1", "n1", 2, 20, 30), 9)
		gone.ClaimGone = true
		expect(t, CheckClaims, &History{Turns: []Turn{
			claimed(turn("a", "k/1", "n1", 1, 0, 10), 5), // re-adopting a claim re-writes it: a newer revision
			gone,
		}}, "started under claim revision 9, which its node no longer held (released or lost): b on n1.")
	})
	t.Run("good: a claim gone on a node cut off, before it noticed", func(t *testing.T) {
		gone := claimed(turn("b", "k/1", "n1", 1, 20, 30), 9)
		gone.ClaimGone = true
		h := &History{
			Faults: []FaultRecord{{Fault: Fault{Kind: NodeFreeze}, Process: "n1#0", Start: ms(15), End: ms(100)}},
			Turns:  []Turn{gone},
		}
		expect(t, CheckClaims, h)
		if e := CheckClaims(h).Excused; len(e) != 1 {
			t.Fatalf("excused %v", e)
		}
	})
	t.Run("good: the superseded one ran on a node cut off, before it noticed", func(t *testing.T) {
		h := &History{
			Faults: []FaultRecord{{Fault: Fault{Kind: LinkCut}, Process: "n1#0", Start: ms(15), End: ms(100)}},
			Turns: []Turn{
				claimed(turn("a", "k/1", "n1", 1, 0, 10), 5),
				claimed(turn("b", "k/1", "n2", 2, 20, 30), 9),
				claimed(turn("c", "k/1", "n1", 1, 40, 50), 5),
			}}
		expect(t, CheckClaims, h)
		if e := CheckClaims(h).Excused; len(e) != 1 {
			t.Fatalf("excused %v", e)
		}
	})
}

// TestCheckStreams: a subscription that converged and stayed open passes;
// one that ended, or whose mirror never reached the owner's state, is a
// violation naming its address.
func TestCheckStreams(t *testing.T) {
	h := &History{Streams: []StreamOutcome{
		{Address: "kv/ok", Converged: true, Mirror: map[string]string{"k": "1"}, Owner: map[string]string{"k": "1"}},
		{Address: "kv/closed", Converged: true, Closed: "Failed (handler)"},
		{Address: "kv/stale", Mirror: map[string]string{"k": "1"}, Owner: map[string]string{"k": "2"}},
	}}
	f := CheckStreams(h)
	if f.Checked != 3 || len(f.Violations) != 2 {
		t.Fatalf("checked %d, violations %v", f.Checked, f.Violations)
	}
	if f.Violations[0].Address != "kv/closed" || f.Violations[1].Address != "kv/stale" {
		t.Errorf("violations %v", f.Violations)
	}
}
