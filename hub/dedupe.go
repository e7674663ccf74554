package hub

import (
	"errors"
	"sync"

	"github.com/natsmesh/natsmesh/verdict"
)

// DefaultDedupeWindow is the number of most recently accepted delivery IDs a
// node generation remembers, across all its addresses. A delivery whose ID is
// still in the window is not enqueued a second time; it is answered from the
// outcome recorded for the ID (see [Host] and docs/protocol.md §3.2). The
// window is counted in deliveries, not time: at 1 000 deliveries/s the
// default covers 65 s, at 10 000/s about 6.5 s — shorter than the 9.75 s
// retry ladder, so a node sustaining that rate should raise
// Config.DedupeWindow (each ID costs about 150 bytes, plus a kept response).
const DefaultDedupeWindow = 1 << 16

// DefaultDedupeResponseBytes bounds the payload bytes of the responses a
// node generation keeps so that a duplicate of a handled request gets its
// response again (Config.DedupeResponseBytes).
const DefaultDedupeResponseBytes = 8 << 20

// outcome states of a remembered delivery ID.
type recState uint8

const (
	recAccepted  recState = iota // accepted; not handled yet (or a plain delivery)
	recResponded                 // a request whose handler answered: resp is kept
	recRespGone                  // a request whose handler answered; the response was evicted
	recFailed                    // failed after acceptance with a terminal verdict: err
	recForgotten                 // left the window by forget: the hub holds nothing of it
)

// maxAlsoAnswer bounds the other answer subjects a queued request's answer
// also goes to: duplicates of it that came from other senders (an outside
// client's re-send through another ingress node) while it was queued.
const maxAlsoAnswer = 4

// record is the outcome the intake remembers for one accepted delivery ID.
// Its fields are guarded by the dedupe's mutex.
type record struct {
	id       string
	request  bool
	answerTo string // the accepted delivery's answer subject
	state    recState
	payload  []byte   // recResponded: the response
	err      error    // recResponded: the handler's failure, if any; recFailed: the late verdict
	alsoTo   []string // recAccepted requests: duplicates' other answer subjects, owed the answer too
}

// dedupe records outcomes, not sightings (DESIGN §5): the last n accepted
// IDs with what became of each — a set plus a ring that evicts the oldest,
// and the kept responses of handled requests, bounded in bytes (oldest
// evicted first). A delivery refused late with a resendable verdict is
// forgotten, so its re-send is accepted. Safe for concurrent use.
type dedupe struct {
	mu   sync.Mutex
	recs map[string]*record
	ring []*record
	next int

	maxBytes  int
	bytes     int
	responses []*record // records holding a response, oldest first

	// slab is where the next records are carved from: records are made
	// recordSlab at a time (one allocation instead of one per delivery).
	// They enter and leave the window in order, so a slab lives about as
	// long as its records; what refers to a record (the window, a queued
	// entry, the kept responses) is internal and bounded.
	slab []record
}

// recordSlab is how many records dedupe allocates at once.
const recordSlab = 64

func newDedupe(n, maxResponseBytes int) *dedupe {
	return &dedupe{recs: make(map[string]*record, min(n, 4096)), ring: make([]*record, n), maxBytes: maxResponseBytes}
}

// lookup returns the record of id, or nil.
func (d *dedupe) lookup(id string) *record {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.recs[id]
}

// add remembers a delivery about to be enqueued and returns its record; the
// oldest ID leaves the window.
func (d *dedupe) add(id string, request bool, answerTo string) *record {
	d.mu.Lock()
	if len(d.slab) == 0 {
		d.slab = make([]record, recordSlab)
	}
	r := &d.slab[0]
	d.slab = d.slab[1:]
	r.id, r.request, r.answerTo = id, request, answerTo
	if old := d.ring[d.next]; old != nil && d.recs[old.id] == old {
		delete(d.recs, old.id)
		d.dropResponseLocked(old)
	}
	d.ring[d.next] = r
	d.recs[id] = r
	d.next = (d.next + 1) % len(d.ring)
	d.mu.Unlock()
	return r
}

// forget removes r's ID from the window (a refusal, or a resendable late
// verdict: the callee holds nothing, so a re-send must be accepted). A newer
// record of the same ID is left alone. It returns the other answer
// subjects owed r's answer (see also).
func (d *dedupe) forget(r *record) []string {
	if r == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.recs[r.id] == r {
		delete(d.recs, r.id)
	}
	d.dropResponseLocked(r)
	r.state = recForgotten // a duplicate that looked it up just before is accepted afresh
	return r.takeAlsoLocked()
}

// unsettled reports whether err leaves nothing to record for a delivery: a
// resendable verdict (the callee holds nothing), a failed build (the
// handler never ran: the store behind hub.LoadState may have been
// unreachable for a moment), or an unknown outcome (the node does not know
// what became of it — say its state save went unanswered; the activation
// that takes the state over may). Either way a re-send must be handled
// afresh, not answered the same again for the whole window.
func unsettled(err error) bool {
	return err != nil && (verdict.IsResendable(err) || errors.Is(err, verdict.ErrActivationFailed) ||
		errors.Is(err, verdict.ErrOutcomeUnknown))
}

// failed records a late terminal verdict for r, or forgets r if err is
// unsettled. It returns the other answer subjects owed the verdict.
func (d *dedupe) failed(r *record, err error) []string {
	if r == nil {
		return nil
	}
	if unsettled(err) {
		return d.forget(r)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.state != recForgotten {
		r.state, r.err = recFailed, err
	}
	return r.takeAlsoLocked()
}

// responded records the response of request r, evicting the oldest kept
// responses beyond the byte bound; an unsettled failure forgets r instead.
// It returns the other answer subjects owed the response (see also); a
// duplicate that comes after it finds the recorded outcome instead.
func (d *dedupe) responded(r *record, payload []byte, err error) []string {
	if r == nil || !r.request {
		return nil
	}
	if unsettled(err) {
		return d.forget(r) // e.g. its state was not saved (fenced), or may not have been: a re-send runs again
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	also := r.takeAlsoLocked()
	if d.recs[r.id] != r {
		return also // left the window meanwhile
	}
	d.dropResponseLocked(r) // recorded again: the send failed
	if len(payload) > d.maxBytes {
		r.state = recRespGone
		return also
	}
	r.state, r.payload, r.err = recResponded, payload, err
	d.bytes += len(payload)
	d.responses = append(d.responses, r)
	for len(d.responses) > 0 && (d.bytes > d.maxBytes || d.responses[0].state != recResponded) {
		old := d.responses[0]
		d.responses[0] = nil
		d.responses = d.responses[1:]
		d.dropResponseLocked(old)
	}
	if len(d.responses) == 0 {
		d.responses = nil // let the backing array go
	}
	return also
}

// takeAlsoLocked returns and clears r's other answer subjects. Called with
// d.mu held.
func (r *record) takeAlsoLocked() []string {
	also := r.alsoTo
	r.alsoTo = nil
	return also
}

// dropResponseLocked releases r's kept response. Called with d.mu held.
func (d *dedupe) dropResponseLocked(r *record) {
	if r.state == recResponded {
		d.bytes -= len(r.payload)
		r.state, r.payload, r.err = recRespGone, nil, nil
		// r stays in d.responses until it reaches the front (responded
		// pops it then); its state says it holds nothing.
	}
}

// outcomeOf returns a copy of r's outcome.
func (d *dedupe) outcomeOf(r *record) (state recState, payload []byte, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return r.state, r.payload, r.err
}

// also notes, if r is a request still queued or running, that its answer
// is owed to answerTo too (a duplicate from another sender: an outside
// client re-sending through another ingress node while the first copy is
// queued), and returns r's state. Deciding both under one lock means the
// duplicate's sender gets the answer exactly once: either noted here before
// the answer is recorded, or from the recorded outcome (outcomeOf; those
// states are final) after. It reports whether answerTo is owed the answer;
// false with state recAccepted means the bound (maxAlsoAnswer) was full or
// the duplicate gave no answer subject.
func (d *dedupe) also(r *record, answerTo string) (state recState, noted bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.state != recAccepted || !r.request || answerTo == "" {
		return r.state, false
	}
	if answerTo == r.answerTo {
		return r.state, true // the same sender: the answer goes there once
	}
	for _, s := range r.alsoTo {
		if s == answerTo {
			return r.state, true
		}
	}
	if len(r.alsoTo) >= maxAlsoAnswer {
		return r.state, false
	}
	r.alsoTo = append(r.alsoTo, answerTo)
	return r.state, true
}
