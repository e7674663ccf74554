package hub

import (
	"time"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Windowed lanes, the receiving side (DESIGN §4, docs/protocol.md). A sender
// may have up to W legs of one lane in flight; each carries HeaderLane
// "<epoch>/<seq>". An activation keeps, per sending lane (sender, stream),
// the epoch it is in and the next sequence number it expects, and accepts a
// lane's legs only in that sequence, under the activation's lock, in the same
// critical section as the enqueue — so the order of acceptance is the order
// of the lane:
//
//   - seq 1 starts an epoch: it is accepted (if otherwise acceptable) and
//     replaces whatever epoch the lane was in. A sender starts a new epoch
//     only when everything ahead of that leg is settled, so nothing of an
//     older epoch can still be due ahead of it;
//   - seq n > 1 is accepted only in the lane's current epoch with n the
//     next expected; anything else — a gap after a refused or lost leg, an
//     older epoch, or a lane the activation holds no state for — is refused
//     verdict.ErrOutOfOrder (resendable: nothing was accepted). The sender
//     re-sends from its first unaccepted delivery, in order, in a new epoch.
//
// A refused leg does not advance the lane, so every leg behind it in the
// same epoch is refused too: no later delivery overtakes an earlier one. A
// duplicate (its ID in the dedupe window) is answered Accepted before this
// check without touching the lane; the next new leg of that epoch may then
// be refused out of order, which costs the sender one more round trip,
// never a duplicate or an inversion.
//
// The state is bounded: an activation keeps at most maxLaneStates lanes,
// drops those idle longer than laneIdle when it needs room (then, if still
// full, an arbitrary one), and loses them all when it is collected. A leg
// arriving for a lane whose state is gone is refused out of order unless it
// starts an epoch; its sender starts one. Eviction therefore costs at most
// a round trip, and is safe: a new epoch starts only when everything ahead
// of it is settled at the sender.
const (
	maxLaneStates = 1024
	laneIdle      = time.Minute
)

// laneID is a sending lane as the receiver sees it. sender is the sender's
// "name.gen" (or, for a sender that gives none, "~" + its epoch, so that
// such lanes never share state).
type laneID struct {
	sender string
	stream subjects.Stream
}

// laneState is a sending lane's position at an activation (about 100 bytes
// plus the key's strings).
type laneState struct {
	epoch string
	next  uint64
	used  time.Time
}

func laneOf(e *entry) laneID {
	if e.Sender == "" {
		return laneID{sender: "~" + e.epoch, stream: e.Stream}
	}
	return laneID{sender: e.Sender, stream: e.Stream}
}

// laneCheckLocked refuses e if it is out of its lane's sequence. Called
// with a.mu held, before the enqueue; laneAdvanceLocked records it once it
// is enqueued.
func (a *activation) laneCheckLocked(e *entry) error {
	if e.seq <= 1 {
		return nil
	}
	st := a.lanes[laneOf(e)]
	switch {
	case st == nil:
		return verdict.New(verdict.ReasonOutOfOrder, "%s holds no state for lane (%s, %q) at epoch %s seq %d (evicted, or a new activation): start a new epoch", a.addr, e.Sender, e.Stream, e.epoch, e.seq)
	case st.epoch != e.epoch:
		return verdict.New(verdict.ReasonOutOfOrder, "lane (%s, %q) of %s is in epoch %s, not %s", e.Sender, e.Stream, a.addr, st.epoch, e.epoch)
	case st.next != e.seq:
		return verdict.New(verdict.ReasonOutOfOrder, "lane (%s, %q) of %s expects seq %d of epoch %s, not %d", e.Sender, e.Stream, a.addr, st.next, e.epoch, e.seq)
	}
	return nil
}

// laneAdvanceLocked records that e, checked by laneCheckLocked, was
// enqueued. Called with a.mu held.
func (a *activation) laneAdvanceLocked(e *entry, now time.Time) {
	if e.seq == 0 {
		return
	}
	id := laneOf(e)
	st := a.lanes[id]
	if st == nil {
		if a.lanes == nil {
			a.lanes = map[laneID]*laneState{}
		}
		if len(a.lanes) >= maxLaneStates {
			a.evictLanesLocked(now)
		}
		st = &laneState{}
		a.lanes[id] = st
	}
	st.epoch, st.next, st.used = e.epoch, e.seq+1, now
}

// evictLanesLocked makes room for one lane state: it drops the idle ones,
// or an arbitrary one if none is idle.
func (a *activation) evictLanesLocked(now time.Time) {
	for id, st := range a.lanes {
		if now.Sub(st.used) > laneIdle {
			delete(a.lanes, id)
		}
	}
	for id := range a.lanes {
		if len(a.lanes) < maxLaneStates {
			return
		}
		delete(a.lanes, id)
	}
}
