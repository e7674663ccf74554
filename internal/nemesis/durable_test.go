package nemesis

import "testing"

// TestDurable pins each rule of CheckDurable both ways.
func TestDurable(t *testing.T) {
	set := func(id string, at int64, o Outcome) Op {
		if o.Verdict == Accepted {
			o.Output = KVOK
		}
		return Op{ID: id, Kind: KVSet, Address: "k", Value: id, Invoke: ms(at), Complete: ms(at + 5), Outcome: o}
	}
	cas := func(id, expect string, at int64, out string) Op {
		o := accepted()
		o.Output = out
		return Op{ID: id, Kind: KVCas, Address: "k", Expect: expect, Value: id, Invoke: ms(at), Complete: ms(at + 5), Outcome: o}
	}
	final := func(id, v string, at int64, o Outcome) Op {
		if o.Verdict == Accepted {
			o.Output = v
		}
		return Op{ID: id, Kind: KVGet, Address: "k", Final: true, Invoke: ms(at), Complete: ms(at + 5), Outcome: o}
	}
	unknown := Outcome{Verdict: Failed, Reason: "outcome-unknown"}
	gone := Outcome{Verdict: ShuttingDown, Reason: "not-owner", Resendable: true}
	h := func(ops ...Op) *History { return &History{Ops: ops} }

	// The last acknowledged write survives: ok.
	expect(t, CheckDurable, h(set("w1", 0, accepted()), set("w2", 10, accepted()), final("f", "w2", 100, accepted())))
	// Two overlapping acknowledged writes: either may be last.
	expect(t, CheckDurable, h(set("w1", 0, accepted()), set("w2", 2, accepted()), final("f", "w1", 100, accepted())))
	// An older acknowledged value after a later acknowledged write: lost.
	expect(t, CheckDurable, h(set("w1", 0, accepted()), set("w2", 10, accepted()), final("f", "w1", 100, accepted())), "w2")
	// Empty after an acknowledged write: lost.
	expect(t, CheckDurable, h(set("w1", 0, accepted()), final("f", "", 100, accepted())), "read back empty")
	// Empty with no acknowledged write (the only one unknown or refused resendable): ok.
	expect(t, CheckDurable, h(set("w1", 0, unknown), set("w2", 10, gone), final("f", "", 100, accepted())))
	// An unknown write may be the last, even after an acknowledged one.
	expect(t, CheckDurable, h(set("w1", 0, unknown), set("w2", 10, accepted()), final("f", "w1", 100, accepted())))
	// A value nobody wrote, or one only a resendable refusal carried.
	expect(t, CheckDurable, h(set("w1", 0, accepted()), final("f", "zz", 100, accepted())), "no write")
	expect(t, CheckDurable, h(set("w1", 0, accepted()), set("w2", 10, gone), final("f", "w2", 100, accepted())), "no write")
	// A cas that failed wrote nothing; one that succeeded is a write.
	expect(t, CheckDurable, h(set("w1", 0, accepted()), cas("c1", "x", 10, KVFail), final("f", "c1", 100, accepted())), "no write")
	expect(t, CheckDurable, h(set("w1", 0, accepted()), cas("c1", "w1", 10, KVOK), final("f", "c1", 100, accepted())))
	expect(t, CheckDurable, h(set("w1", 0, accepted()), cas("c1", "w1", 10, KVOK), final("f", "w1", 100, accepted())), "c1")
	// No read-back accepted at all: nothing could be read after the restart.
	expect(t, CheckDurable, h(set("w1", 0, accepted()), final("f", "", 100, unknown)), "none of 1 read-backs")
	// A register without read-backs is not judged.
	if f := CheckDurable(h(set("w1", 0, accepted()))); f.Checked != 0 {
		t.Errorf("judged %d registers without a read-back", f.Checked)
	}
}
