package nemesis

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Violation is one breach of a guarantee a checker found.
type Violation struct {
	Check   string `json:"check"`
	ID      string `json:"id,omitempty"`
	Address string `json:"addr,omitempty"`
	Stream  string `json:"stream,omitempty"`
	Detail  string `json:"detail"`
}

// String returns the violation on one line.
func (v Violation) String() string {
	var b strings.Builder
	b.WriteString(v.Check)
	if v.Address != "" {
		fmt.Fprintf(&b, " %s", v.Address)
		if v.Stream != "" {
			fmt.Fprintf(&b, "|%s", v.Stream)
		}
	}
	if v.ID != "" {
		fmt.Fprintf(&b, " id %s", v.ID)
	}
	b.WriteString(": ")
	b.WriteString(v.Detail)
	return b.String()
}

// Finding is what a check found in a history.
type Finding struct {
	// Checked is how many items it judged (turns, deliveries, operations:
	// what the check is about).
	Checked int
	// Violations breach the guarantee.
	Violations []Violation
	// Excused would be violations but for a window the design documents
	// (a process paused mid-turn, the at-least-once window of a
	// partition): not failures, listed so that a reader sees how often
	// the run hit them.
	Excused []Violation
}

// CheckFunc judges a history.
type CheckFunc func(h *History) Finding

// Checker is a named check.
type Checker struct {
	Name  string
	Check CheckFunc
}

// Options configure the checkers that need more than the history.
type Options struct {
	// OutDir receives the HTML visualization of each kv partition that is
	// not linearizable; empty means none is written (the violation says
	// so).
	OutDir string
	// KVTimeout bounds the linearizability search of one address; 0 means
	// 30 s. A search that runs out is a violation (undecided), never a
	// pass.
	KVTimeout time.Duration
}

// Checkers returns every checker, in the order the report lists them.
func Checkers(o Options) []Checker {
	return []Checker{
		{"single-activation", CheckSingleActivation},
		{"claim-current", CheckClaims},
		{"lane-order", CheckLaneOrder},
		{"at-most-once", CheckAtMostOnce},
		{"timeout-not-resent", CheckTimeoutNotResent},
		{"one-verdict", CheckOneVerdict},
		{"kv-linearizable", func(h *History) Finding { return CheckKV(h, o) }},
		{"durable-writes", CheckDurable},
		{"stream-convergence", CheckStreams},
	}
}

// Result is one checker's finding on a history.
type Result struct {
	Name string
	Finding
}

// Run runs every checker of Checkers(o) on h.
func Run(h *History, o Options) []Result {
	var out []Result
	for _, c := range Checkers(o) {
		out = append(out, Result{Name: c.Name, Finding: c.Check(h)})
	}
	return out
}

// PartitionGrace is how long before a link cut or a freeze of its node a
// turn may have started and still be in the fault's window: the acceptance
// reply of a delivery accepted just before the fault can be lost with the
// link.
const PartitionGrace = 250 * time.Millisecond

// FreezeGrace is how long after a freeze's recorded start a turn of the
// frozen process may have started and still count as running when the
// freeze began: the harness records the start just before it sends
// SIGSTOP, and the signal stops the process's threads a little later (the
// 30-minute soak, round 3: a turn logged 0.1 ms after the recorded start,
// frozen 5.4 s mid-way, was judged as started during the freeze). A stopped
// process starts nothing, and no successor starts before the fencing delay
// (seconds) has passed, so the grace excuses no turn that started after a
// successor could have.
const FreezeGrace = 50 * time.Millisecond

// inPartitionWindow reports whether t started while its process was cut
// off or frozen (or just before: PartitionGrace): the window in which a
// node runs a delivery before it notices that its link is gone, and its
// answers are lost (DESIGN §6: "the documented at-least-once window of a
// partition").
func (h *History) inPartitionWindow(t Turn) bool {
	for _, f := range h.Faults {
		if (f.cutsOff(t.Process) || f.Kind == NodeFreeze && f.Process == t.Process) &&
			f.Start-int64(PartitionGrace) <= t.Start && t.Start <= f.End {
			return true
		}
	}
	return false
}

// beyondSenderCut reports whether t started, from PartitionGrace before to
// the end of a route cut that isolated the sender's server, on a process
// on the other side (FaultRecord.cutsOffSender): its acceptance reply was
// lost to the cut. Only at-most-once excuses it: for the cluster, that
// process was not cut off, and its claims must be current.
func (h *History) beyondSenderCut(t Turn) bool {
	for _, f := range h.Faults {
		if f.cutsOffSender(t.Process) && f.Start-int64(PartitionGrace) <= t.Start && t.Start <= f.End {
			return true
		}
	}
	return false
}

// inCrashWindow reports whether t started on a process killed (NodeKill)
// from PartitionGrace before the kill to FreezeGrace after its recorded
// start (the signal lands a little after it): its acceptance reply, published
// before the turn started, may still have been in the process's buffer
// when it died — the sender saw no acceptance, the generation's departure
// made the leg resendable, and the re-send ran again on a successor. The
// at-least-once window of a crash, as inPartitionWindow's is of a partition
// (the 30-minute soak, round 3: a turn started 0.2 ms before its node's
// SIGKILL, the delivery re-sent and run on the successor 2 s later).
func (h *History) inCrashWindow(t Turn) bool {
	for _, f := range h.Faults {
		if f.Kind == NodeKill && f.Process == t.Process &&
			f.Start-int64(PartitionGrace) <= t.Start && t.Start <= f.Start+int64(FreezeGrace) {
			return true
		}
	}
	return false
}

// rel formats a Unix-ns time as an offset from the history's start.
func (h *History) rel(t int64) string {
	return (time.Duration(t - h.Start)).Round(time.Microsecond).String()
}

func (h *History) describeTurn(t Turn) string {
	end := "…" + h.rel(h.turnEnd(t)) + " (no end logged)"
	if t.End != 0 {
		end = h.rel(t.End)
	}
	noEffect := ""
	if t.NoEffect {
		noEffect = ", persisted nothing"
	}
	if t.Claim != 0 {
		noEffect = fmt.Sprintf(", claim %d", t.Claim) + noEffect
	}
	return fmt.Sprintf("%s on %s.%d (process %s, activation %d, attempt %d%s) [%s, %s]",
		t.ID, t.Node, t.Generation, t.Process, t.Activation, t.Attempt, noEffect, h.rel(t.Start), end)
}

// turnsByID returns the turns of each delivery ID, in start order.
func (h *History) turnsByID() map[string][]Turn {
	return h.turnsBy(func(t Turn) string { return t.ID })
}

// turnsByAddress returns the turns of each address, in start order.
func (h *History) turnsByAddress() map[string][]Turn {
	return h.turnsBy(func(t Turn) string { return t.Address })
}

// turnsBy groups the history's turns by key, each group in start order.
func (h *History) turnsBy(key func(Turn) string) map[string][]Turn {
	out := map[string][]Turn{}
	for _, t := range h.Turns {
		out[key(t)] = append(out[key(t)], t)
	}
	for _, ts := range out {
		sort.SliceStable(ts, func(i, j int) bool { return ts[i].Start < ts[j].Start })
	}
	return out
}

// lateByID returns the late verdicts of each delivery ID.
func (h *History) lateByID() map[string][]Late {
	out := map[string][]Late{}
	for _, l := range h.Late {
		out[l.ID] = append(out[l.ID], l)
	}
	return out
}

// final returns op's final outcome: its first late verdict if it has one,
// else what its call returned.
func final(op Op, late map[string][]Late) Outcome {
	if ls := late[op.ID]; len(ls) > 0 {
		return ls[0].Outcome
	}
	return op.Outcome
}

// CheckSingleActivation checks that no two turns of one address overlap in
// time, whichever nodes, generations or activations ran them (DESIGN §5:
// at most one live activation per address, and its handler runs one
// delivery at a time; §6: two activations never run turns at the same
// time). A turn with no end logged lasts until its process exited, or to
// the end of the history.
//
// One overlap is not a violation: a turn whose process was frozen
// (NodeFreeze) while the turn was running (or that started within
// FreezeGrace of the freeze's recorded start, before the signal landed),
// with a successor's turn starting after the freeze began. Nothing can stop a process mid-turn; the design
// answers a pause with fencing instead — the frozen turn's state save fails
// once a successor took the state over (DESIGN §7a), which CheckKV judges —
// so such pairs are excused (Finding.Excused). Likewise a turn whose
// process's links were all cut (LinkCut), or whose server was isolated
// (RouteCut), while it ran: whatever it still
// does reaches the store only through NATS, where the same fencing answers
// it (e.g. a state save in flight at the cut waits out its timeout, then
// fails outcome-unknown; its write, if it ever lands, fails the revision
// check); a turn started up to PartitionGrace after the cut counts, since
// the node could not have noticed it yet. A frozen node that starts a turn
// after the freeze began, or a cut-off one later than that, is still a
// violation. It judges turns.
func CheckSingleActivation(h *History) Finding {
	f := Finding{Checked: len(h.Turns)}
	freezes := map[string][][2]int64{} // process -> frozen intervals
	cuts := map[string][][2]int64{}    // process -> cut-off intervals
	for _, f := range h.Faults {
		switch {
		case f.Kind == NodeFreeze && f.Process != "":
			freezes[f.Process] = append(freezes[f.Process], [2]int64{f.Start, f.End})
		case f.Kind == LinkCut && f.Process != "":
			cuts[f.Process] = append(cuts[f.Process], [2]int64{f.Start, f.End})
		case f.Kind == RouteCut:
			for _, p := range f.Isolated {
				cuts[p] = append(cuts[p], [2]int64{f.Start, f.End})
			}
		}
	}
	// frozenMidTurn reports whether o's process froze, or was cut off,
	// while o ran, before t started.
	frozenMidTurn := func(o, t Turn) bool {
		for _, fz := range freezes[o.Process] {
			if o.Start <= fz[0]+int64(FreezeGrace) && fz[0] < h.turnEnd(o) && fz[0] <= t.Start {
				return true
			}
		}
		for _, c := range cuts[o.Process] {
			// A node notices a closed link within milliseconds: a turn it
			// started before it could (PartitionGrace) counts as running
			// at the cut.
			if o.Start <= c[0]+int64(PartitionGrace) && c[0] < h.turnEnd(o) && c[0] <= t.Start {
				return true
			}
		}
		return false
	}
	byAddr := h.turnsByAddress()
	for _, a := range sortedKeys(byAddr) {
		ts := byAddr[a]
		var active []Turn
		for _, t := range ts {
			keep := active[:0]
			for _, o := range active {
				if h.turnEnd(o) > t.Start {
					keep = append(keep, o)
				}
			}
			active = keep
			for _, o := range active {
				what := "turns of two activations overlap"
				same := o.Node == t.Node && o.Generation == t.Generation && o.Activation == t.Activation
				if same {
					what = "two turns of one activation overlap"
				}
				v := Violation{Check: "single-activation", Address: a, ID: t.ID,
					Detail: fmt.Sprintf("%s: %s and %s", what, h.describeTurn(o), h.describeTurn(t))}
				if !same && frozenMidTurn(o, t) {
					v.Detail = "a turn frozen or cut off mid-way overlaps a successor's: " + v.Detail
					f.Excused = append(f.Excused, v)
					continue
				}
				f.Violations = append(f.Violations, v)
			}
			active = append(active, t)
		}
	}
	return f
}

// CheckClaims checks that every turn ran under a claim naming its
// activation — ownership is the token the directory issued, never a name
// (DESIGN §5, §6) — judged from the claim revision each turn logged
// (Turn.Claim: the directory's KV revision at the claim's issue, which
// only grows across an address's claims):
//   - where any turn of the history logged a claim, every turn did: one
//     without ran under no claim (say, its activation's claim was released
//     by address under it);
//   - a claim revision belongs to one activation: two activations that ran
//     under the same claim shared it;
//   - per address, no turn starts under a claim older than one another
//     activation already started a turn under: the newer claim superseded
//     it, and its activation must not run again (the successor may be
//     running now, or may run next);
//   - no turn starts under a claim its own node's directory no longer
//     held (Turn.ClaimGone): released — by its activation only after its
//     last turn — or lost (overwritten, deleted), after which another node
//     may claim the address. A claim released by address under a newer
//     activation shows here, on the same node, whether or not another
//     node then claims the address.
//
// A turn that started on a node cut off or frozen (from PartitionGrace
// before the fault) is excused: it ran before the node could notice
// (DESIGN §6), and CheckSingleActivation judges any overlap it caused.
// It judges turns; a history with no claims logged is not judged.
func CheckClaims(h *History) Finding {
	var f Finding
	if !slices.ContainsFunc(h.Turns, func(t Turn) bool { return t.Claim != 0 }) {
		return f
	}
	f.Checked = len(h.Turns)
	type act struct {
		node       string
		gen, epoch uint64
	}
	actOf := func(t Turn) act { return act{t.Node, t.Generation, t.Activation} }
	add := func(t Turn, detail string) {
		v := Violation{Check: "claim-current", Address: t.Address, ID: t.ID, Detail: detail}
		if h.inPartitionWindow(t) {
			v.Detail += " (on a node cut off or frozen, before it could notice)"
			f.Excused = append(f.Excused, v)
			return
		}
		f.Violations = append(f.Violations, v)
	}
	byAddr := h.turnsByAddress()
	for _, a := range sortedKeys(byAddr) {
		ts := byAddr[a]
		owner := map[uint64]Turn{} // claim revision -> the first turn under it
		var newest Turn            // the first turn under the newest claim started so far
		for _, t := range ts {
			if t.Claim == 0 {
				add(t, "ran under no claim: "+h.describeTurn(t))
				continue
			}
			if t.ClaimGone {
				add(t, fmt.Sprintf("started under claim revision %d, which its node no longer held (released or lost): %s", t.Claim, h.describeTurn(t)))
			}
			if o, ok := owner[t.Claim]; ok && actOf(o) != actOf(t) {
				add(t, fmt.Sprintf("two activations ran under claim revision %d: %s and %s", t.Claim, h.describeTurn(o), h.describeTurn(t)))
			} else if !ok {
				owner[t.Claim] = t
			}
			switch {
			case newest.Claim == 0 || t.Claim > newest.Claim:
				newest = t
			case t.Claim < newest.Claim && actOf(newest) != actOf(t):
				add(t, fmt.Sprintf("started under claim revision %d after another activation ran under the newer %d: %s, after %s",
					t.Claim, newest.Claim, h.describeTurn(t), h.describeTurn(newest)))
			}
		}
	}
	return f
}

// CheckLaneOrder checks that within each lane (address, stream) the
// handlers saw the deliveries whose final verdict was Accepted in the
// caller's order (ascending Op.Seq), judged by the first turn of each: a
// delivery that ran after a later one of its lane had run is an inversion.
// It judges the sequenced, accepted deliveries that ran.
func CheckLaneOrder(h *History) Finding {
	turns := h.turnsByID()
	late := h.lateByID()
	type ran struct {
		op    Op
		start int64
	}
	lanes := map[[2]string][]ran{}
	n := 0
	for _, op := range h.Ops {
		if op.Seq == 0 || final(op, late).Verdict != Accepted {
			continue
		}
		ts := turns[op.ID]
		if len(ts) == 0 {
			continue
		}
		n++
		k := [2]string{op.Address, op.Stream}
		lanes[k] = append(lanes[k], ran{op, ts[0].Start})
	}
	keys := make([][2]string, 0, len(lanes))
	for k := range lanes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	var out []Violation
	for _, k := range keys {
		rs := lanes[k]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].start < rs[j].start })
		var top ran
		for i, r := range rs {
			if i > 0 && r.op.Seq <= top.op.Seq {
				out = append(out, Violation{Check: "lane-order", Address: k[0], Stream: k[1], ID: r.op.ID,
					Detail: fmt.Sprintf("seq %d (%s) ran at %s, after seq %d (%s) ran at %s", r.op.Seq, r.op.ID, h.rel(r.start), top.op.Seq, top.op.ID, h.rel(top.start))})
			}
			if i == 0 || r.op.Seq > top.op.Seq {
				top = r
			}
		}
	}
	return Finding{Checked: n, Violations: out}
}

func (h *History) describeTurns(ts []Turn) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = h.describeTurn(t)
	}
	return strings.Join(s, "; ")
}

// CheckTimeoutNotResent checks that a delivery whose leg timed out was
// never sent again (DESIGN §3, §4: a timed-out leg may still be held by
// its callee). Two records show it:
//   - the operation's verdict: a delivery whose verdict was a timeout ran
//     at most once, and no attempt after the one that timed out
//     (Outcome.Attempts) was accepted;
//   - the sender's own legs (History.Legs, where the run traced them): a
//     leg that timed out at attempt k was the delivery's last — no leg of
//     a later attempt was reported, and no turn of a later attempt ran,
//     whatever the final verdict was.
//
// It judges the deliveries with a timed-out verdict or leg.
func CheckTimeoutNotResent(h *History) Finding {
	turns := h.turnsByID()
	timedOutAt := map[string]int{} // delivery ID -> the first attempt whose leg timed out
	for _, l := range h.Legs {
		if l.TimedOut() && (timedOutAt[l.ID] == 0 || l.Attempt < timedOutAt[l.ID]) {
			timedOutAt[l.ID] = l.Attempt
		}
	}
	judged := map[string]bool{}
	var out []Violation
	for _, op := range h.Ops {
		if !op.Timeout {
			continue
		}
		judged[op.ID] = true
		ts := turns[op.ID]
		if len(ts) > 1 {
			out = append(out, Violation{Check: "timeout-not-resent", Address: op.Address, Stream: op.Stream, ID: op.ID,
				Detail: fmt.Sprintf("timed out after %d attempts, ran %d times: %s", op.Attempts, len(ts), h.describeTurns(ts))})
			continue
		}
		for _, t := range ts {
			if t.Attempt > op.Attempts {
				out = append(out, Violation{Check: "timeout-not-resent", Address: op.Address, Stream: op.Stream, ID: op.ID,
					Detail: fmt.Sprintf("timed out at attempt %d, then attempt %d was accepted and ran: %s", op.Attempts, t.Attempt, h.describeTurn(t))})
			}
		}
	}
	ops := map[string]Op{}
	for _, op := range h.Ops {
		ops[op.ID] = op
	}
	for _, id := range sortedKeys(timedOutAt) {
		k := timedOutAt[id]
		judged[id] = true
		op := ops[id]
		v := Violation{Check: "timeout-not-resent", Address: op.Address, Stream: op.Stream, ID: id}
		later := 0
		for _, l := range h.Legs {
			if l.ID == id && l.Attempt > k {
				later = max(later, l.Attempt)
			}
		}
		if later > 0 {
			v.Detail = fmt.Sprintf("its leg timed out at attempt %d, and the sender sent attempt %d (verdict %s)", k, later, op.Verdict)
			out = append(out, v)
			continue
		}
		for _, t := range turns[id] {
			if t.Attempt > k {
				v.Detail = fmt.Sprintf("its leg timed out at attempt %d, and attempt %d ran: %s", k, t.Attempt, h.describeTurn(t))
				out = append(out, v)
				break
			}
		}
	}
	return Finding{Checked: len(judged), Violations: out}
}

// CheckOneVerdict checks that every delivery got exactly one final verdict
// (DESIGN §5 "Answer once"): its call returned with a verdict; at most one
// late verdict came, only for a Deliver whose call returned Accepted, and
// a late verdict is a failure; no late verdict names a delivery that was
// never sent. It judges deliveries.
func CheckOneVerdict(h *History) Finding {
	late := h.lateByID()
	byID := map[string]Op{}
	var out []Violation
	for _, op := range h.Ops {
		byID[op.ID] = op
		v := func(format string, args ...any) {
			out = append(out, Violation{Check: "one-verdict", Address: op.Address, Stream: op.Stream, ID: op.ID, Detail: fmt.Sprintf(format, args...)})
		}
		if op.Complete == 0 || op.Verdict == None {
			v("no verdict: called at %s, never returned (history ends at %s)", h.rel(op.Invoke), h.rel(h.End))
		}
		ls := late[op.ID]
		if len(ls) == 0 {
			continue
		}
		switch {
		case len(ls) > 1:
			v("%d late verdicts: %s", len(ls), describeLates(ls))
		case op.Kind != Deliver:
			v("a late verdict for a %s (its verdict is what its call returned): %s", op.Kind, describeLates(ls))
		case op.Verdict != Accepted && op.Verdict != None:
			v("two final verdicts: the call returned %s (%s), then late %s", op.Verdict, op.Reason, describeLates(ls))
		case ls[0].Verdict == Accepted:
			v("a late verdict saying Accepted (late answers report failures after acceptance)")
		}
	}
	for _, id := range sortedKeys(late) {
		if _, ok := byID[id]; !ok {
			out = append(out, Violation{Check: "one-verdict", ID: id, Detail: fmt.Sprintf("late verdict for a delivery never sent: %s", describeLates(late[id]))})
		}
	}
	return Finding{Checked: len(h.Ops), Violations: out}
}

func describeLates(ls []Late) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = fmt.Sprintf("%s (%s)", l.Verdict, l.Reason)
	}
	return strings.Join(s, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// CheckStreams checks that every sync-stream subscription of the workload
// converged to its owner's state after the faults stopped and was still
// open (DESIGN §7: never silently stale, never closed by a fault). It
// judges the subscriptions.
func CheckStreams(h *History) Finding {
	var out []Violation
	for _, o := range h.Streams {
		switch {
		case o.Closed != "":
			out = append(out, Violation{Check: "stream-convergence", Address: o.Address,
				Detail: fmt.Sprintf("the subscription ended: %s (frames %d, resubscribes %d)", o.Closed, o.Frames, o.Resubscribes)})
		case !o.Converged:
			out = append(out, Violation{Check: "stream-convergence", Address: o.Address,
				Detail: fmt.Sprintf("mirror %v, owner %v after %v (frames %d, stale %d, resubscribes %d, writes %d)",
					o.Mirror, o.Owner, time.Duration(o.Waited).Round(time.Millisecond), o.Frames, o.Stale, o.Resubscribes, o.Writes)})
		}
	}
	return Finding{Checked: len(h.Streams), Violations: out}
}
