package hub

import "sync"

// DefaultDedupeWindow is the number of most recently accepted delivery IDs a
// node generation remembers, across all its addresses. A delivery whose ID is
// still in the window is answered Accepted again (even while draining: it was
// accepted) and not enqueued a second time; a repeated request gets no second
// response. The window is counted in deliveries, not time: at 1 000
// deliveries/s the default covers 65 s, at 10 000/s about 6.5 s — shorter
// than the 9.75 s retry ladder, so a node sustaining that rate should raise
// Config.DedupeWindow (each ID costs about 100 bytes).
const DefaultDedupeWindow = 1 << 16

// dedupe remembers the last n accepted IDs: a set plus a ring that evicts the
// oldest. Safe for concurrent use.
type dedupe struct {
	mu   sync.Mutex
	set  map[string]struct{}
	ring []string
	next int
}

func newDedupe(n int) *dedupe {
	return &dedupe{set: make(map[string]struct{}, min(n, 4096)), ring: make([]string, n)}
}

func (d *dedupe) seen(id string) bool {
	d.mu.Lock()
	_, ok := d.set[id]
	d.mu.Unlock()
	return ok
}

func (d *dedupe) add(id string) {
	d.mu.Lock()
	if old := d.ring[d.next]; old != "" {
		delete(d.set, old)
	}
	d.ring[d.next] = id
	d.set[id] = struct{}{}
	d.next = (d.next + 1) % len(d.ring)
	d.mu.Unlock()
}
