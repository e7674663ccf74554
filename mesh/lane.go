package mesh

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
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

// lane is a sender-side FIFO: q[0] holds the lane (its leg may be in flight
// or backing off); the rest wait in call order. A lane exists only while it
// holds work.
type lane struct {
	q    []*laneTicket // q[head] holds the lane; q[head+1:] wait in order
	head int
}

func (l *lane) depth() int { return len(l.q) - l.head }

type laneTicket struct {
	ready chan struct{} // closed when the ticket reaches the head; nil for a ticket created at the head
}

// enqueueLane joins lane key without blocking; call order on a lane is the
// order of enqueueLane calls. The ticket must be awaited with waitLane and
// given back with releaseLane (or abandoned by waitLane on error).
func (c *Client) enqueueLane(key LaneKey) *laneTicket {
	c.lanesMu.Lock()
	defer c.lanesMu.Unlock()
	l := c.lanes[key]
	if l == nil {
		l = lanePool.Get().(*lane)
		c.lanes[key] = l
	}
	t := ticketPool.Get().(*laneTicket)
	if l.depth() > 0 {
		t.ready = make(chan struct{})
	}
	l.q = append(l.q, t)
	return t
}

// waitLane blocks until t holds its lane, or ctx ends or the client closes;
// on error (context.Canceled, verdict.ErrDeadlineUnsent, verdict.ErrClosing)
// the ticket has left the lane.
func (c *Client) waitLane(ctx context.Context, deadline time.Time, key LaneKey, t *laneTicket) error {
	if t.ready == nil {
		return nil
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var err error
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
		// Nothing was sent: the caller's cancellation is its choice
		// (Failed); a deadline is not a timeout (no callee holds it).
		err = ctx.Err()
		if !errors.Is(err, context.Canceled) {
			err = &verdict.Error{Reason: verdict.ReasonDeadlineUnsent, Message: "deadline passed while waiting for the lane"}
		}
	case <-c.stop:
		err = verdict.ErrClosing
	}
	c.lanesMu.Lock()
	select {
	case <-t.ready: // granted meanwhile: pass it on
		c.lanesMu.Unlock()
		c.releaseLane(key, t)
		return err
	default:
	}
	l := c.lanes[key]
	for i := l.head + 1; i < len(l.q); i++ {
		if l.q[i] == t {
			l.q = append(l.q[:i], l.q[i+1:]...)
			break
		}
	}
	c.lanesMu.Unlock()
	return err
}

// releaseLane gives the head ticket back and hands the lane to the next
// waiter, or removes the lane when it is empty.
func (c *Client) releaseLane(key LaneKey, t *laneTicket) {
	c.lanesMu.Lock()
	defer c.lanesMu.Unlock()
	l := c.lanes[key]
	if l == nil || l.depth() == 0 || l.q[l.head] != t {
		panic("mesh: lane released by a ticket that does not hold it")
	}
	l.q[l.head] = nil
	l.head++
	t.ready = nil
	ticketPool.Put(t)
	if l.depth() == 0 {
		delete(c.lanes, key)
		l.q, l.head = l.q[:0], 0
		if cap(l.q) > 64 {
			l.q = nil // a burst's queue is not kept in the pool
		}
		lanePool.Put(l)
		return
	}
	close(l.q[l.head].ready)
}

// Lanes and tickets are recycled: a lane exists only while it holds work, so
// most deliveries create and drop one.
var (
	lanePool   = sync.Pool{New: func() any { return &lane{q: make([]*laneTicket, 0, 4)} }}
	ticketPool = sync.Pool{New: func() any { return new(laneTicket) }}
)
