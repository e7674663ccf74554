package hub

import (
	"container/heap"
	"time"
)

// idleQueue is the janitor's agenda: a min-heap of activations by the time
// they may next be collected, so that a collection visits only the
// activations whose idle timeout may have passed — never every activation
// the node holds (scanning them all every quarter of the idle timeout
// cost 0.5 % of a core per 100 000 held activations: BenchmarkScale).
//
// Each activation has at most one entry (activation.idleQueued). An entry
// is a lower bound: an activation used since it was queued is queued again
// at its last use when its entry comes due; one busy, building or pinned
// then is queued again a whole idle timeout later; one held explicitly
// leaves the agenda until its last hold is released. Guarded by Host.mu.
type idleQueue []idleEntry

type idleEntry struct {
	a  *activation
	at time.Time // not collectable before at + the idle timeout
}

func (q idleQueue) Len() int           { return len(q) }
func (q idleQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q idleQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *idleQueue) Push(x any)        { *q = append(*q, x.(idleEntry)) }
func (q *idleQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = idleEntry{}
	*q = old[:len(old)-1]
	return e
}

// queueIdleLocked puts a on the janitor's agenda at at, unless it is on it
// already or nothing is ever collected. Called with h.mu held.
func (h *Host) queueIdleLocked(a *activation, at time.Time) {
	if h.cfg.IdleTimeout <= 0 || a.idleQueued {
		return
	}
	a.idleQueued = true
	heap.Push(&h.idle, idleEntry{a: a, at: at})
}

// collectIdle deactivates every activation idle since before: its entries
// due by then come off the agenda, and each is collected, requeued or
// dropped (see idleQueue).
func (h *Host) collectIdle(before time.Time) {
	var idle []*activation
	now := h.cfg.Clock.Now()
	h.mu.Lock()
	for len(h.idle) > 0 && h.idle[0].at.Before(before) {
		a := heap.Pop(&h.idle).(idleEntry).a
		if h.activations[a.addr] != a {
			a.idleQueued = false // collected, stood down or deactivated already
			continue
		}
		a.mu.Lock()
		switch {
		case a.holds != 0:
			a.idleQueued = false // its last hold's release queues it again
		case a.idleSince(before):
			a.state = stateClosed
			delete(h.activations, a.addr)
			a.idleQueued = false
			idle = append(idle, a)
		case a.state == stateReady && !a.running && a.head == len(a.queue) && !a.lastActive.Before(before):
			heap.Push(&h.idle, idleEntry{a: a, at: a.lastActive}) // used since: due an idle timeout after that
		default:
			heap.Push(&h.idle, idleEntry{a: a, at: now}) // busy, building or pinned: look again later
		}
		a.mu.Unlock()
	}
	h.mu.Unlock()
	h.deactivateAll(idle)
}
