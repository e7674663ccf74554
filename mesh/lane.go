package mesh

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// LaneKey is the identity of a lane: the pair (address, stream), a struct
// key and never a joined string (DESIGN §1).
type LaneKey struct {
	Addr   subjects.Address `json:"address"`
	Stream subjects.Stream  `json:"stream"`
}

// laneKeyOf reads a delivery's lane identity. Its stream identity comes from
// subjects.StreamIdentity, the function the hub's storm breaker reads it
// through too, so the two keys agree on which deliveries share a stream.
func laneKeyOf(d *Delivery) LaneKey {
	return LaneKey{Addr: d.To, Stream: subjects.StreamIdentity(d.Stream)}
}

// DefaultWindow is how many legs of one lane may be in flight at once
// (DESIGN §4); 1 is stop-and-wait.
const DefaultWindow = 32

// MaxGrantedWindow caps the window a receiver's grant (hub.HeaderWindow)
// gives a lane of a client without [WithWindow].
const MaxGrantedWindow = 1024

// Windowed lanes, the sending side (DESIGN §4, docs/protocol.md).
//
// A lane is a FIFO of tickets in call order, one per delivery. Its legs are
// published in that order, each carrying the lane's current epoch and the
// next sequence number of that epoch (hub.HeaderLane); the intake accepts a
// lane's legs only in sequence. The ticket allowed to send next — the
// cursor — is the first one that is neither settled nor already sent in
// the current epoch; it may send only if it is ready (not backing off, no
// leg of an older epoch still in flight) and within the window (fewer than
// W tickets from the first unsettled one). While it prepares and publishes
// its leg it holds the cursor, so legs leave in lane order.
//
// A leg of the current epoch that is not accepted — refused (out of order
// or otherwise), timed out, lost with the link, not published — breaks the
// epoch: the lane starts a new one, and every ticket not yet accepted is
// re-sent in it, in order, under its own delivery ID. Because the cursor
// waits for tickets ahead of it that still have a leg of an older epoch in
// flight, a new epoch's first leg leaves only once everything ahead of it
// is settled (accepted, failed, or sent in the new epoch). A timed-out
// ticket fails alone (never re-sent); a ticket whose failure is retried
// keeps its place, so the tickets behind it wait (other lanes do not); an
// out-of-order refusal is re-sent at once, not counted as a retry.
//
// A leg published while its ticket is alone in the lane (nothing ahead of
// it unsettled, nothing behind it) carries no HeaderLane: it is not
// sequence-checked, like a one-leg-at-a-time client's, and its ticket stays
// the cursor until it settles, so nothing of the lane leaves behind it
// meanwhile; the lane's next leg starts a new epoch. A sequential caller
// thus never pays for the header, and a burst waits one round trip for its
// first leg before it is pipelined.
//
// A lane exists only while it holds work: it is removed with its last
// ticket, so an idle lane costs nothing.
type lane struct {
	key LaneKey

	mu     sync.Mutex
	q      []*laneTicket // q[head:] in call order: every ticket not popped yet
	head   int           // q[head] is the first unsettled ticket
	epoch  uint64        // the client's epoch counter value naming the lane's current run (newEpoch)
	window int           // legs of the lane in flight at most: the client's, then its receiver's grant
	seq    uint64        // the last sequence number used in epoch
	// Every ticket in q[head:scan] is settled or sent in epoch scanEpoch:
	// while that is still the lane's epoch, the cursor is at scan or after
	// it (cursorLocked), so finding it costs nothing per settled leg.
	scan      int
	scanEpoch uint64
	qbuf      [4]*laneTicket
	// The delivery subject of the lane's last leg and what it was built
	// from (deliverySubject): a lane's legs go to one owner, so it is
	// built once per lane and owner, and a pooled lane reused for the same
	// destination keeps it.
	subj   string
	subjTo subjects.Address
	subjSt subjects.Stream
	subjN  subjects.NodeID
}

// deliverySubject returns the delivery subject of d to node (d is in lane
// l), from l's cache when its last leg went to the same subject.
func (c *Client) deliverySubject(l *lane, d *Delivery, node subjects.NodeID) string {
	l.mu.Lock()
	if l.subj != "" && l.subjN == node && l.subjTo == d.To && l.subjSt == d.Stream {
		s := l.subj
		l.mu.Unlock()
		return s
	}
	l.mu.Unlock()
	s := c.cfg.Prefix.Delivery(node, d.To, d.Stream)
	l.mu.Lock()
	l.subj, l.subjTo, l.subjSt, l.subjN = s, d.To, d.Stream, node
	l.mu.Unlock()
	return s
}

type ticketState uint8

const (
	ticketPending ticketState = iota // must send a leg in the current epoch when it reaches the cursor
	ticketHeld                       // holds the cursor: preparing and publishing its leg
	ticketSent                       // a leg of epoch ticket.epoch left; its reply is awaited, or it was accepted
	ticketParked                     // not ready (a leg ended unaccepted, backing off): holds its place
	ticketDone                       // settled: accepted, or failed for good
)

type laneTicket struct {
	l     *lane
	state ticketState
	epoch uint64        // the epoch of its last published leg
	first bool          // its last leg was the first of its epoch (seq 1): its reply carries the grant
	wake  chan struct{} // buffer 1: poked when it may have become the cursor
	async *asyncCall    // a DeliverAsync delivery (async.go), whose goroutine starts when it may send
	leg   *stagedLeg    // a prepared leg waiting for the cursor, published by whoever passes it on (stage)
}

// ticketPool recycles tickets: a ticket is put back only when its lane pops
// it (finishLane), i.e. once it is settled and its delivery's goroutine no
// longer uses it. A stale poke left in wake is harmless (awaitTurn
// re-checks), but is drained anyway.
var ticketPool = sync.Pool{New: func() any { return &laneTicket{wake: make(chan struct{}, 1)} }}

// lanePool recycles lanes: a lane is put back by the finishLane that removes
// it from the client's map, empty, and only that once. A goroutine may still
// hold the pointer then (a finishLane that found it empty and waits for
// c.lanesMu, Close's launchAll): it locks the lane's own mutex, the same
// across lives, and reads its current state — a lane that is not in the map
// under its key, or not empty, is left alone; launchAll only starts the
// DeliverAsync goroutines of a closing client, whatever lane they are in.
var lanePool = sync.Pool{New: func() any {
	l := new(lane)
	l.q = l.qbuf[:0]
	return l
}}

// depth is the number of deliveries in the lane (in flight + waiting).
func (l *lane) depth() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.q) - l.head
}

// cursorLocked returns the index of the ticket that sends next, or -1.
// Called with l.mu held.
func (l *lane) cursorLocked() int { return l.cursorFromLocked(l.head) }

// cursorFromLocked is cursorLocked for a caller that knows every ticket
// from l.head up to from is settled or sent in the current epoch. It starts
// at the lane's scan mark when that is further and still of this epoch: a
// ticket before the cursor leaves that state only when the epoch breaks
// (a sent leg that ends unaccepted) or the queue is compacted (the mark is
// reset).
func (l *lane) cursorFromLocked(from int) int {
	if l.scanEpoch == l.epoch && l.scan > from {
		from = l.scan
	}
	for i := from; i < len(l.q); i++ {
		t := l.q[i]
		if t.state == ticketDone || t.state == ticketSent && t.epoch == l.epoch {
			continue
		}
		l.scan, l.scanEpoch = i, l.epoch
		return i
	}
	l.scan, l.scanEpoch = len(l.q), l.epoch
	return -1
}

// mayHoldLocked reports whether t may take the cursor now. Called with l.mu
// held.
func (l *lane) mayHoldLocked(t *laneTicket, window int) bool {
	if t.state != ticketPending {
		return false
	}
	i := l.cursorLocked()
	return i >= 0 && l.q[i] == t && i-l.head < window
}

// A ticket holding the cursor may find, when it publishes, that the cursor
// went back to a ticket ahead of it (whose leg of the old epoch ended
// unaccepted meanwhile): then both held it for a moment, and publishInLane
// lets only the cursor's ticket publish.

// pokeLocked passes the cursor on: while the cursor's ticket is within the
// window and has a staged leg (stage), its leg is published here, on its
// caller's behalf — no goroutine hand-off per leg, so a hot lane refills its
// window in one go; the first cursor ticket without one is woken (or, a
// DeliverAsync delivery, its goroutine started) to send its leg itself.
// Called with l.mu held.
func (c *Client) pokeLocked(l *lane) {
	window := l.window
	for i := l.head; ; {
		i = l.cursorFromLocked(i)
		if i < 0 || i-l.head >= window || l.q[i].state != ticketPending {
			return
		}
		t := l.q[i]
		if s := t.leg; s != nil && s.state == stagedWaiting {
			epoch := l.epoch
			if c.publishStagedLocked(l, t) {
				wakeTicket(t)
				if l.epoch != epoch {
					// Its publish failed and broke the epoch: the legs
					// ahead of it are no longer sent in the current one,
					// so the cursor is looked for from the head again.
					i = l.head
				}
				continue
			}
			s.state = stagedHandoff // its caller sends it itself (no slot free, or a fact to report)
		} else if j := t.async; j != nil && !j.started {
			j.launchLocked()
			// The DeliverAsync deliveries behind it within the window
			// start too, so that they stage their legs meanwhile (at most
			// W + 1 goroutines a lane still).
			for k := i + 1; k < len(l.q) && k-l.head < window; k++ {
				if j := l.q[k].async; j != nil && !j.started && l.q[k].state == ticketPending {
					j.launchLocked()
				}
			}
			return
		}
		wakeTicket(t)
		return
	}
}

func wakeTicket(t *laneTicket) {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// enqueueLane joins lane key without blocking; call order on a lane is the
// order of enqueueLane calls. The ticket must be settled with finishLane.
// With j (DeliverAsync), the ticket carries j and j's goroutine is started
// at once if the ticket may send now, else when it becomes the lane's
// cursor (pokeLocked) or j's context ends or the client closes.
func (c *Client) enqueueLane(key LaneKey, j *asyncCall) *laneTicket {
	c.lanesMu.Lock()
	defer c.lanesMu.Unlock()
	l := c.lanes[key]
	if l == nil {
		l = lanePool.Get().(*lane)
		l.mu.Lock()
		l.key, l.epoch, l.seq, l.window, l.scan = key, c.newEpoch(), 0, c.opts.window, 0
		l.mu.Unlock()
		c.lanes[key] = l
	}
	t := ticketPool.Get().(*laneTicket)
	select {
	case <-t.wake:
	default:
	}
	t.l, t.state, t.epoch, t.async = l, ticketPending, 0, j
	l.mu.Lock()
	l.q = append(l.q, t)
	if j != nil {
		j.t, j.l = t, l
		if l.mayHoldLocked(t, l.window) {
			j.launchLocked()
		}
	}
	l.mu.Unlock()
	return t
}

// newEpoch starts a fresh lane epoch: a counter, unique per client. On the
// wire (laneValue) it is named by the client's random prefix and the counter
// in base 36, so it is unique across clients too.
func (c *Client) newEpoch() uint64 { return c.epochs.Add(1) }

// laneValue is the hub.HeaderLane value of leg seq in epoch:
// "<prefix><epoch base 36>/<seq>", built with one allocation.
func (c *Client) laneValue(epoch, seq uint64) string {
	var buf [64]byte
	b := append(buf[:0], c.epochPrefix...)
	b = strconv.AppendUint(b, epoch, 36)
	b = append(b, '/')
	b = strconv.AppendUint(b, seq, 10)
	return string(b)
}

// awaitTurn blocks until t holds its lane's cursor (it may publish its leg),
// or ctx ends or the client closes: unsentVerdict's answer (verdict.ErrClosing,
// context.Canceled, verdict.ErrDeadlineUnsent), with t still in the lane
// (parked).
func (c *Client) awaitTurn(ctx context.Context, deadline time.Time, t *laneTicket) error {
	l := t.l
	l.mu.Lock()
	if t.state == ticketParked {
		t.state = ticketPending
	}
	if l.mayHoldLocked(t, l.window) {
		t.state = ticketHeld
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	// deadline is ctx's own or earlier: a pooled timer bounds the wait, not
	// a context per wait.
	timer := deadlineTimer(deadline)
	defer releaseTimer(timer)
	for {
		var err error
		select {
		case <-t.wake:
			l.mu.Lock()
			if l.mayHoldLocked(t, l.window) {
				t.state = ticketHeld
				l.mu.Unlock()
				return nil
			}
			l.mu.Unlock()
			continue
		case <-ctx.Done():
		case <-timer.C:
		case <-c.stop:
		}
		// Nothing of this attempt was sent: the facts decide the verdict,
		// not the channel that fired (the caller's cancellation is its
		// choice, Failed; a deadline is not a timeout).
		if err = unsentVerdict(stageLane, c.unsentFactsOf(ctx, deadline, nil), ""); err == nil {
			err = unsentVerdict(stageLane, unsentFacts{deadline: true}, "") // the timer fires at the deadline
		}
		l.mu.Lock()
		t.state = ticketParked
		c.pokeLocked(l)
		l.mu.Unlock()
		return err
	}
}

// errRewound: the lane's cursor went back to a ticket ahead of the one
// about to publish (an epoch broke meanwhile); nothing was sent, and the
// ticket waits for its turn again.
var errRewound = errors.New("mesh: lane rewound before the leg was sent")

// publishInLane stamps t's leg lm with the lane's epoch and next sequence
// number and publishes it, holding the cursor (t must hold it), so legs
// leave in lane order. On success t is sent in that epoch and the cursor
// passes on; on failure (nothing left) the epoch is broken. If the cursor
// went back to a ticket ahead of t while t prepared its leg, nothing is sent
// and errRewound is returned (t waits for its turn again).
func (c *Client) publishInLane(t *laneTicket, lm *legMsg) error {
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.state != ticketHeld {
		panic("mesh: leg published by a ticket that does not hold its lane")
	}
	if i := l.cursorLocked(); i < 0 || l.q[i] != t {
		t.state = ticketPending
		c.pokeLocked(l)
		return errRewound
	}
	err := c.publishLocked(l, t, lm)
	c.pokeLocked(l)
	return err
}

// publishLocked publishes lm, the leg of t, the lane's cursor: stamped with
// the lane's epoch and next sequence number, or — t alone in the lane — with
// none. On success t is sent; on failure (nothing left) it is parked and the
// epoch broken. Called with l.mu held; the caller passes the cursor on.
func (c *Client) publishLocked(l *lane, t *laneTicket, lm *legMsg) error {
	if l.head == len(l.q)-1 {
		// t is alone in the lane: everything ahead of it is settled.
		// Its leg goes without hub.HeaderLane, as a one-leg-at-a-time
		// client's would (one header less to write and read), and while
		// it is in flight it stays the cursor, so nothing of the lane is
		// published behind it before it settles; the next leg starts a
		// new epoch. Its ticket is sent in no epoch (0).
		t.first = false
		err := c.cfg.Conn.PublishMsg(lm.ready())
		if err != nil {
			t.state = ticketParked
		} else {
			t.state, t.epoch = ticketSent, 0
			l.epoch, l.seq = c.newEpoch(), 0
		}
		return err
	}
	l.seq++
	epoch := l.epoch
	t.first = l.seq == 1
	lm.set(hdrLane, c.laneValue(epoch, l.seq))
	err := c.cfg.Conn.PublishMsg(lm.ready())
	if err != nil {
		l.epoch, l.seq = c.newEpoch(), 0
		t.state = ticketParked
	} else {
		t.state, t.epoch = ticketSent, epoch
	}
	return err
}

// legEnded records that t's attempt ended without acceptance (accepted
// legs settle with finishLane): a leg of the current epoch breaks it, and t
// is parked until it is re-sent (awaitTurn) or settled.
func (c *Client) legEnded(t *laneTicket) {
	l := t.l
	l.mu.Lock()
	if t.state == ticketSent && t.epoch == l.epoch {
		l.epoch, l.seq = c.newEpoch(), 0
	}
	t.state = ticketParked
	c.pokeLocked(l)
	l.mu.Unlock()
}

// granted applies the receiver's window grant (hub.HeaderWindow) in reply,
// the Accepted reply to t's leg, the first of its epoch: the lane's window
// becomes the grant, capped by the client's.
func (c *Client) granted(t *laneTicket, reply *nats.Msg) {
	v, ok := reply.Header[hub.HeaderWindow]
	if !ok || len(v) == 0 {
		return
	}
	n, err := strconv.Atoi(v[0])
	if err != nil || n < 1 {
		return
	}
	n = min(n, c.opts.windowCap)
	l := t.l
	l.mu.Lock()
	if l.window != n {
		l.window = n
		c.pokeLocked(l)
	}
	l.mu.Unlock()
}

// finishLane settles t (accepted or failed for good): it leaves the lane,
// the cursor may pass on, and an empty lane is removed. A leg of t still
// counted as sent in the current epoch stays so: settled either way, it
// cannot be in the way of the legs behind it.
func (c *Client) finishLane(t *laneTicket, accepted bool) {
	l := t.l
	l.mu.Lock()
	if !accepted && t.state == ticketSent && t.epoch == l.epoch {
		l.epoch, l.seq = c.newEpoch(), 0
	}
	t.state = ticketDone
	for l.head < len(l.q) && l.q[l.head].state == ticketDone {
		done := l.q[l.head]
		l.q[l.head] = nil
		l.head++
		done.l, done.async = nil, nil
		ticketPool.Put(done)
	}
	empty := l.head == len(l.q)
	if empty {
		l.q, l.head, l.scan = l.q[:0], 0, 0
	} else {
		if l.head > 64 && l.head*2 > len(l.q) {
			n := copy(l.q, l.q[l.head:])
			clear(l.q[n:])
			l.q, l.head, l.scan = l.q[:n], 0, 0
		}
		c.pokeLocked(l)
	}
	l.mu.Unlock()
	if !empty {
		return
	}
	c.lanesMu.Lock()
	l.mu.Lock()
	removed := l.head == len(l.q) && c.lanes[l.key] == l
	if removed {
		delete(c.lanes, l.key)
		l.key = LaneKey{}
		l.subj = "" // the pool is the process's: the next client may have another prefix
		if cap(l.q) > 2*len(l.qbuf) {
			l.q = l.qbuf[:0] // a deep lane's queue is not kept
		}
	}
	l.mu.Unlock()
	c.lanesMu.Unlock()
	if removed {
		lanePool.Put(l)
	}
}
