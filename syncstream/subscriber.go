package syncstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nuid"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Recovery settings (DESIGN §7).
const (
	GraceAttempts  = 3
	BackoffInitial = time.Second
	BackoffMax     = 60 * time.Second
	// AttemptTimeout bounds one subscribe request.
	AttemptTimeout = 10 * time.Second
)

// Handler receives the frames a subscription applies, in order, one at a
// time (on the subscriber activation's turn). It must not block for long.
type Handler func(Frame)

// Subscription is a live subscription to an owner's stream. Its methods are
// safe for concurrent use.
type Subscription struct {
	node    *mesh.Node
	owner   subjects.Address
	stream  subjects.Stream
	self    subjects.Address
	handler Handler

	mu      sync.Mutex
	epoch   uint64
	version uint64
	started bool   // a snapshot was applied: (epoch, version) is the mirror's
	attempt string // the latest subscribe attempt
	adopted bool   // a snapshot of it was applied (a repeat of it is stale)
	// confirmed is the epoch the latest answered subscribe's response
	// named: the activation the mesh routed it to, followed even if its
	// epoch is below the mirror's (a clock behind). dropped is a snapshot
	// of the latest attempt the guard turned away: if the response names
	// its epoch, the subscriber subscribes again (subscribeOnce).
	confirmed      uint64
	droppedAttempt string
	droppedEpoch   uint64
	again          bool // subscribe again: the responder's snapshot was dropped before its response named it
	// What a poke was about (DESIGN §7: resubscribe once per owner
	// change): a closed frame of closedEpoch, the departure of departed.
	// Both are cleared when an attempt starts, which answers them; a
	// wake-up finds recovery due only if one still names what the
	// subscription follows (recoveryDue).
	closedEpoch uint64
	departed    subjects.NodeID
	ownerNode   subjects.NodeID
	err         error

	applied, stale, resubscribes atomic.Int64
	trigger                      chan struct{} // resubscribe now
	closed                       chan struct{}
	stop                         chan struct{}
	stopOnce, closeOnce          sync.Once
	wg                           sync.WaitGroup

	// The session the subscriber address is armed on (guarded by mu):
	// sessDone closes when the node moved on from it (mesh.Session).
	gen      subjects.NodeID
	sessDone <-chan struct{}
	host     *hub.Host
	release  func()
	unwatch  func()
}

// registry maps subscriber addresses to their subscriptions, for the
// subscriber hub kind's factory.
var registry sync.Map // subjects.Address -> *Subscription

// Subscribe subscribes to stream of the hub at owner, from node: it
// activates a subscriber address on node, asks the owner for the stream and
// keeps the subscription alive (see the package documentation). It blocks
// until the first subscribe attempt is answered or ctx ends; a terminal
// failure of that attempt is returned as the error. handler receives every
// applied frame, the first being the snapshot.
func Subscribe(ctx context.Context, node *mesh.Node, owner subjects.Address, stream subjects.Stream, handler Handler) (*Subscription, error) {
	if err := owner.Validate(); err != nil {
		return nil, &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: "invalid owner address", Err: err}
	}
	if err := stream.Validate(); err != nil {
		return nil, &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: "invalid stream", Err: err}
	}
	if err := node.Register(SubscriberKind, subscriberFactory); err != nil && !errors.Is(err, hub.ErrKindRegistered) {
		return nil, err
	}
	s := &Subscription{
		node: node, owner: owner, stream: subjects.StreamIdentity(stream), handler: handler,
		self:    subjects.Address(SubscriberKind + "/" + node.ID().Name + "/" + nuid.Next()),
		trigger: make(chan struct{}, 1), closed: make(chan struct{}), stop: make(chan struct{}),
	}
	registry.Store(s.self, s)
	if err := s.arm(ctx); err != nil {
		s.disarm()
		return nil, err
	}
	first := make(chan error, 1)
	s.wg.Add(1)
	go s.run(first)
	select {
	case err := <-first:
		if err != nil {
			// A terminal first attempt: nothing of it may stay behind
			// (the pinned activation, its claim, the watcher).
			s.wg.Wait()
			s.disarm()
			return nil, err
		}
		return s, nil
	case <-ctx.Done():
		s.Stop()
		return nil, ctx.Err()
	}
}

// arm activates the subscriber address on the node's current session (its
// host, its generation) and follows that session's membership events. It
// drops what an earlier session armed.
func (s *Subscription) arm(ctx context.Context) error {
	s.unarm()
	sess := s.node.Session() // one snapshot: a rejoin cannot mix two generations
	gen, h := sess.ID, sess.Host
	if h == nil {
		return verdict.New(verdict.ReasonHubShuttingDown, "node %s has no session", gen)
	}
	release, err := h.Activate(ctx, s.self)
	if err != nil {
		return fmt.Errorf("syncstream: activate subscriber %s on %s: %w", s.self, gen, err)
	}
	var unwatch func()
	if m := sess.Members; m != nil {
		unwatch = m.OnEvent(func(e membership.Event) {
			s.mu.Lock()
			mine := e.Type.Departed() && e.Member.Node == s.ownerNode
			if mine {
				s.departed = e.Member.Node
			}
			s.mu.Unlock()
			if mine {
				s.poke()
			}
		})
	}
	s.mu.Lock()
	s.gen, s.sessDone, s.host, s.release, s.unwatch = gen, sess.Done, h, release, unwatch
	s.mu.Unlock()
	return nil
}

// unarm releases what the last arm took: its hold, its activation (so its
// claim goes at once, not after an idle timeout) and its watcher.
func (s *Subscription) unarm() {
	s.mu.Lock()
	h, release, unwatch := s.host, s.release, s.unwatch
	s.host, s.release, s.unwatch = nil, nil, nil
	s.mu.Unlock()
	if unwatch != nil {
		unwatch()
	}
	if release != nil {
		release()
	}
	if h != nil {
		h.Deactivate(s.self)
	}
}

// disarm ends the subscription's hold on its node for good.
func (s *Subscription) disarm() {
	s.unarm()
	registry.Delete(s.self)
}

// staleSession reports whether the node moved on from the session the
// subscription is armed on (or it was never armed).
func (s *Subscription) staleSession() bool {
	s.mu.Lock()
	done := s.sessDone
	s.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func subscriberFactory(_ context.Context, addr subjects.Address) (hub.Hub, error) {
	v, ok := registry.Load(addr)
	if !ok {
		return nil, fmt.Errorf("no subscription at %s", addr)
	}
	return v.(*Subscription), nil
}

// Handle is the subscriber hub: it applies frames through the guard, the
// frames of one delivery in order. A delivery that does not decode is
// refused (bad-request) and nothing of it is applied.
func (s *Subscription) Handle(_ context.Context, d *hub.Delivery) error {
	switch d.Type {
	case TypeFrames:
		if _, err := checkFrames(d.Payload); err != nil {
			return verdict.New(verdict.ReasonBadRequest, "%v", err)
		}
		var f Frame // all of it decodes: apply it
		for r := newFrameReader(d.Payload); r.next(&f); {
			s.apply(&f)
		}
	case TypeFrame:
		var f Frame
		if err := json.Unmarshal(d.Payload, &f); err != nil {
			return verdict.New(verdict.ReasonBadRequest, "malformed frame: %v", err)
		}
		s.apply(&f)
	default:
		return verdict.New(verdict.ReasonBadRequest, "subscriber takes only %s and %s deliveries", TypeFrames, TypeFrame)
	}
	return nil
}

// apply applies f if the guard lets it through, or counts it stale.
func (s *Subscription) apply(f *Frame) {
	if f.Closed {
		s.mu.Lock()
		current := f.Epoch == s.epoch
		if current {
			s.closedEpoch = f.Epoch
		}
		s.mu.Unlock()
		if current {
			s.poke() // the owner activation we follow is going away
		}
		return
	}
	s.mu.Lock()
	apply := false
	switch {
	case f.Snapshot && f.Attempt == s.attempt:
		// An answer to our latest subscribe. It passes the guard like
		// any frame; or it is the activation the attempt's response
		// named (a later activation whose epoch is below the mirror's:
		// its node's clock is behind). Another snapshot of the attempt
		// (an Idempotent re-send of the subscribe reached an older
		// activation too) never moves the mirror back, and never
		// wedges it: the responder's is applied after it.
		switch {
		case !s.started, f.newer(s.epoch, s.version):
			apply = true
		case f.Epoch == s.epoch && f.Version == s.version && !s.adopted:
			apply = true // the mirror's own state again (subscribed again to the same activation): handed over once
		case s.confirmed != 0 && f.Epoch == s.confirmed && f.Epoch != s.epoch:
			apply = true
		default:
			s.droppedAttempt, s.droppedEpoch = f.Attempt, f.Epoch
		}
		s.adopted = s.adopted || apply
	case f.Epoch == s.epoch && f.newer(s.epoch, s.version):
		apply = true
	}
	if apply {
		s.epoch, s.version, s.started = f.Epoch, f.Version, true
	}
	s.mu.Unlock()
	if !apply {
		s.stale.Add(1)
		return
	}
	s.applied.Add(1)
	s.handler(*f)
}

// Pinned keeps the subscriber activation while the subscription lives.
func (s *Subscription) Pinned() bool {
	select {
	case <-s.closed:
		return false
	default:
		return true
	}
}

// poke wakes the run loop; what the wake-up is about is recorded first
// (recoveryDue).
func (s *Subscription) poke() {
	select {
	case s.trigger <- struct{}{}:
	default:
	}
}

// run subscribes, then again whenever recovery is triggered.
func (s *Subscription) run(first chan<- error) {
	defer s.wg.Done()
	b := &backoff.ExponentialBackOff{InitialInterval: BackoffInitial, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: BackoffMax}
	failures := 0
	for {
		var err error
		if s.staleSession() {
			// The node rejoined under a new generation: re-arm there
			// (DESIGN §7), then subscribe from it.
			ctx, cancel := context.WithTimeout(context.Background(), AttemptTimeout)
			err = s.arm(ctx)
			cancel()
		}
		if err == nil {
			err = s.subscribeOnce()
		}
		select {
		case <-s.node.Closed():
			// This process makes no further attempt (DESIGN §3).
			err = fmt.Errorf("syncstream: the subscriber's node closed: %w", verdict.ErrClosing)
			if first != nil {
				first <- err
				first = nil
			}
			s.teardown(err)
			s.disarm()
			return
		default:
		}
		if first != nil {
			if err == nil || !verdict.IsTransient(err) {
				first <- err
				first = nil
			}
		}
		switch {
		case err == nil:
			failures = 0
			b.Reset()
			if !s.await() {
				return
			}
			s.resubscribes.Add(1)
			continue
		case !verdict.IsTransient(err):
			s.teardown(err)
			s.disarm() // let go of the node: the hold, the activation, its claim
			return
		}
		failures++
		wait := time.Duration(0)
		if failures > GraceAttempts {
			wait = b.NextBackOff()
		}
		select {
		case <-s.stop:
			return
		case <-s.node.Clock().After(wait):
		}
		s.resubscribes.Add(1)
	}
}

// OwnerCheckInterval is how often a subscription also checks that its
// owner's node is alive, in case a departure event was missed (one told
// while the subscriber's own node was between two sessions). A rejoin of
// the subscriber's own node is no poll: its session's Done wakes await.
const OwnerCheckInterval = time.Second

// await waits until recovery is needed (true) or the subscription stops
// (false).
func (s *Subscription) await() bool {
	t := s.node.Clock().NewTicker(OwnerCheckInterval)
	defer t.Stop()
	s.mu.Lock()
	sessDone := s.sessDone
	s.mu.Unlock()
	for {
		select {
		case <-s.stop:
			return false
		case <-s.trigger:
			if s.recoveryDue() {
				return true
			}
			// A notice about what an attempt since already replaced
			// (the old owner's departure, told while the attempts to
			// its successor were failing): nothing to recover.
		case <-s.node.Closed():
			return true // the next attempt fails terminally (the client is closed)
		case <-sessDone:
			return true // the node rejoined under a new generation: re-arm there (run)
		case <-t.Chan():
			s.mu.Lock()
			owner := s.ownerNode
			s.mu.Unlock()
			if m := s.node.Session().Members; m != nil && !owner.IsZero() && !m.Alive(owner) {
				return true
			}
		}
	}
}

// recoveryDue reports whether a poke still names what the subscription
// follows: the epoch it applies was closed, the owner node that answered
// its last subscribe departed, or the responder's snapshot was dropped.
func (s *Subscription) recoveryDue() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.again || s.closedEpoch != 0 && s.closedEpoch == s.epoch || !s.departed.IsZero() && s.departed == s.ownerNode
}

func (s *Subscription) subscribeOnce() error {
	attempt := nuid.Next()
	s.mu.Lock()
	s.attempt, s.adopted, s.again = attempt, false, false
	s.closedEpoch, s.departed = 0, subjects.NodeID{} // this attempt answers them
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), AttemptTimeout)
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	resp, err := s.node.Request(ctx, mesh.Delivery{
		From: s.self, To: s.owner, Stream: s.stream, Type: TypeSubscribe,
		Payload:    encode(subscribeRequest{Subscriber: s.self, Stream: s.stream, Attempt: attempt, Format: FramesFormat}),
		Idempotent: true, // a second subscribe under one ID re-sends the snapshot
	})
	if err != nil {
		return err
	}
	var rep subscribeReply
	named := json.Unmarshal(resp.Payload, &rep) == nil && rep.Epoch != 0
	s.mu.Lock()
	s.ownerNode = resp.Node
	again := false
	if named && s.attempt == attempt {
		s.confirmed = rep.Epoch
		// The responder's snapshot came first and the guard dropped it
		// (its epoch is below the mirror's): subscribe again, now that
		// its epoch is known.
		again = s.droppedAttempt == attempt && s.droppedEpoch == rep.Epoch && s.epoch != rep.Epoch
		s.again = again
	}
	s.mu.Unlock()
	if again {
		s.poke()
	}
	return nil
}

func (s *Subscription) teardown(err error) {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.closed)
	})
}

// Err returns the error that tore the subscription down, or nil.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Closed is closed when the subscription ends: torn down by a terminal
// failure (Err says which) or stopped.
func (s *Subscription) Closed() <-chan struct{} { return s.closed }

// Position returns the epoch and version of the last applied frame.
func (s *Subscription) Position() (epoch, version uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch, s.version
}

// Stats returns frames applied, frames dropped as stale, and resubscribes.
func (s *Subscription) Stats() (applied, stale, resubscribes int64) {
	return s.applied.Load(), s.stale.Load(), s.resubscribes.Load()
}

// Stop unsubscribes (best effort), releases the subscriber address and
// ends the subscription. Stopping twice is harmless.
func (s *Subscription) Stop() {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = s.node.Deliver(ctx, mesh.Delivery{From: s.self, To: s.owner, Stream: s.stream, Type: TypeUnsubscribe,
			Payload: encode(subscribeRequest{Subscriber: s.self, Stream: s.stream})})
		cancel()
		s.teardown(nil)
		s.disarm()
	})
}
