package hub

import (
	"context"
	"time"
)

// deactivate runs the hub's Deactivate and releases the claim, once.
func (a *activation) deactivate() {
	a.mu.Lock()
	if a.done || a.building {
		a.mu.Unlock()
		return // done, or the build deactivates it when it returns
	}
	a.done = true
	hub := a.hub
	tok := a.claim
	a.mu.Unlock()
	h := a.host
	h.deactivated.Add(1)
	if d, ok := hub.(Deactivator); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d.Deactivate(ctx)
		cancel()
	}
	if c := h.cfg.Claims; c != nil && !tok.IsZero() {
		c.Release(tok)
	}
	a.mu.Lock()
	a.finished.fire()
	a.mu.Unlock()
	h.mu.Lock()
	if h.retiring[a.addr] == a {
		delete(h.retiring, a.addr) // no next activation came meanwhile
	}
	h.mu.Unlock()
}

// event is a one-shot signal guarded by its activation's mu: fire marks it
// and wakes every waiter; wait returns nil once it fired, else a channel
// that closes when it fires.
type event struct {
	fired bool
	ch    chan struct{}
}

func (e *event) fire() {
	e.fired = true
	if e.ch != nil {
		close(e.ch)
		e.ch = nil
	}
}

func (e *event) wait() <-chan struct{} {
	if e.fired {
		return nil
	}
	if e.ch == nil {
		e.ch = make(chan struct{})
	}
	return e.ch
}

// waitDeactivated blocks until a deactivate under way returns: at once if
// none started (a build still running deactivates when it returns) or it
// returned already.
func (a *activation) waitDeactivated() {
	a.mu.Lock()
	var ch <-chan struct{}
	if a.done {
		ch = a.finished.wait()
	}
	a.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// waitFinished waits until deactivate returned (the last turn ended, the
// hub deactivated, the claim released), or the host closes.
func (a *activation) waitFinished() { a.await(&a.finished, nil) }

// markRemoved records that Deactivate took the activation out of the
// host's map, waking waitRemoved.
func (a *activation) markRemoved() {
	a.mu.Lock()
	a.removed.fire()
	a.mu.Unlock()
}

// waitRemoved waits until Deactivate took the activation out of the host's
// map (markRemoved), or ctx or the host ends.
func (a *activation) waitRemoved(ctx context.Context) { a.await(&a.removed, ctx.Done()) }

// await waits until e fires, stop closes (nil: never) or the host closes.
func (a *activation) await(e *event, stop <-chan struct{}) {
	a.mu.Lock()
	ch := e.wait()
	a.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-stop:
	case <-a.host.ctx.Done():
	}
}
