package mesh

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/verdict"
)

// A DeliverAsync delivery has no goroutine while it only waits in its lane:
// its ticket carries it (asyncCall), and its goroutine starts when the
// ticket may send — at once if it may, else when it becomes the lane's
// cursor within the window (lane.pokeLocked), so a lane runs at most about
// W + 1 such goroutines however many deliveries it queues. It also starts
// when its context ends (to report verdict.ErrDeadlineUnsent or the
// cancellation at once) and when the client closes. A context without a
// deadline is bounded by the request timeout counted from the call; a
// delivery queued behind a slow lane reports that deadline when it is
// reached in the lane, at the latest once everything ahead of it settled.

// asyncCall is one DeliverAsync or DeliverAsyncFunc delivery.
type asyncCall struct {
	c     *Client
	ctx   context.Context
	d     Delivery
	start time.Time
	key   LaneKey
	span  trace.Span // nil: tracing off
	out   chan Result
	done  func(Result)

	// Guarded by the lane's mutex (t.l.mu) while t is in its lane:
	t       *laneTicket
	l       *lane
	started bool
	stop    func() bool // its context.AfterFunc registration
}

// launchLocked starts j's goroutine unless it runs already. Called with the
// lane's mutex held.
func (j *asyncCall) launchLocked() {
	if j.started {
		return
	}
	j.started = true
	go j.run()
}

func (j *asyncCall) run() {
	j.l.mu.Lock()
	stop := j.stop
	j.stop = nil
	j.l.mu.Unlock()
	if stop != nil {
		stop()
	}
	deadline, ok := j.ctx.Deadline()
	if !ok {
		deadline = j.start.Add(j.c.opts.requestTimeout)
	}
	r, err := j.c.run(j.ctx, j.start, deadline, &j.d, j.key, j.t, nil)
	if j.span != nil {
		endSend(j.span, r, err)
	}
	j.finish(Result{Receipt: r, Err: err})
}

func (j *asyncCall) finish(r Result) {
	if j.out != nil {
		j.out <- r // buffer 1
		return
	}
	j.done(r)
}

// deliverAsync validates d and joins its lane with j (enqueueLane).
func (c *Client) deliverAsync(ctx context.Context, d Delivery, j *asyncCall) {
	j.c, j.start = c, time.Now() // real clock: the deadline bounds network I/O, beside ctx's
	if c.opts.tracer != nil {
		ctx, j.span = c.startSend(ctx, &d, false)
	}
	j.ctx, j.d = ctx, d
	if err := c.validate(&j.d); err != nil {
		c.count(err, time.Time{})
		c.failAsync(j, err)
		return
	}
	if !c.calls.join() {
		c.count(verdict.ErrClosing, time.Time{})
		c.failAsync(j, verdict.ErrClosing)
		return
	}
	if c.closing.Load() {
		c.calls.leave()
		c.count(verdict.ErrClosing, time.Time{})
		c.failAsync(j, verdict.ErrClosing)
		return
	}
	j.key = laneKeyOf(&j.d)
	c.enqueueLane(j.key, j)
	if c.closing.Load() {
		// Close began after the check above: its launchAll may have
		// missed this ticket (it sees every ticket enqueued before
		// closing was set).
		j.l.mu.Lock()
		j.launchLocked()
		j.l.mu.Unlock()
	}
	if ctx.Done() == nil {
		return
	}
	stop := context.AfterFunc(ctx, func() {
		j.l.mu.Lock()
		j.launchLocked()
		j.l.mu.Unlock()
	})
	j.l.mu.Lock()
	if j.started {
		j.l.mu.Unlock()
		stop() // its goroutine did not see it: nothing left to stop for
		return
	}
	j.stop = stop
	j.l.mu.Unlock()
}

func (c *Client) failAsync(j *asyncCall, err error) {
	if j.span != nil {
		endSend(j.span, Receipt{ID: j.d.ID}, err)
	}
	j.finish(Result{Receipt: Receipt{ID: j.d.ID}, Err: err})
}

// launchAll starts every queued DeliverAsync delivery (Close: they end with
// verdict.ErrClosing).
func (c *Client) launchAll() {
	c.lanesMu.Lock()
	lanes := make([]*lane, 0, len(c.lanes))
	for _, l := range c.lanes {
		lanes = append(lanes, l)
	}
	c.lanesMu.Unlock()
	for _, l := range lanes {
		l.mu.Lock()
		for _, t := range l.q[l.head:] {
			if t != nil && t.async != nil {
				t.async.launchLocked()
			}
		}
		l.mu.Unlock()
	}
}
