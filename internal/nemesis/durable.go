package nemesis

import (
	"fmt"
	"time"
)

// CheckDurable checks that acknowledged durable writes survive (DESIGN
// §7a, §11): each register's read-back (Op.Final, made after every node
// process was killed and started again, so its value came from the
// bucket) returns the value of a write that may be the register's last —
// never a value nobody wrote, never the empty register once a write was
// acknowledged, and never a write that a later acknowledged write
// overwrote (one invoked after it completed). A write whose outcome is
// unknown may be the last whatever came after it (the checker cannot
// tell when it took effect); a cas answered "fail" wrote nothing. Where a
// read-back alone is linearizable with the rest, kv-linearizable also
// holds it; this check says which write was lost. It judges the
// registers read back; a register whose every read-back failed is a
// violation (nothing could be read after the restart).
func CheckDurable(h *History) Finding {
	type reg struct {
		writes []Op // acknowledged or unknown writes
		finals []Op // Accepted read-backs
		tried  int  // read-backs attempted
	}
	regs := map[string]*reg{}
	get := func(a string) *reg {
		if regs[a] == nil {
			regs[a] = &reg{}
		}
		return regs[a]
	}
	for _, op := range h.Ops {
		switch {
		case op.Final && op.Kind == KVGet:
			r := get(op.Address)
			r.tried++
			if op.Verdict == Accepted {
				r.finals = append(r.finals, op)
			}
		case op.Kind == KVSet || op.Kind == KVCas:
			switch {
			case op.Verdict == Accepted && op.Output != KVOK: // a cas that failed, or a set refused by its hub
			case op.Verdict != Accepted && op.Resendable: // the callee holds nothing
			default:
				get(op.Address).writes = append(get(op.Address).writes, op)
			}
		}
	}
	var out []Violation
	n := 0
	for _, addr := range sortedKeys(regs) {
		r := regs[addr]
		if r.tried == 0 {
			continue
		}
		n++
		if len(r.finals) == 0 {
			out = append(out, Violation{Check: "durable-writes", Address: addr,
				Detail: fmt.Sprintf("none of %d read-backs after the restart was accepted", r.tried)})
			continue
		}
		for _, f := range r.finals {
			if d := durableVerdict(h, r.writes, f.Output); d != "" {
				out = append(out, Violation{Check: "durable-writes", Address: addr, ID: f.ID, Detail: d})
			}
		}
	}
	return Finding{Checked: n, Violations: out}
}

// durableVerdict says why a read-back value v of a register with the given
// writes (acknowledged or unknown) is not a possible last value, or "".
func durableVerdict(h *History, writes []Op, v string) string {
	acked := func(w Op) bool { return w.Verdict == Accepted }
	if v == "" {
		for _, w := range writes {
			if acked(w) {
				return fmt.Sprintf("read back empty, although %s (%s %q) was acknowledged at %s", w.ID, w.Kind, w.Value, h.rel(w.Complete))
			}
		}
		return ""
	}
	for _, w := range writes {
		if w.Value != v {
			continue
		}
		if !acked(w) {
			return "" // its outcome is unknown: it may have been the last
		}
		for _, w2 := range writes {
			if acked(w2) && w2.Invoke > w.Complete {
				return fmt.Sprintf("read back %q, written by %s (acknowledged at %s), but %s (%s %q), invoked %v after that, was acknowledged at %s and is lost",
					v, w.ID, h.rel(w.Complete), w2.ID, w2.Kind, w2.Value, time.Duration(w2.Invoke-w.Complete).Round(time.Millisecond), h.rel(w2.Complete))
			}
		}
		return ""
	}
	return fmt.Sprintf("read back %q, which no write of this register wrote", v)
}
