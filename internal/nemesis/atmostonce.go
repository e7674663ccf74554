package nemesis

import (
	"fmt"
	"slices"
)

// CheckAtMostOnce checks, per delivery ID, that a delivery whose final
// verdict was Accepted and that is not Idempotent ran at most once, and
// that a delivery whose final verdict was resendable (the mesh's word that
// the callee holds nothing) never ran — but for turns whose handler itself
// reported that it persisted nothing (Turn.NoEffect: the resendable verdict
// is the handler's own, and true).
//
// A run that the sender could not know of is excused: one that started on
// a node whose link was cut or that was frozen (from PartitionGrace before
// the fault to its end), on a generation other than the one whose answer
// the sender took — the node ran the delivery before it noticed it was cut
// off and its answer was lost, the at-least-once window DESIGN §6
// documents; likewise one that started on a node killed just after
// (inCrashWindow): its acceptance reply died in the process's buffer; and
// one that started beyond a route cut that isolated the sender, just before
// it (beyondSenderCut): its acceptance reply was lost to the cut. The
// same generation running a delivery twice is never excused. It judges
// deliveries.
func CheckAtMostOnce(h *History) Finding {
	turns := h.turnsByID()
	late := h.lateByID()
	f := Finding{Checked: len(h.Ops)}
	for _, op := range h.Ops {
		ts := turns[op.ID]
		fin := final(op, late)
		// unseen: turns the sender cannot have known of, or that the
		// caller's own re-send caused after the accepting generation may
		// have gone.
		unseen := func(t Turn) bool {
			return (h.inPartitionWindow(t) || h.inCrashWindow(t) || h.beyondSenderCut(t)) && (fin.Verdict != Accepted || fmt.Sprintf("%s.%d", t.Node, t.Generation) != op.Node) ||
				h.resentPastOwner(op, t)
		}
		var v Violation
		var seen []Turn
		switch {
		case fin.Verdict == Accepted && !op.Idempotent && len(ts) > 1:
			for _, t := range ts {
				if !unseen(t) {
					seen = append(seen, t)
				}
			}
			v = Violation{Check: "at-most-once", Address: op.Address, Stream: op.Stream, ID: op.ID,
				Detail: fmt.Sprintf("accepted once, ran %d times: %s", len(ts), h.describeTurns(ts))}
			switch {
			case len(seen) > 1:
				f.Violations = append(f.Violations, v)
			case slices.ContainsFunc(ts, func(t Turn) bool { return h.resentPastOwner(op, t) }):
				v.Detail += " (the caller's own re-send reached a successor after a fault hit the generation that accepted it: the dedupe window is that generation's memory)"
				f.Excused = append(f.Excused, v)
			default:
				v.Detail += " (the extra run was on a node cut off, frozen or killed as it ran it: the at-least-once window of a partition or a crash)"
				f.Excused = append(f.Excused, v)
			}
		case fin.Resendable && hadEffect(ts):
			for _, t := range ts {
				if !t.NoEffect && !unseen(t) {
					seen = append(seen, t)
				}
			}
			v = Violation{Check: "at-most-once", Address: op.Address, Stream: op.Stream, ID: op.ID,
				Detail: fmt.Sprintf("resendable verdict %s (%s) for a delivery whose handler ran: %s", fin.Verdict, fin.Reason, h.describeTurns(ts))}
			if len(seen) > 0 {
				f.Violations = append(f.Violations, v)
			} else {
				v.Detail += " (it ran on a node cut off, frozen or killed as it ran it: the at-least-once window of a partition or a crash)"
				f.Excused = append(f.Excused, v)
			}
		}
	}
	return f
}

// resentPastOwner reports whether t is a run of op's own re-send (the
// caller sent the ID again after its Accepted: Op.Resent) on a generation
// other than the one that accepted it, after a fault that can have ended
// that generation (killed, frozen, drained, cut off) hit its process
// between op's invoke and t: the dedupe window is the accepting
// generation's memory, and a successor never saw the ID (DESIGN notes,
// "What dedupe cannot cover"). Likewise when the sender itself was cut
// off (its server isolated: FaultRecord.SenderCut) between the re-send and
// t: meeting no responders at the accepting node, it dropped that owner
// from its cache, and once the address's idle activation was collected
// there (releasing its claim), the re-send was placed afresh — on another
// node, whose intake never saw the ID. A re-send that reached a successor
// while the accepting generation and the sender's path to it were
// untouched is not excused.
func (h *History) resentPastOwner(op Op, t Turn) bool {
	if op.Resent == 0 || op.Verdict != Accepted || t.Start < op.Resent || fmt.Sprintf("%s.%d", t.Node, t.Generation) == op.Node {
		return false
	}
	for _, f := range h.Faults {
		if f.SenderCut && f.Start <= t.Start && f.End >= op.Resent {
			return true
		}
	}
	procs := map[string]bool{}
	for _, o := range h.Turns {
		if fmt.Sprintf("%s.%d", o.Node, o.Generation) == op.Node {
			procs[o.Process] = true
		}
	}
	for _, f := range h.Faults {
		if f.Start > t.Start || f.End < op.Invoke {
			continue
		}
		for p := range procs {
			if f.hits(p) {
				return true
			}
		}
	}
	for p := range procs {
		if e, ok := h.Exits[p]; ok && e >= op.Invoke && e <= t.Start {
			return true
		}
	}
	return false
}

// hadEffect reports whether any of ts ran without reporting that it
// persisted nothing.
func hadEffect(ts []Turn) bool {
	for _, t := range ts {
		if !t.NoEffect {
			return true
		}
	}
	return false
}
